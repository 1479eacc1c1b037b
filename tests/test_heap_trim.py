"""Stage processes give freed heap back to the OS now and then, not after every answer: each
trim made the next request touch the returned pages again (the recogniser: ~17k page faults,
36 ms of system time per update with 4 channels sharing it)."""

from __future__ import annotations

import asyncio

from subd.workers.hosts import FactorySpec
from subd.workers.process import ProcessWorker, _heap_trimmer


def test_the_heap_is_trimmed_at_most_once_per_interval() -> None:
    now = [0]
    calls: list[int] = []
    trim = _heap_trimmer(every_ns=10, trim=calls.append, now_ns=lambda: now[0])
    trim()  # the first answer: what loading left freed goes back
    for t in (1, 5, 9):
        now[0] = t
        trim()
    assert len(calls) == 1
    now[0] = 10
    trim()
    trim()
    assert len(calls) == 2


class _Churn:
    """Allocates and frees 24 MB of 256 KiB blocks per request, as an update's tensors do.
    glibc is told to serve them from the heap and never to shrink its top by itself, so only
    malloc_trim gives them back."""

    def __init__(self) -> None:
        import ctypes

        mallopt = ctypes.CDLL("libc.so.6").mallopt
        mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
        mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD

    def handle(self, request: int) -> int:
        blocks = [bytearray(256 * 1024) for _ in range(96)]
        for b in blocks:
            for j in range(0, len(b), 4096):  # touch every page
                b[j] = 1
        del blocks
        return _minor_faults()


def _minor_faults() -> int:
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def make_churn() -> _Churn:
    return _Churn()


def test_a_stage_process_reuses_its_freed_heap_between_requests() -> None:
    async def run() -> list[int]:
        worker = ProcessWorker("churn", FactorySpec("tests.test_heap_trim:make_churn"))
        await worker.start(60)
        try:
            faults = []
            for i in range(8):
                faults.append(await worker.call(i))
                await asyncio.sleep(0.15)  # past the old 100 ms trim interval
            return faults
        finally:
            await worker.close(5)

    faults = asyncio.run(run())
    # 24 MB is ~6000 pages: touched afresh after a trim, reused from the heap otherwise
    later = [b - a for a, b in zip(faults[1:], faults[2:], strict=False)]
    assert max(later) < 1500, later


class _Crowd:
    """A channel's host holding many small objects, as a loaded tagger does (~170k); its
    requests say how many objects a full collection would walk, and how many are frozen."""

    def __init__(self) -> None:
        self.objects = [[i] for i in range(100_000)]  # lists: always tracked

    def handle(self, request: object) -> tuple[int, int]:
        import gc

        return gc.get_freeze_count(), len(gc.get_objects())


def make_crowd() -> _Crowd:
    return _Crowd()


def test_a_full_collection_in_a_stage_process_does_not_walk_the_channels_hosts() -> None:
    """Each channel's host is frozen out of CPython's collections once attached (a full pass
    over a tagger process's 170k objects took 80-286 ms, inside a tag pass: degraded ticks and
    a fallback), and given back to them when its channel detaches, so it is freed."""
    from subd.service.multiplex import Attach, Detach, ForChannel

    async def run() -> tuple:
        worker = ProcessWorker("crowd", FactorySpec("subd.service.multiplex:MultiplexHost"))
        await worker.start(60)
        try:
            host = FactorySpec("tests.test_heap_trim:make_crowd")
            await worker.call(Attach("a", host))
            await worker.call(Attach("b", host))
            attached = await worker.call(ForChannel("a", None))
            await worker.call(Detach("a"))
            detached = await worker.call(ForChannel("b", None))
            return attached, detached
        finally:
            await worker.close(5)

    (frozen, walked), (frozen_after, _) = asyncio.run(run())
    assert frozen >= 200_000  # both channels' hosts
    assert walked < 50_000
    assert frozen - frozen_after >= 100_000  # channel a's objects were let go


class _Ring:
    """A channel's host whose state holds a reference cycle (as a few objects of a used tag
    host do: 62 of them); its requests report whether the cycle of the host built before it
    is still alive, and how many full collections the process has run."""

    made: list = []

    def __init__(self) -> None:
        import weakref

        node: dict = {}
        node["self"] = node  # a cycle: reference counting alone never frees it
        self.node = node
        self.ref = weakref.ref(_Holder(node))
        _Ring.made.append(self.ref)

    def handle(self, request: object) -> tuple[list[bool], int]:
        import gc

        return [ref() is not None for ref in _Ring.made], gc.get_stats()[2]["collections"]


class _Holder:
    def __init__(self, node: dict) -> None:
        node["holder"] = self  # in the cycle, and weakly referenceable


def make_ring() -> _Ring:
    return _Ring()


def test_a_channel_that_leaves_costs_the_others_no_full_collection() -> None:
    """A full pass in a stage process that serves other channels stalls their requests (105-125
    ms on an idle core): a host let go is freed by reference counting at once, and its cycles
    wait until no channel is attached (or OWED_HOSTS_LIMIT hosts are owed)."""
    from subd.service.multiplex import Attach, Detach, ForChannel

    async def run() -> list:
        worker = ProcessWorker("rings", FactorySpec("subd.service.multiplex:MultiplexHost"))
        await worker.start(60)
        host = FactorySpec("tests.test_heap_trim:make_ring")
        try:
            await worker.call(Attach("a", host))
            await worker.call(Attach("b", host))
            seen = [await worker.call(ForChannel("b", None))]
            await worker.call(Detach("a"))
            seen.append(await worker.call(ForChannel("b", None)))
            await worker.call(Detach("b"))  # the last: the process is idle
            await worker.call(Attach("c", host))
            seen.append(await worker.call(ForChannel("c", None)))
            return seen
        finally:
            await worker.close(5)

    (alive0, full0), (alive1, full1), (alive2, full2) = asyncio.run(run())
    assert alive0 == [True, True] and alive1 == [True, True]  # a's cycle waits
    assert full1 == full0  # no full pass while b was served
    assert alive2 == [False, False, True] and full2 > full1  # idle: collected


def test_hosts_let_go_are_collected_by_the_limit_while_channels_stay(monkeypatch) -> None:
    import gc
    import weakref

    from subd.workers import process

    monkeypatch.setattr(process, "_IN_STAGE_PROCESS", True)
    monkeypatch.setattr(process, "_owed_hosts", 0)

    class Node:
        pass

    node = Node()
    node.self = node
    ref = weakref.ref(node)
    try:
        process.settle_heap()  # attached: frozen
        del node
        for _ in range(process.OWED_HOSTS_LIMIT - 1):
            process.settle_heap(dropped=True)
        assert ref() is not None
        process.settle_heap(dropped=True)
        assert ref() is None
    finally:
        gc.unfreeze()
