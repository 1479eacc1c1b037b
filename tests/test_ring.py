"""The slot ring and the history rings: sizing, the stale-slot protocol, no hot-path growth."""

from __future__ import annotations

import tracemalloc
from fractions import Fraction

import numpy as np
import pytest

from subd.history import AudioHistory
from subd.pipeline.ingest import Ingest
from subd.pipeline.ring import FeatureHistory, RingCalibration, SlotFlag, SlotRing, n_slots_for
from subd.pipeline.ticks import TickGrid
from subd.pipeline.tickstats import Counters
from subd.types import AudioChunk


class StepClock:
    def __init__(self) -> None:
        self.t = 0

    def now_ns(self) -> int:
        self.t += 1000
        return self.t


def test_ring_covers_latency_and_lookahead_plus_three_spares():
    grid = TickGrid.create("30", 0, 2000, 150)
    assert n_slots_for(grid.latency_ns, grid.lookahead_ns, grid.wall_period_ns) == 65 + 3
    cal = RingCalibration.for_period(grid.period_ns)
    ring = SlotRing(68, cal)
    slot = ring.acquire(0)
    assert slot.audio.shape[0] >= 1.2 * 534  # 1.2x the largest tick (534 samples at 30 fps)
    assert slot.features.shape[0] >= 1.2 * cal.peak_frames


def test_a_busy_slot_is_declared_stale_when_the_ring_comes_round():
    ring = SlotRing(6, RingCalibration(peak_samples=100, peak_frames=2))
    for k in range(6):
        ring.acquire(k)
    for k in range(3):
        ring.mark(ring.acquire(k), SlotFlag.INGESTED)
        ring.release(k)  # ticks 0..2 published
    for k in range(6, 9):  # reuse of published slots is not stale
        ring.acquire(k)
    assert ring.stale_count == 0
    slot = ring.acquire(9)  # slot of tick 3, never published
    assert ring.stale_count == 1 and ring.last_stale_k == 3
    assert slot.k == 9 and slot.flags == 0 and slot.n_audio == 0
    assert ring.get(3) is None  # tick 3 will be published as a fallback
    assert ring.acquire(3) is None  # and its late work finds no slot


def test_payload_over_capacity_is_truncated_and_counted_not_grown():
    ring = SlotRing(4, RingCalibration(peak_samples=10, peak_frames=1))
    slot = ring.acquire(0)
    assert ring.write_audio(slot, np.ones(20, dtype=np.float32)) == 12
    assert ring.overflow_count == 1 and slot.audio.shape[0] == 12


def test_ingest_hot_path_allocates_nothing_over_many_ticks():
    grid = TickGrid.create("30000/1001", 0, 2000, 150)
    ring = SlotRing(n_slots_for(grid.latency_ns, grid.lookahead_ns, grid.wall_period_ns),
                    RingCalibration.for_period(grid.period_ns))
    history = AudioHistory(16000 * 40)
    ingest = Ingest(grid, ring, history, FeatureHistory(4000), StepClock(), Counters())
    audio = np.random.default_rng(0).standard_normal(16000 * 60).astype(np.float32)
    chunks = [AudioChunk(i, audio[i % audio.shape[0]: i % audio.shape[0] + 320])
              for i in range(0, audio.shape[0], 320)]

    def run(first_chunk: int, n: int) -> None:
        for j in range(first_chunk, first_chunk + n):
            c = chunks[j % len(chunks)]
            start = j * 320
            ingest.write(AudioChunk(start, c.samples))
            k = grid.tick_of_sample(start)
            for done in range(max(0, k - 70), k - 65):  # the publisher releases old ticks
                ring.release(done)

    run(0, 2000)  # warm up (40 s of audio)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    run(2000, 6000)  # two more minutes: ~3600 ticks
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename")
                if stat.traceback[0].filename.endswith(("ring.py", "ingest.py", "tickstats.py")))
    assert grown < 4096, f"hot path grew by {grown} bytes"
    assert ring.stale_count == 0
    last_complete = grid.tick_of_sample(8000 * 320 - 1) - 1
    assert ring.get(last_complete).flags & (SlotFlag.INGESTED | SlotFlag.FEATURISED) == 3
    assert ring.get(last_complete).n_audio == grid.audio_end_sample(last_complete) - \
        grid.audio_end_sample(last_complete - 1)


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


def test_feature_history_keeps_the_latest_frames():
    feats = FeatureHistory(10, n_bins=1)
    feats.write(0, np.arange(25, dtype=np.float32).reshape(25, 1))
    np.testing.assert_array_equal(feats.read(0, 25)[:, 0], np.arange(15, 25))


@pytest.mark.parametrize("fps", ["25", "30", "30000/1001"])
def test_calibration_follows_the_tick_period(fps):
    grid = TickGrid.create(fps, 0, 1000, 150)
    cal = RingCalibration.for_period(grid.period_ns)
    assert cal.peak_samples == -(-16000 * Fraction(1, 1) // grid.fps)
