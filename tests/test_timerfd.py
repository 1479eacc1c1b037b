"""The event loop's exact wake-ups (subd.clock.wait_until_exact, a timerfd) and the clock that
uses them."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from subd import clock as timerfd
from subd.clock import MonotonicClock

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@linux_only
def test_a_wait_never_ends_before_its_deadline_and_its_descriptor_is_reused():
    assert timerfd.timerfd_available()

    async def main() -> list[int]:
        early = []
        for i in range(50):
            deadline = time.monotonic_ns() + 200_000 + 37_000 * i
            await timerfd.wait_until_exact(deadline)
            early.append(deadline - time.monotonic_ns())
        return early

    asyncio.run(main())  # the pool's first descriptor is made here
    before = open_fds()
    early = asyncio.run(main())
    assert max(early) <= 0  # never returns before the deadline
    assert open_fds() == before  # one descriptor, re-armed, not one per wait


@linux_only
def test_a_cancelled_wait_closes_its_descriptor_and_a_passed_deadline_arms_nothing():
    async def main() -> None:
        before = open_fds()
        made = 0 if timerfd._TFD_FREE else 1  # noqa: SLF001 - a new descriptor, or the pool's
        waiter = asyncio.ensure_future(timerfd.wait_until_exact(time.monotonic_ns() + 10**10))
        await asyncio.sleep(0.01)
        assert open_fds() == before + made
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        free = len(timerfd._TFD_FREE)  # noqa: SLF001
        await timerfd.wait_until_exact(time.monotonic_ns() - 1)  # passed: returns at once
        assert len(timerfd._TFD_FREE) == free  # noqa: SLF001
        assert open_fds() == before + made - 1  # the cancelled one is closed, not pooled

    asyncio.run(main())


def test_the_clock_sleeps_on_it_and_without_it_and_never_returns_early(monkeypatch):
    clock = MonotonicClock()

    async def main() -> list[int]:
        out = []
        for precise in (True, False, True, False):
            deadline = time.monotonic_ns() + 3_000_000
            out.append(await clock.sleep_until(deadline, precise=precise) - deadline)
        return out

    assert min(asyncio.run(main())) >= 0
    monkeypatch.setattr(timerfd, "_TFD_LIBC", None)  # no timerfd: an asyncio sleep
    assert not timerfd.timerfd_available()
    assert min(asyncio.run(main())) >= 0


@linux_only
def test_a_forked_child_does_not_reuse_the_parents_timers():
    asyncio.run(timerfd.wait_until_exact(time.monotonic_ns() + 100_000))
    assert timerfd._TFD_FREE  # noqa: SLF001 - one pooled descriptor in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its pool is empty, and its own waits still work
        ok = not timerfd._TFD_FREE  # noqa: SLF001
        asyncio.run(timerfd.wait_until_exact(time.monotonic_ns() + 100_000))
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    assert timerfd._TFD_FREE  # noqa: SLF001 - the parent's pool is as it was
