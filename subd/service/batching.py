"""One recogniser process for every channel, with their decodes batched (``[recognizer]
batched``; on CUDA by default).

The serial shared worker (subd.service.stages.SharedWorker) answers one channel's request at a
time: with 4 channels on one worker, a channel waits behind the other three every update. Here
the channels' requests that arrive while a batch runs are sent together as the next batch
(:class:`ForChannels`), and the process runs them together (:class:`BatchedMultiplexHost`):
each channel's own streaming policy, with every decode of that round in one batch on the
batched engine (subd.gpu.batcher). Its answer comes with the others'.

Which requests make the next batch is the deadline-aware scheduler's choice
(subd.gpu.scheduler, the one ``subd bench gpu --simple`` runs): channels that have shown no
caption yet first, then by each update's due time (``UpdateRequest.due_ns``: the look-ahead
fetch T(k) − A of the first tick whose words it may decide), up to ``max_rows`` requests (the
scheduler's ``fill``: a round is not cut short for its tightest member). A request left out
waits for the next batch, first in line if its due time comes first. An update whose due time
passed a whole round ago (the process is behind; the rounds measured so far say how long one
takes) is degraded, not queued: it
goes in the batch without its decode (``decode=False``: no new audio read, the due words decided
from the channel's last reading), the channel counts it (``subd_recogniser_updates_degraded``)
and its next update reads the audio it left. The stream's last decode and requests without a due
time are never degraded: they are ordered by when they were sent.

Supervision is the shared worker's own: a batch is one request to it, so a death or a hang of
the process is seen, the process respawned and every channel re-attached as before, and every
channel of the lost batch sends its request again. A channel whose own request fails (its
policy raised) gets that one-line error; the other channels of the batch get their answers.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from subd.clock import Clock, MonotonicClock
from subd.gpu.scheduler import CostModel, GpuScheduler, Update
from subd.service.supervisor import Attach, ForChannel, MultiplexHost, SharedWorker
from subd.tasks import start_task
from subd.workers.hosts import UpdateRequest
from subd.workers.process import WorkerError

log = logging.getLogger("subd.service.batching")
YIELDS_AFTER_BATCH = 4  # event-loop turns between a batch's answers and the next batch
# requests in one batch at most: the batched host's rows (BatchedMultiplexHost's max_rows)
BATCH_ROWS = 256


@dataclass(frozen=True, slots=True)
class ForChannels:
    """Several channels' requests, answered together: one (ok, result or error line) each."""

    items: tuple[ForChannel, ...]


