"""One recogniser process for every channel, with their decodes batched (``[recognizer]
batched``; on CUDA by default).

The serial shared worker (subd.service.stages.SharedWorker) answers one channel's request at a
time: with 4 channels on one worker, a channel waits behind the other three every update. Here
the channels' requests that arrive while a batch runs are sent together as the next batch
(:class:`ForChannels`), and the process runs them together (:class:`BatchedMultiplexHost`):
each channel's own streaming policy, with every decode of that round in one batch on the
batched engine (subd.gpu.batcher). A channel's request never waits for more than the batch in
flight; its answer comes with the others'.

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
from dataclasses import dataclass
from typing import Any

from subd.service.supervisor import Attach, ForChannel, MultiplexHost, SharedWorker
from subd.tasks import start_task
from subd.workers.process import WorkerError

log = logging.getLogger("subd.service.batching")
YIELDS_AFTER_BATCH = 4  # event-loop turns between a batch's answers and the next batch


@dataclass(frozen=True, slots=True)
class ForChannels:
    """Several channels' requests, answered together: one (ok, result or error line) each."""

    items: tuple[ForChannel, ...]


class BatchingSharedWorker(SharedWorker):
    """The event-loop side: channels' requests gather while a batch is in flight."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.stage = getattr(worker, "name", "stage")
        self._queue: list[tuple[ForChannel, asyncio.Future, int]] = []
        self._sender: asyncio.Task | None = None
        self.n_batches = 0
        self.n_items = 0
        log.info("%s: one process for every channel, their requests batched", self.stage)

    async def _call(self, request: Any, now_ns: int = 0) -> Any:
        if not isinstance(request, ForChannel):  # attach, detach: one at a time, as ever
            return await super()._call(request, now_ns)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        fut.add_done_callback(_observe)
        self._queue.append((request, fut, now_ns))
        if self._sender is None or self._sender.done():
            self._sender = start_task(self._send(), f"batch:{self.stage}")
        return await asyncio.shield(fut)

    async def _send(self) -> None:
        while self._queue:
            items, self._queue = self._queue, []
            batch = ForChannels(tuple(r for r, _, _ in items))
            self.n_batches += 1
            self.n_items += len(items)
            try:
                outcomes = await super()._call(batch, min(t for _, _, t in items))
            except asyncio.CancelledError:
                for _, fut, _ in items + self._queue:
                    fut.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - StageDown etc.: every caller retries
                for _, fut, _ in items:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut, _), (ok, value) in zip(items, outcomes, strict=True):
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
            log.info("%s: %d requests in %d batches (%.1f a batch)", self.stage, self.n_items,
                     self.n_batches, self.n_items / self.n_batches)
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
