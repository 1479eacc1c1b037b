"""Wake-ups in the event loop at an exact monotonic time, from a Linux timerfd.

An asyncio sleep waits in ``epoll_wait``, whose timeout is whole milliseconds, rounded up: a
task asking to wake at T wakes between T and T + 1 ms, then behind whatever else is ready. The
publisher sleeps to T(k) − 2 ms and spins the rest, so that round-up ate half its margin:
measured on the 2-core development machine (`subd bench realtime`, 855 ticks, two other
processes busy), its coarse wake came 0.73 ms late at p50 and 1.26 ms at p90, and the ticks
whose wake plus the state's preparation passed the margin were published 1-8 ms late.

A timerfd armed at an absolute ``CLOCK_MONOTONIC`` time (the clock of ``time.monotonic_ns``)
fires with nanosecond resolution and wakes ``epoll_wait`` at that moment; the loop then runs the
sleeper with its other ready callbacks. Each waiting task holds its own descriptor (from a small
pool, re-armed each time). Where timerfd is not available (not Linux, no libc through ctypes),
:func:`wait_until` is a plain asyncio sleep.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import time

CLOCK_MONOTONIC = 1
TFD_CLOEXEC = 0o2000000
TFD_NONBLOCK = 0o4000
TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create  # noqa: B018 - absent outside Linux: AttributeError
        libc.timerfd_settime  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()
_FREE: list[int] = []  # disarmed descriptors, for the next waiter


def _forget_after_fork() -> None:
    """A forked child shares the parent's timers: it closes its copies and makes its own."""
    while _FREE:
        os.close(_FREE.pop())


os.register_at_fork(after_in_child=_forget_after_fork)


def available() -> bool:
    return _LIBC is not None


def _arm(fd: int, at_ns: int) -> None:
    """Arm ``fd`` to fire once at ``at_ns`` on the monotonic clock (0 disarms it)."""
    value = _Timespec(at_ns // 1_000_000_000, at_ns % 1_000_000_000)
    spec = _Itimerspec(_Timespec(0, 0), value)
    if _LIBC.timerfd_settime(fd, TFD_TIMER_ABSTIME if at_ns else 0, ctypes.byref(spec),
                             None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"timerfd_settime: {os.strerror(err)}")


def _take() -> int:
    if _FREE:
        return _FREE.pop()
    fd = _LIBC.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"timerfd_create: {os.strerror(err)}")
    return fd


def _drain(fd: int) -> None:
    try:
        os.read(fd, 8)
    except BlockingIOError:
        pass


async def wait_until(deadline_ns: int) -> None:
    """Return once ``time.monotonic_ns()`` has reached ``deadline_ns`` (at once if it has)."""
    if deadline_ns <= time.monotonic_ns():
        return
    if _LIBC is None:
        await asyncio.sleep((deadline_ns - time.monotonic_ns()) / 1e9)
        return
    loop = asyncio.get_running_loop()
    fd = _take()
    fired = loop.create_future()

    def on_fire() -> None:
        _drain(fd)
        if not fired.done():
            fired.set_result(None)

    try:
        _arm(fd, deadline_ns)
        loop.add_reader(fd, on_fire)
        try:
            await fired
        finally:
            loop.remove_reader(fd)
    except BaseException:
        os.close(fd)  # cancelled or failed: this one is not reused (it may still be armed)
        raise
    _arm(fd, 0)
    _drain(fd)
    _FREE.append(fd)
