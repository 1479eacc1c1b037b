"""The slot ring and the audio history: sizing, the stale-slot protocol, no hot-path growth."""

from __future__ import annotations

import tracemalloc

import numpy as np

from subd.history import AudioHistory
from subd.pipeline.ingest import Ingest
from subd.pipeline.ring import SlotFlag, SlotRing, n_slots_for
from subd.pipeline.ticks import TickGrid
from subd.pipeline.tickstats import Counters
from subd.types import AudioChunk, CaptionState


class StepClock:
    def __init__(self) -> None:
        self.t = 0

    def now_ns(self) -> int:
        self.t += 1000
        return self.t


def test_ring_covers_latency_and_lookahead_plus_three_spares():
    grid = TickGrid.create("30", 0, 2000, 150)
    assert n_slots_for(grid.latency_ns, grid.lookahead_ns, grid.wall_period_ns) == 65 + 3
    slot = SlotRing(68).acquire(0)
    # a slot holds the tick's build mode and prepared state; the audio is in the history only
    assert slot.k == 0 and slot.mode is None and slot.state is None
    assert not hasattr(slot, "__dict__") and not hasattr(slot, "audio")


def test_a_busy_slot_is_declared_stale_when_the_ring_comes_round():
    ring = SlotRing(6)
    for k in range(6):
        ring.acquire(k)
    for k in range(3):
        slot = ring.acquire(k)
        slot.state = CaptionState(k=k, due_ns=0, audio_end_ns=0)
        ring.mark(slot, SlotFlag.TAGGED)
        ring.release(k)  # ticks 0..2 published
        assert slot.state is None  # the published state is not held on to
    for k in range(6, 9):  # reuse of published slots is not stale
        ring.acquire(k)
    assert ring.stale_count == 0
    ring.acquire(3).state = CaptionState(k=3, due_ns=0, audio_end_ns=0)
    slot = ring.acquire(9)  # slot of tick 3, never published
    assert ring.stale_count == 1 and ring.last_stale_k == 3
    assert slot.k == 9 and slot.flags == 0 and slot.state is None and slot.mode is None
    assert ring.get(3) is None  # tick 3 will be published as a fallback
    assert ring.acquire(3) is None  # and its late work finds no slot


def test_ingest_hot_path_allocates_nothing_over_many_ticks():
    history = AudioHistory(16000 * 40)
    ingest = Ingest(history, StepClock(), Counters())
    audio = np.random.default_rng(0).standard_normal(16000 * 60).astype(np.float32)
    chunks = [AudioChunk(i, audio[i % audio.shape[0]: i % audio.shape[0] + 320])
              for i in range(0, audio.shape[0], 320)]

    def run(first_chunk: int, n: int) -> None:
        for j in range(first_chunk, first_chunk + n):
            ingest.write(AudioChunk(j * 320, chunks[j % len(chunks)].samples))

    run(0, 2000)  # warm up (40 s of audio)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    run(2000, 6000)  # two more minutes
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename")
                if stat.traceback[0].filename.endswith(("history.py", "ingest.py",
                                                        "tickstats.py")))
    assert grown < 4096, f"hot path grew by {grown} bytes"
    assert ingest.ingested == history.end_sample == 8000 * 320
    last = chunks[7999 % len(chunks)].samples
    np.testing.assert_array_equal(history.read(7999 * 320, 8000 * 320), last)


def test_audio_history_wraps_and_reads_back_exactly():
    hist = AudioHistory(1000)
    data = np.arange(2500, dtype=np.float32)
    for start in range(0, 2500, 300):
        hist.write(start, data[start:start + 300])
    assert hist.end_sample == 2500 and hist.start_sample == 1500
    np.testing.assert_array_equal(hist.read(1700, 2500), data[1700:2500])


def test_shared_audio_history_is_visible_to_an_attached_reader():
    owner = AudioHistory(4000, shared=True)
    try:
        reader = AudioHistory(4000, name=owner.shm_name)
        owner.write(0, np.full(100, 0.5, dtype=np.float32))
        np.testing.assert_array_equal(reader.read(0, 100), np.full(100, 0.5))
        reader.close()
    finally:
        owner.close()
