"""Stage processes shared by channels, and kept alive.

Every channel's stage host lives in ONE worker process per stage (subd.service.multiplex: the
model is loaded once). :class:`SharedWorker` queues the channels' requests first-come
first-served (the worker takes one request at a time).

Supervision. A stage process may die (SIGKILL, OOM, a crash in native code) or hang (stopped,
spinning). Death shows as its pipe closing; a hang as no answer within a bound taken from the
measured cost of that kind of request (``hang_factor`` times the slowest of the last answers,
never under ``hang_floor_ns``), and the process is then killed. Either way the worker is
respawned, with capped exponential backoff and never given up on, and every attached channel
is attached again with a host that resumes where the channel was (subd.workers.resume). A
channel's call waits through the respawn and is then answered: its pipeline never fails, its
clock keeps publishing (the tag stage's wait shows as degraded ticks), and channels that were
not calling notice nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from subd.service.multiplex import Attach, Detach, ForChannel
from subd.tasks import start_task
from subd.types import UpdateCosts
from subd.workers.process import WorkerDied
from subd.workers.resume import Resume, resume_for

log = logging.getLogger("subd.service.stages")

UP = "up"
RESTARTING = "restarting"
StageHook = Callable[[str, str, str], None]  # (stage name, state, detail)


@dataclass(frozen=True, slots=True)
class StagePolicy:
    first_backoff_ns: int = 0  # the first respawn at once: recovery time is the model load
    initial_backoff_ns: int = 500_000_000  # then doubling ...
    max_backoff_ns: int = 30_000_000_000  # ... up to this, forever
    healthy_after_ns: int = 60_000_000_000  # up this long: the next death starts over
    hang_floor_ns: int = 5_000_000_000  # no answer within this is never a hang
    hang_factor: int = 5  # ... nor within this many times the slowest recent answer
    unmeasured_limit_ns: int = 120_000_000_000  # a kind of request not measured 3 times yet
    start_timeout_s: float = 300.0  # a respawn loads the model again
    # a loaded, idle second process takes over at once when the stage dies or hangs: an attach
    # instead of a model load, for one more model (a respawn's load: 12-30 s when it converted
    # the model in a fresh interpreter, 0.5-1.1 s forked from the fork server with the model
    # cache, subd.workers.process and subd.models.cache, on the loaded 2-core machine)
    spare: bool = False

    def backoff_ns(self, n_consecutive: int) -> int:
        if n_consecutive <= 1:
            return self.first_backoff_ns
        return min(self.initial_backoff_ns << (n_consecutive - 2), self.max_backoff_ns)


class StageDown(RuntimeError):
    """The stage process is gone and being respawned."""


def describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class SharedWorker:
    """A stage worker (process or inline) shared by channels; requests run one at a time in
    arrival order. A caller that is cancelled does not free the worker before it answered.
    A worker that can be killed (a process) is supervised: see the module docstring."""

    def __init__(self, worker: Any, *, policy: StagePolicy | None = None,
                 on_state: StageHook | None = None) -> None:
        self.worker = worker
        self.name: str = getattr(worker, "name", "stage")
        self.policy = policy or StagePolicy()
        self.supervised = hasattr(worker, "kill")
        self._on_state = on_state
        self._lock = asyncio.Lock()
        self._channels: dict[str, ChannelWorker] = {}
        self._up = asyncio.Event()
        self._up.set()
        self.generation = 0  # processes started so far, minus one
        self.state = UP
        self.restarts = 0
        self.last_error = ""
        self.recoveries_ns: deque[int] = deque(maxlen=256)  # death -> answering again
        self._down_since_ns = 0
        self._up_since_ns = time.monotonic_ns()
        self._consecutive = 0
        self._costs: dict[str, deque[int]] = {}
        self._respawner: asyncio.Task | None = None
        self._closing = False
        self._catchup_calls = 0  # calls after a respawn that are not measured (_answer)
        self._spare: Any | None = None  # a loaded twin of the worker (policy.spare)
        self._spare_task: asyncio.Task | None = None
        if self.supervised:
            worker.on_exit = self._on_exit  # a death between requests is seen at once

    def keep_spare(self) -> None:
        """Start loading a spare process in the background (policy.spare), if none is."""
        if not (self.supervised and self.policy.spare) or self._spare is not None or \
                (self._spare_task is not None and not self._spare_task.done()):
            return
        self._spare_task = start_task(self._load_spare(), f"spare:{self.name}")

    async def _load_spare(self) -> None:
        spare = self.worker.twin()
        try:
            await spare.start(self.policy.start_timeout_s)
        except asyncio.CancelledError:
            await spare.close(1.0)
            raise
        except Exception as exc:  # noqa: BLE001 - a respawn still works without one
            log.warning("%s stage: the spare process did not start: %s", self.name,
                        describe(exc))
            await spare.close(1.0)
            return
        spare.on_exit = self._spare_died
        self._spare = spare
        log.info("%s stage: spare process ready (pid %s)", self.name, spare.pid)

    def _spare_died(self) -> None:
        log.warning("%s stage: the spare process died; loading another", self.name)
        dead, self._spare = self._spare, None
        if dead is not None:
            start_task(dead.close(1.0), "reap-spare")
        self.keep_spare()

    # -- supervision ----------------------------------------------------------------------------

    def hang_limit_ns(self, kind: str) -> int:
        """How long a request of ``kind`` may go unanswered before the stage counts as hung."""
        costs = self._costs.get(kind)
        if costs is None or len(costs) < 3:
            return self.policy.unmeasured_limit_ns
        return max(self.policy.hang_floor_ns, self.policy.hang_factor * max(costs))

    def _on_exit(self) -> None:
        self._down(f"{self.name} worker died ({self.worker.exit_text()})")

    def _down(self, reason: str) -> None:
        if self.state == RESTARTING or self._closing:
            return
        now_ns = time.monotonic_ns()
        self.state, self.last_error, self._down_since_ns = RESTARTING, reason, now_ns
        self._up.clear()
        if now_ns - self._up_since_ns >= self.policy.healthy_after_ns:
            self._consecutive = 0
        self._consecutive += 1
        log.warning("%s stage failed: %s; respawning", self.name, reason)
        self._report(RESTARTING, reason)
        self._respawner = start_task(self._respawn(), f"respawn:{self.name}")

    async def _respawn(self) -> None:
        while True:
            delay_ns = self.policy.backoff_ns(self._consecutive)
            if delay_ns:
                await asyncio.sleep(delay_ns / 1e9)
            try:
                await self._start_again()
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - retried forever, with backoff
                self._consecutive += 1
                self.last_error = f"respawn failed: {describe(exc)}"
                log.warning("%s stage: %s; next try in %.1f s", self.name, self.last_error,
                            self.policy.backoff_ns(self._consecutive) / 1e9)
                self._report(RESTARTING, self.last_error)
        now_ns = time.monotonic_ns()
        self.recoveries_ns.append(now_ns - self._down_since_ns)
        self.restarts += 1
        self.state, self._up_since_ns = UP, now_ns
        self._up.set()
        log.info("%s stage respawned (pid %s) %.1f s after it failed; %d channels resumed",
                 self.name, getattr(self.worker, "pid", "?"),
                 (now_ns - self._down_since_ns) / 1e9, len(self._channels))
        self._report(UP, f"respawned after: {self.last_error}")

    async def _start_again(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None and spare.alive:
            dead, self.worker = self.worker, spare  # loaded already: take over at once
            dead.on_exit = None
            spare.on_exit = self._on_exit
            start_task(dead.close(1.0), f"reap:{self.name}")
        else:
            await self.worker.close(1.0)  # reaps the dead (or killed) process
            await self.worker.start(self.policy.start_timeout_s)
        self.keep_spare()  # for the next time
        self.generation += 1
        for cw in list(self._channels.values()):
            call = self.worker.call(Attach(cw.channel, cw.resume.host(cw.host)))
            await asyncio.wait_for(call, self.policy.unmeasured_limit_ns / 1e9)
            cw.attached_generation, cw.fresh = self.generation, True
        self._catchup_calls = 2 * len(self._channels)  # each channel's retry and next call

    def _report(self, state: str, detail: str) -> None:
        if self._on_state is not None:
            try:
                self._on_state(self.name, state, detail)
            except Exception:  # noqa: BLE001 - reporting must not stop supervision
                log.exception("stage state hook failed")

    async def wait_up(self) -> None:
        await self._up.wait()

    # -- calls ----------------------------------------------------------------------------------

    async def _call(self, request: Any, now_ns: int = 0) -> Any:
        await self._lock.acquire()
        # StageDown, its expected failure, is the caller's to handle (and to log): not an error
        # of the task (it logged "task call:recognise failed: StageDown" at every respawn)
        task = start_task(self._answer(request, now_ns), f"call:{self.name}",
                          expected=(StageDown,))

        def done(t: asyncio.Future) -> None:
            self._lock.release()
            if not t.cancelled():
                t.exception()  # retrieved: a cancelled caller must not leave it unobserved

        task.add_done_callback(done)
        return await asyncio.shield(task)

    async def _answer(self, request: Any, now_ns: int) -> Any:
        if not self._up.is_set():
            raise StageDown(f"{self.name} stage is restarting: {self.last_error}")
        if not self.supervised:
            return await self.worker.call(request, now_ns)
        kind = type(getattr(request, "request", request)).__name__
        # the first answers of a respawned process catch up on the audio of the outage: they
        # may take long, and their cost says nothing about a hang (measured: one bound grew
        # to 160 s from such a catch-up, and a real hang then cost 2 min of audio)
        catching_up = self._catchup_calls > 0
        self._catchup_calls -= catching_up
        limit_ns = self.policy.unmeasured_limit_ns if catching_up else self.hang_limit_ns(kind)
        t0_ns = time.monotonic_ns()
        try:
            result = await asyncio.wait_for(self.worker.call(request, now_ns), limit_ns / 1e9)
        except TimeoutError:
            self.worker.kill()
            self._down(f"{self.name} worker hung: no answer to {kind} within "
                       f"{limit_ns / 1e9:.1f} s; killed")
            raise StageDown(self.last_error) from None
        except WorkerDied as exc:
            self._down(str(exc))
            raise StageDown(str(exc)) from None
        if not catching_up:
            self._costs.setdefault(kind, deque(maxlen=64)).append(time.monotonic_ns() - t0_ns)
        return result

    def n_channels(self) -> int:
        """Channels attached to this stage now."""
        return len(self._channels)

    async def attach(self, channel: str, host: Any) -> ChannelWorker:
        cw = ChannelWorker(self, channel, host, resume_for(host))
        self._channels[channel] = cw
        try:
            await cw.ensure_attached()
        except BaseException:
            self._channels.pop(channel, None)
            raise
        return cw

    async def detach(self, channel: str) -> None:
        self._channels.pop(channel, None)
        if not self._up.is_set():
            return  # the respawned process will not know it
        try:
            await self._call(Detach(channel))
        except Exception as exc:  # noqa: BLE001 - the worker may be gone already
            log.debug("detaching %s: %s", channel, describe(exc))

    async def close(self, timeout_s: float = 1.0) -> None:
        self._closing = True  # a death from here on is ours: no respawn
        if self._lock.locked() and self.supervised:
            # still answering (a drain cut short, a channel's last decode): nobody waits for
            # the answer any more, and a full-window decode can take seconds on a busy CPU
            self.worker.kill()
        for task in (self._respawner, self._spare_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._spare is not None:
            self._spare.on_exit = None
            await self._spare.close(timeout_s)
            self._spare = None
        await self.worker.close(timeout_s)


class ChannelWorker:
    """One channel's view of a :class:`SharedWorker` (the scheduler's ``Worker``)."""

    def __init__(self, shared: SharedWorker, channel: str, host: Any,
                 resume: Resume | None = None) -> None:
        self.shared = shared
        self.channel = channel
        self.host = host
        self.resume = resume or Resume()
        self.attached_generation = -1
        self.fresh = False  # attached to a respawned process: the next request is a retry
        self.busy_since_ns: int | None = None  # from the request, queueing included
        # a recogniser's update costs, measured as it attached (subd.recognise.warmup)
        self.update_costs: UpdateCosts | None = None

    async def ensure_attached(self) -> None:
        while self.attached_generation != self.shared.generation:
            generation, again = self.shared.generation, self.attached_generation >= 0
            try:
                answer = await self.shared._call(Attach(self.channel,
                                                        self.resume.host(self.host)))
            except StageDown:
                if self.shared._closing:
                    raise
                await self.shared.wait_up()
                continue
            if self.shared.generation == generation:
                self.attached_generation = generation
                self.fresh = self.fresh or again
                if isinstance(answer, UpdateCosts):
                    self.update_costs = answer

    async def call(self, request: Any, now_ns: int = 0) -> Any:
        self.busy_since_ns = now_ns
        try:
            self.resume.sent(request)
            while True:
                await self.ensure_attached()
                sent = self.resume.retry(request) if self.fresh else request
                try:
                    result = await self.shared._call(ForChannel(self.channel, sent), now_ns)
                except StageDown:
                    if self.shared._closing:
                        raise  # shutting down: no respawn to wait for
                    await self.shared.wait_up()
                    continue
                self.fresh = False
                self.resume.answered(sent, result)
                return result
        finally:
            self.busy_since_ns = None
