"""Supervising several channels in one daemon: a failing channel never takes the others down.

Each channel (its own source, latency and sinks; the model instance is shared and owned by the
daemon) runs in its own task, named ``channel:NAME``; inside ``run()`` a channel starts its own
task set (a ``TaskGroup`` is the natural fit, so one failing task fails the whole channel). When
``run()`` raises, the supervisor logs one line, reports the state and restarts the channel after
an exponential backoff capped at ``max_backoff_ns``, forever: a microphone unplugged for an hour
or a file that comes back is picked up again without anyone restarting the daemon. (A policy
with ``max_failures`` set gives up after that many failures within ``window_ns`` and marks the
channel failed; health then says so.) ``run()`` returning normally means the channel
is finished (a file source that ended): it is not restarted. Cancellation always propagates.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from subd.clock import Clock, MonotonicClock
from subd.service.multiplex import (  # noqa: F401 - worker targets name them here (FactorySpec)
    Attach,
    Detach,
    ForChannel,
    MultiplexHost,
    shared_engine,
    shared_streaming_recognizer,
)
from subd.service.stages import ChannelWorker, SharedWorker  # noqa: F401 - re-exported
from subd.tasks import start_task

log = logging.getLogger("subd.service.supervisor")

RUNNING = "running"
RESTARTING = "restarting"
FAILED = "failed"
STOPPED = "stopped"


@runtime_checkable
class Channel(Protocol):
    """What the supervisor needs of a channel.

    ``run()`` runs the channel until it ends (return) or fails (raise); it is called again for a
    restart, so it must set up its state afresh. ``request_stop()`` (optional) asks it to stop
    ingest and return once drained.
    """

    name: str

    async def run(self) -> None: ...

    def status(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    initial_backoff_ns: int = 500_000_000
    max_backoff_ns: int = 30_000_000_000
    max_failures: int = 0  # within window_ns, then the channel is marked failed; 0: never
    window_ns: int = 300_000_000_000
    healthy_after_ns: int = 60_000_000_000  # a run this long resets the backoff

    def backoff_ns(self, n_consecutive: int) -> int:
        """Delay before restart number ``n_consecutive`` (1-based): doubling, capped."""
        return min(self.initial_backoff_ns << max(n_consecutive - 1, 0), self.max_backoff_ns)


@dataclass(frozen=True, slots=True)
class ChannelState:
    name: str
    state: str
    restarts: int = 0
    last_error: str = ""
    detail: Mapping[str, Any] = field(default_factory=dict)  # channel.status()


def describe_error(exc: BaseException) -> str:
    """One line naming the first real failure (looks inside exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


StateHook = Callable[[str, str, str], None]  # (channel name, state, detail)


class _Entry:
    __slots__ = ("channel", "task", "state", "restarts", "last_error", "stopping")

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.task: asyncio.Task | None = None
        self.state = RUNNING
        self.restarts = 0
        self.last_error = ""
        self.stopping = False


class ChannelSupervisor:
    def __init__(
        self,
        policy: RestartPolicy | None = None,
        clock: Clock | None = None,
        on_state: StateHook | None = None,
    ) -> None:
        self.policy = policy or RestartPolicy()
        self.clock = clock or MonotonicClock()
        self._on_state = on_state
        self._entries: dict[str, _Entry] = {}

    def start(self, channel: Channel) -> asyncio.Task:
        if channel.name in self._entries and not self._entries[channel.name].task.done():
            raise ValueError(f"channel {channel.name!r} is already running")
        entry = _Entry(channel)
        self._entries[channel.name] = entry
        entry.task = start_task(self._supervise(entry), f"channel:{channel.name}")
        return entry.task

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def channel(self, name: str) -> Channel:
        return self._entries[name].channel

    def states(self) -> dict[str, ChannelState]:
        return {name: self._snapshot(e) for name, e in self._entries.items()}

    def _snapshot(self, entry: _Entry) -> ChannelState:
        try:
            detail = dict(entry.channel.status())
        except Exception as exc:  # noqa: BLE001 - a broken status() must not break /healthz
            detail = {"status_error": describe_error(exc)}
        return ChannelState(entry.channel.name, entry.state, entry.restarts, entry.last_error,
                            detail)

    def _set(self, entry: _Entry, state: str, detail: str = "") -> None:
        entry.state = state
        if self._on_state is not None:
            try:
                self._on_state(entry.channel.name, state, detail)
            except Exception:  # noqa: BLE001 - reporting must not kill supervision
                log.exception("state hook failed for channel %s", entry.channel.name)

    async def _supervise(self, entry: _Entry) -> None:
        name = entry.channel.name
        failures: deque[int] = deque()  # failure times within the window
        consecutive = 0
        while True:
            started_ns = self.clock.now_ns()
            self._set(entry, RUNNING)
            try:
                await entry.channel.run()
            except asyncio.CancelledError:
                self._set(entry, STOPPED, "cancelled")
                raise
            except Exception as exc:  # noqa: BLE001 - isolation is the point
                error = describe_error(exc)
            else:
                self._set(entry, STOPPED, "finished")
                log.info("channel %s finished", name)
                return
            now_ns = self.clock.now_ns()
            entry.last_error = error
            if entry.stopping:
                self._set(entry, STOPPED, error)
                log.warning("channel %s failed while stopping: %s", name, error)
                return
            if now_ns - started_ns >= self.policy.healthy_after_ns:
                consecutive = 0
            consecutive += 1
            failures.append(now_ns)
            while failures and now_ns - failures[0] > self.policy.window_ns:
                failures.popleft()
            if self.policy.max_failures and len(failures) >= self.policy.max_failures:
                detail = (f"{len(failures)} failures in {self.policy.window_ns // 10**9} s, "
                          f"last: {error}")
                self._set(entry, FAILED, detail)
                log.error("channel %s failed, not restarting: %s", name, detail)
                return
            delay_ns = self.policy.backoff_ns(consecutive)
            self._set(entry, RESTARTING, error)
            log.warning("channel %s failed: %s; restarting in %.1f s", name, error,
                        delay_ns / 1e9)
            await self.clock.sleep_until(now_ns + delay_ns, precise=False)  # no spin
            entry.restarts += 1

    async def stop(self, name: str, timeout_s: float = 5.0) -> bool:
        """Ask one channel to finish (``request_stop`` if it has one, else cancel it); cancel it
        after ``timeout_s``. True when it ended within the timeout."""
        entry = self._entries.pop(name, None)
        if entry is None or entry.task is None:
            return True
        return await self._stop_entries([entry], timeout_s)

    async def stop_all(self, timeout_s: float = 5.0) -> bool:
        entries = list(self._entries.values())
        self._entries.clear()
        return await self._stop_entries(entries, timeout_s)

    async def _stop_entries(self, entries: list[_Entry], timeout_s: float) -> bool:
        tasks = []
        for entry in entries:
            entry.stopping = True
            request_stop = getattr(entry.channel, "request_stop", None)
            if request_stop is not None and entry.state == RUNNING:
                request_stop()
            elif not entry.task.done():
                entry.task.cancel()  # backing off, or no way to ask politely
            tasks.append(entry.task)
        pending = {t for t in tasks if not t.done()}
        if pending:
            _, pending = await asyncio.wait(pending, timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                log.error("channel task %s ended with %s", task.get_name(),
                          describe_error(task.exception()))
        return not pending
