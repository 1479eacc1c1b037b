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
    """Allocates and frees 24 MB of 256 KiB blocks per request, as an update's tensors do;
    what it keeps (its result) lies above them, so glibc's own trim of the heap's top at
    free() cannot give them back: only malloc_trim does."""

    def __init__(self) -> None:
        self.kept = bytearray()

    def handle(self, request: int) -> int:
        blocks = [bytearray(256 * 1024) for _ in range(96)]
        self.kept = bytearray(64 * 1024)
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