class BatchingSharedWorker(SharedWorker):
    """The event-loop side: channels' requests gather while a batch is in flight, and the
    scheduler picks the next batch from them (module docstring). ``clock``: the channels'
    clock, on which their due times are."""

    def __init__(self, worker: Any, *, max_rows: int = BATCH_ROWS, clock: Clock | None = None,
                 **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.stage = getattr(worker, "name", "stage")
        self.clock = clock or MonotonicClock()
        self.scheduler = GpuScheduler(CostModel(), max_rows, fill=True)
        self._waiting: dict[int, tuple[ForChannel, asyncio.Future]] = {}  # by stream id
        self._ids: dict[str, int] = {}
        self._sender: asyncio.Task | None = None
        self.n_batches = 0
        self.n_items = 0
        self.n_degraded = 0
        log.info("%s: one process for every channel, their requests batched", self.stage)

    async def _call(self, request: Any, now_ns: int = 0) -> Any:
        if not isinstance(request, ForChannel):  # attach, detach: one at a time, as ever
            return await super()._call(request, now_ns)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        fut.add_done_callback(_observe)
        sid = self._ids.setdefault(request.channel, len(self._ids))
        req = request.request
        due = getattr(req, "due_ns", None)
        sent_ns = self.clock.now_ns()
        self.scheduler.submit(Update(
            sid, sent_ns, sent_ns if due is None else due,
            bool(getattr(req, "first_caption", False)),
            degradable=isinstance(req, UpdateRequest) and due is not None and req.decode))
        old = self._waiting.get(sid)
        if old is not None and not old[1].done():  # a channel asks once at a time: not seen
            old[1].set_exception(WorkerError(f"{self.stage}: superseded by a newer request"))
        self._waiting[sid] = (request, fut)
        if self._sender is None or self._sender.done():
            self._sender = start_task(self._send(), f"batch:{self.stage}")
        return await asyncio.shield(fut)

    def _next_batch(self) -> tuple[list[tuple[ForChannel, asyncio.Future]], Any]:
        plan = self.scheduler.plan(self.clock.now_ns())
        items = [self._waiting.pop(u.stream_id) for u in plan.batch]
        for u in plan.degraded:  # in the batch, without a decode
            request, fut = self._waiting.pop(u.stream_id)
            items.append((ForChannel(request.channel, replace(request.request, decode=False)),
                          fut))
        self.n_degraded += len(plan.degraded)
        if plan.degraded and self.n_degraded == len(plan.degraded):
            log.warning("%s: updates that could not make their due time are degraded "
                        "(decided from the channels' last readings)", self.stage)
        return items, plan

    async def _send(self) -> None:
        while self._waiting:
            items, plan = self._next_batch()
            if not items:  # nothing fits yet (cannot happen with a request waiting: guard)
                await asyncio.sleep(0)
                continue
            batch = ForChannels(tuple(r for r, _ in items))
            self.n_batches += 1
            self.n_items += len(items)
            t0 = time.monotonic_ns()
            try:
                outcomes = await super()._call(batch, self.clock.now_ns())
            except asyncio.CancelledError:
                for _, fut in items + list(self._waiting.values()):
                    fut.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - StageDown etc.: every caller retries
                for _, fut in items:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            self.scheduler.done(plan, time.monotonic_ns() - t0)
            for (_, fut), (ok, value) in zip(items, outcomes, strict=True):
                if fut.done():
                    continue
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(WorkerError(f"{self.stage}: {value}"))
            # the channels just answered send their next request at once when their audio is
            # in: let them, so that it joins the waiting ones instead of the channels taking
            # turns in batches of one (2 channels on the CPU: 9 requests in 9 batches)
            for _ in range(YIELDS_AFTER_BATCH):
                await asyncio.sleep(0)

    async def close(self, timeout_s: float = 1.0) -> None:
        if self.n_batches:
            log.info("%s: %d requests in %d batches (%.1f a batch), %d degraded", self.stage,
                     self.n_items, self.n_batches, self.n_items / self.n_batches,
                     self.n_degraded)
        if self._sender is not None and not self._sender.done():
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
        await super().close(timeout_s)


def _observe(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()  # a caller cancelled meanwhile must not leave it unobserved


class BatchedMultiplexHost(MultiplexHost):
    """The process side: the batched engine is loaded first (the worker is ready once it is),
    channels attach their recogniser hosts over it, and a :class:`ForChannels` batch runs every
    channel's request at once."""

    def __init__(self, model: str = "tiny.en", device: str = "auto", precision: str = "auto",
                 max_rows: int = 256, threads: int = 0, share: float = 1.0) -> None:
        from subd.gpu.serve import load_batching_engine

        super().__init__(None)
        # threads: torch's CPU threads (0: the default); one of several shards gets its share
        # of the cores and of the GPU's memory (subd.service.sharding)
        self.engine = load_batching_engine(model, device, precision, max_rows, threads, share)
        self.last_batch_ns = 0

    def handle(self, request: Any) -> Any:
        if isinstance(request, ForChannels):
            t0 = time.monotonic_ns()
            calls = [functools.partial(self._one, item) for item in request.items]
            out = [(ok, value if ok else _line(value)) for ok, value in self.engine.run(calls)]
            self.last_batch_ns = time.monotonic_ns() - t0
            return out
        if isinstance(request, Attach):
            from subd.gpu.serve import batched_host_spec

            request = Attach(request.channel, batched_host_spec(request.host))
        return super().handle(request)

    def _one(self, item: ForChannel) -> Any:
        return super().handle(item)

    def close(self) -> None:
        super().close()
        self.engine.close()


def _line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
