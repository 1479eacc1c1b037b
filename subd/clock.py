"""Clocks: the monotonic production clock and a fake clock that tests advance by hand.

``sleep_until`` takes an absolute deadline. The monotonic clock sleeps in the event loop until
``deadline − 1 ms`` and spins the rest, because an asyncio sleep alone wakes 1–5 ms late on a
busy machine (DESIGN.md, "Meeting the tick on a busy machine"). Its sleeps end on a timerfd
(``wait_until_exact``), at their time, not up to 1 ms after it as epoll's timeout would: that
is what lets 1 ms of spin do (`subd bench realtime` on the 2-core development VM, two other
processes busy: a 1 ms or 2 ms spin both gave publish-time error p99 0.08-0.12 ms at the
client; without the timerfd, the 2 ms spin gave 0.9-4.7 ms). Of that millisecond the thread
sleeps all but the last 0.2 ms (``BUSY_NS``), the loop still held: a spin of each channel's
every tick took 12 % of a core from the recognisers with 4 channels at 30 fps on 2 cores
(docs/MEASUREMENTS.md, "The tick clock gives its core up").
Waits that need no precision (pacing a file, look-ahead fetches) pass ``precise=False`` and
never spin.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import heapq
import itertools
import logging
import os
import sys
import time
from fractions import Fraction
from typing import Protocol, runtime_checkable

from subd.errors import ConfigError

log = logging.getLogger("subd.clock")

SPIN_NS = 1_000_000
# ... of which the thread sleeps (time.sleep: the loop still held, the CPU free for the other
# processes) all but the last BUSY_NS, and spins those
BUSY_NS = 200_000


# ---- exact wake-ups: a Linux timerfd --------------------------------------------------------
#
# Wake-ups in the event loop at an exact monotonic time, from a Linux timerfd.
#
# An asyncio sleep waits in ``epoll_wait``, whose timeout is whole milliseconds, rounded up: a
# task asking to wake at T wakes between T and T + 1 ms, then behind whatever else is ready. The
# publisher slept to T(k) − 2 ms and spun the rest, so that round-up ate half its margin:
# measured on the 2-core development machine (`subd bench realtime`, 855 ticks, two other
# processes busy), its coarse wake came 0.73 ms late at p50 and 1.26 ms at p90, and the ticks
# whose wake plus the state's preparation passed the margin were published 1-8 ms late.
#
# A timerfd armed at an absolute ``CLOCK_MONOTONIC`` time (the clock of ``time.monotonic_ns``)
# fires with nanosecond resolution and wakes ``epoll_wait`` at that moment; the loop then runs the
# sleeper with its other ready callbacks. Each waiting task holds its own descriptor (from a small
# pool, re-armed each time). Where timerfd is not available (not Linux, no libc through ctypes),
# :func:`wait_until_exact` is a plain asyncio sleep.

CLOCK_MONOTONIC = 1
TFD_CLOEXEC = 0o2000000
TFD_NONBLOCK = 0o4000
TFD_TIMER_ABSTIME = 1


class _TfdTimespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _TfdItimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _TfdTimespec), ("it_value", _TfdTimespec)]


def _tfd_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create  # noqa: B018 - absent outside Linux: AttributeError
        libc.timerfd_settime  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


_TFD_LIBC = _tfd_libc()
_TFD_FREE: list[int] = []  # disarmed descriptors, for the next waiter


def _tfd_forget_after_fork() -> None:
    """A forked child shares the parent's timers: it closes its copies and makes its own."""
    while _TFD_FREE:
        os.close(_TFD_FREE.pop())


os.register_at_fork(after_in_child=_tfd_forget_after_fork)


def timerfd_available() -> bool:
    return _TFD_LIBC is not None


def _tfd_arm(fd: int, at_ns: int) -> None:
    """Arm ``fd`` to fire once at ``at_ns`` on the monotonic clock (0 disarms it)."""
    value = _TfdTimespec(at_ns // 1_000_000_000, at_ns % 1_000_000_000)
    spec = _TfdItimerspec(_TfdTimespec(0, 0), value)
    if _TFD_LIBC.timerfd_settime(fd, TFD_TIMER_ABSTIME if at_ns else 0, ctypes.byref(spec),
                             None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"timerfd_settime: {os.strerror(err)}")


def _tfd_take() -> int:
    if _TFD_FREE:
        return _TFD_FREE.pop()
    fd = _TFD_LIBC.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"timerfd_create: {os.strerror(err)}")
    return fd


def _tfd_drain(fd: int) -> None:
    try:
        os.read(fd, 8)
    except BlockingIOError:
        pass


async def wait_until_exact(deadline_ns: int) -> None:
    """Return once ``time.monotonic_ns()`` has reached ``deadline_ns`` (at once if it has)."""
    if deadline_ns <= time.monotonic_ns():
        return
    if _TFD_LIBC is None:
        await asyncio.sleep((deadline_ns - time.monotonic_ns()) / 1e9)
        return
    loop = asyncio.get_running_loop()
    fd = _tfd_take()
    fired = loop.create_future()

    def on_fire() -> None:
        _tfd_drain(fd)
        if not fired.done():
            fired.set_result(None)

    try:
        _tfd_arm(fd, deadline_ns)
        loop.add_reader(fd, on_fire)
        try:
            await fired
        finally:
            loop.remove_reader(fd)
    except BaseException:
        os.close(fd)  # cancelled or failed: this one is not reused (it may still be armed)
        raise
    _tfd_arm(fd, 0)
    _tfd_drain(fd)
    _TFD_FREE.append(fd)


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
        await wait_until_exact(deadline_ns - margin_ns)
        now = time.monotonic_ns()
        if not precise:
            while now < deadline_ns:  # asyncio may wake a hair early; never return early
                await asyncio.sleep(max(deadline_ns - now, 100_000) / 1e9)
                now = time.monotonic_ns()
            return now
        if deadline_ns - now > BUSY_NS:
            # the loop stays held (nothing else may start in it now), the core is given up
            time.sleep((deadline_ns - now - BUSY_NS) / 1e9)
            now = time.monotonic_ns()
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


def share_gil_within_spin(spin_ns: int = SPIN_NS) -> None:
    """Let the tick clock's thread take the interpreter lock back well within its spin margin.

    Another thread of the process that holds the lock (``/metrics`` renders in one: 10 ms of
    pure Python with 4 channels) is asked to drop it only after the switch interval, 5 ms by
    default: a clock waking at T(k) - 1 ms to spin then published up to 4 ms late. Measured
    with 4 channels and a scrape every 200 ms (ticks over 1 ms late of 3600, p99): rendered on
    the loop 153, 8.6 ms; in a thread with a switch interval of 0.5 ms 92, 1.5 ms, of 0.1 ms
    12, 0.13 ms, about as many as with no scrape at all (6). So a tenth of the margin."""
    sys.setswitchinterval(spin_ns / 10 / 1e9)


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
