"""Clocks: the monotonic production clock and a fake clock that tests advance by hand.

``sleep_until`` takes an absolute deadline. The monotonic clock sleeps in the event loop until
``deadline − 1 ms`` and spins the rest, because an asyncio sleep alone wakes 1–5 ms late on a
busy machine (DESIGN.md, "Meeting the tick on a busy machine"). Its sleeps end on a timerfd
(subd.timerfd), at their time, not up to 1 ms after it as epoll's timeout would: that is what
lets 1 ms of spin do (`subd bench realtime` on the 2-core development VM, two other processes
busy: a 1 ms or 2 ms spin both gave publish-time error p99 0.08-0.12 ms at the client; without
the timerfd, the 2 ms spin gave 0.9-4.7 ms).
Waits that need no precision (pacing a file, look-ahead fetches) pass ``precise=False`` and
never spin.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import time
from fractions import Fraction
from typing import Protocol, runtime_checkable

from subd import timerfd
from subd.errors import ConfigError

log = logging.getLogger("subd.clock")

SPIN_NS = 1_000_000


@runtime_checkable
class Clock(Protocol):
    def now_ns(self) -> int: ...

    async def sleep_until(self, deadline_ns: int, *, precise: bool = True) -> int:
        """Return at ``deadline_ns`` or later (never earlier); returns ``now_ns()``."""
        ...


class MonotonicClock:
    """time.monotonic_ns with absolute deadlines: coarse asyncio sleep, then a short spin."""

    def __init__(self, spin_ns: int = SPIN_NS) -> None:
        self.spin_ns = int(spin_ns)

    def now_ns(self) -> int:
        return time.monotonic_ns()

    async def sleep_until(self, deadline_ns: int, *, precise: bool = True) -> int:
        margin_ns = self.spin_ns if precise else 0
        # a timerfd wakes the loop at the very moment (an asyncio sleep up to 1 ms after it)
        await timerfd.wait_until(deadline_ns - margin_ns)
        now = time.monotonic_ns()
        if not precise:
            while now < deadline_ns:  # asyncio may wake a hair early; never return early
                await asyncio.sleep(max(deadline_ns - now, 100_000) / 1e9)
                now = time.monotonic_ns()
            return now
        while now < deadline_ns:
            now = time.monotonic_ns()
        return now


def request_realtime_priority(priority: int = 10, *, who: str = "publisher") -> bool:
    """Ask for SCHED_FIFO for this process; log one line saying whether it was granted."""
    setter = getattr(os, "sched_setscheduler", None)
    if setter is None:
        log.info("%s: real-time scheduling not available on this platform; normal priority", who)
        return False
    try:
        setter(0, os.SCHED_FIFO, os.sched_param(priority))
    except (PermissionError, OSError) as exc:
        log.info(
            "%s: SCHED_FIFO not allowed (%s); running at normal priority "
            "(grant CAP_SYS_NICE or systemd CPUSchedulingPolicy=fifo)",
            who,
            exc.strerror or exc,
        )
        return False
    log.info("%s: running at SCHED_FIFO priority %d", who, priority)
    return True


def drop_realtime_priority() -> None:
    """Back to SCHED_OTHER (worker processes must never inherit the publisher's priority)."""
    setter = getattr(os, "sched_setscheduler", None)
    if setter is None:
        return
    try:
        setter(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        pass


class FakeClock:
    """A clock that only moves when a test advances it; sleepers wake in deadline order.

    After each wake-up the clock lets the event loop settle (a fixed number of loop turns) so
    that work triggered at that instant completes *at* that instant, as if it took no time.
    """

    def __init__(self, start_ns: int = 0, settle_turns: int = 40) -> None:
        self._now_ns = int(start_ns)
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self.settle_turns = settle_turns

    def now_ns(self) -> int:
        return self._now_ns

    async def sleep_until(self, deadline_ns: int, *, precise: bool = True) -> int:
        if deadline_ns <= self._now_ns:
            await asyncio.sleep(0)
            return self._now_ns
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (int(deadline_ns), next(self._seq), fut))
        await fut
        return self._now_ns

    def next_deadline_ns(self) -> int | None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
        return self._sleepers[0][0] if self._sleepers else None

    async def settle(self) -> None:
        for _ in range(self.settle_turns):
            await asyncio.sleep(0)

    async def advance_to(self, t_ns: int) -> None:
        """Move time to ``t_ns``, waking every sleeper on the way at its own deadline."""
        await self.settle()
        while True:
            nxt = self.next_deadline_ns()
            if nxt is None or nxt > t_ns:
                break
            deadline, _, fut = heapq.heappop(self._sleepers)
            self._now_ns = max(self._now_ns, deadline)
            fut.set_result(None)
            await self.settle()
        self._now_ns = max(self._now_ns, int(t_ns))
        await self.settle()

    async def advance(self, dt_ns: int) -> None:
        await self.advance_to(self._now_ns + int(dt_ns))

    async def run_until_done(self, task: asyncio.Future, step_ns: int = 1_000_000_000,
                             limit_ns: int | None = None) -> None:
        """Advance sleeper by sleeper until ``task`` finishes (or time passes ``limit_ns``)."""
        await self.settle()
        while not task.done():
            nxt = self.next_deadline_ns()
            target = self._now_ns + step_ns if nxt is None else nxt
            if limit_ns is not None and target > limit_ns:
                raise TimeoutError(f"fake clock passed {limit_ns} ns before the task finished")
            await self.advance_to(target)


def parse_fps(value: str | int | float | Fraction) -> Fraction:
    """Parse "30", "25", "30000/1001" (or an int/Fraction) into an exact positive Fraction."""
    try:
        if isinstance(value, Fraction):
            fps = value
        elif isinstance(value, int):
            fps = Fraction(value)
        elif isinstance(value, float):
            fps = Fraction(str(value))
        else:
            fps = Fraction(str(value).strip())
    except (ValueError, ZeroDivisionError):
        raise ConfigError(
            f"fps: {value!r} is not a frame rate (use e.g. 30, 25 or 30000/1001)"
        ) from None
    if not (1 <= fps <= 1000):
        raise ConfigError(f"fps: {value!r} is out of range (1..1000 frames per second)")
    return fps
