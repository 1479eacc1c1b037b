"""The ingest and feature stages: source chunks into the audio history and the tick slots.

Features are the log-energy of every complete 10 ms frame, computed in preallocated scratch
buffers (no allocation per chunk) into the feature history and each tick's slot.
"""

from __future__ import annotations

import numpy as np

from subd.clock import Clock
from subd.history import AudioHistory
from subd.pipeline.ring import FRAME_SAMPLES, FeatureHistory, SlotFlag, SlotRing
from subd.pipeline.ticks import TickGrid
from subd.pipeline.tickstats import Counters
from subd.types import AudioChunk

SCRATCH_FRAMES = 64


class Ingest:
    def __init__(self, grid: TickGrid, ring: SlotRing, history: AudioHistory,
                 features: FeatureHistory, clock: Clock, counters: Counters) -> None:
        self.grid, self.ring, self.history, self.features = grid, ring, history, features
        self.clock, self.counters = clock, counters
        self.ingested = 0  # samples [0, ingested) are in
        self._k = 0
        self._feat_frame = 0
        self._feat_k = 0
        self._frames = np.zeros((SCRATCH_FRAMES, FRAME_SAMPLES), dtype=np.float32)
        self._energy = np.zeros((SCRATCH_FRAMES, 1), dtype=np.float32)

    def write(self, chunk: AudioChunk) -> None:
        t_ns = self.clock.now_ns()
        self.history.write(chunk.start_sample, chunk.samples)
        self._write_slots(chunk.start_sample, chunk.samples)
        self.ingested = max(self.ingested, chunk.start_sample + chunk.n_samples)
        self.counters.stage["ingest"].add(self.clock.now_ns() - t_ns)
        t_ns = self.clock.now_ns()
        self._featurise()
        self.counters.stage["features"].add(self.clock.now_ns() - t_ns)

    def _write_slots(self, start: int, samples: np.ndarray) -> None:
        grid, ring = self.grid, self.ring
        pos, end = start, start + samples.shape[0]
        while pos < end:
            if grid.audio_end_sample(self._k) <= pos:
                self._k = grid.tick_of_sample(pos)
            k_end = grid.audio_end_sample(self._k)
            n = min(end, k_end) - pos
            slot = ring.acquire(self._k)
            if slot is not None:
                ring.write_audio(slot, samples[pos - start : pos - start + n])
                if pos + n == k_end:
                    ring.mark(slot, SlotFlag.INGESTED)
            pos += n

    def _featurise(self) -> None:
        grid, ring = self.grid, self.ring
        n_avail = self.ingested // FRAME_SAMPLES - self._feat_frame
        while n_avail > 0:
            n = min(n_avail, SCRATCH_FRAMES)
            f0 = self._feat_frame
            frames = self._frames[:n]
            self.history.read_into(f0 * FRAME_SAMPLES, frames.reshape(-1))
            energy = self._energy[:n]
            np.square(frames, out=frames)
            np.mean(frames, axis=1, out=energy[:, 0])
            energy += 1e-10
            np.log10(energy, out=energy)
            energy *= 10.0
            self.features.write(f0, energy)
            self._feat_frame += n
            n_avail -= n
            for i in range(n):  # each frame goes to the tick holding its last sample
                slot = ring.get(grid.tick_of_sample((f0 + i + 1) * FRAME_SAMPLES - 1))
                if slot is not None:
                    ring.write_features(slot, energy[i : i + 1])
            done = self._feat_frame * FRAME_SAMPLES
            while grid.audio_end_sample(self._feat_k) <= done:
                slot = ring.get(self._feat_k)
                if slot is not None:
                    ring.mark(slot, SlotFlag.FEATURISED)
                self._feat_k += 1
