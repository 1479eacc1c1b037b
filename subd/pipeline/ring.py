"""Preallocated rings: one slot per tick, plus long audio and feature history.

The slot ring holds tick k in slot ``k mod N`` with N = ceil((D + A)/P) + 3 spares. Payload
arrays are sized 1.2× the calibrated per-tick peak and allocated once; the hot path (acquire,
write, flag, release) allocates nothing. A slot still busy (not published) when the ring comes
round is *stale*: it is counted and reused, and its tick is published as a fallback (the
scheduler finds the slot gone at that tick's deadline). Audio history (the recogniser's window,
30 s and more) lives in :class:`AudioHistory`, optionally in shared memory so a worker process
reads it without copies through a pipe.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from subd.types import SAMPLE_RATE_HZ

FRAME_SAMPLES = SAMPLE_RATE_HZ // 100  # 10 ms feature frames
HEADROOM = Fraction(6, 5)  # payloads sized 1.2× the calibrated peak


class SlotFlag(enum.IntFlag):
    INGESTED = 1
    FEATURISED = 2
    RECOGNISED = 4
    TAGGED = 8
    LAID_OUT = 16
    PUBLISHED = 32


_PUBLISHED = int(SlotFlag.PUBLISHED)


@dataclass(frozen=True, slots=True)
class RingCalibration:
    """Per-tick payload peaks (before headroom)."""

    peak_samples: int
    peak_frames: int
    n_feature_bins: int = 1

    @classmethod
    def for_period(cls, period_ns: Fraction, n_feature_bins: int = 1) -> RingCalibration:
        """Peaks implied by the tick period: a tick holds at most ceil(P·rate) samples."""
        samples = math.ceil(period_ns * SAMPLE_RATE_HZ / 1_000_000_000)
        frames = math.ceil(Fraction(samples, FRAME_SAMPLES)) + 1
        return cls(peak_samples=samples, peak_frames=frames, n_feature_bins=n_feature_bins)

    def capacity(self, peak: int) -> int:
        return math.ceil(peak * HEADROOM)


def n_slots_for(latency_ns: int, lookahead_ns: int, wall_period_ns: Fraction) -> int:
    """N = ceil((D + A) / P) + 3 spare slots."""
    return math.ceil((latency_ns + lookahead_ns) / wall_period_ns) + 3


class Slot:
    """One tick's preallocated payload and its stage flags."""

    __slots__ = ("index", "k", "flags", "audio", "n_audio", "features", "n_frames", "result")

    def __init__(self, index: int, cal: RingCalibration) -> None:
        self.index = index
        self.k = -1
        self.flags = 0
        self.audio = np.zeros(cal.capacity(cal.peak_samples), dtype=np.float32)  # [samples]
        self.n_audio = 0
        # [frames, bins]
        self.features = np.zeros(
            (cal.capacity(cal.peak_frames), cal.n_feature_bins), dtype=np.float32
        )
        self.n_frames = 0
        self.result: object | None = None  # the laid-out state of this tick (TagResult)

    def reset(self, k: int) -> None:
        self.k = k
        self.flags = 0
        self.n_audio = 0
        self.n_frames = 0
        self.result = None

    @property
    def busy(self) -> bool:
        return self.k >= 0 and not (self.flags & _PUBLISHED)


class SlotRing:
    def __init__(self, n_slots: int, cal: RingCalibration) -> None:
        if n_slots < 4:
            raise ValueError("a slot ring needs at least 4 slots")
        self.n_slots = n_slots
        self.calibration = cal
        self._slots = [Slot(i, cal) for i in range(n_slots)]
        self.stale_count = 0
        self.overflow_count = 0  # payload larger than the calibrated capacity (truncated)
        self.last_stale_k = -1

    def acquire(self, k: int) -> Slot | None:
        """The slot for tick k, taking it over (stale protocol) if it holds an older tick.

        None if the slot already holds a *newer* tick (a burst of audio lapped the ring):
        tick k then has no slot and is published as a fallback.
        """
        slot = self._slots[k % self.n_slots]
        if slot.k == k:
            return slot
        if slot.k > k:
            return None
        if slot.k >= 0 and not (slot.flags & _PUBLISHED):
            self.stale_count += 1
            self.last_stale_k = slot.k
        slot.reset(k)
        return slot

    def get(self, k: int) -> Slot | None:
        """The slot holding tick k, or None if it was never filled or was reused (stale)."""
        slot = self._slots[k % self.n_slots]
        return slot if slot.k == k else None

    def write_audio(self, slot: Slot, samples: np.ndarray) -> int:
        """Append samples to the slot's audio (no allocation); returns samples written."""
        room = slot.audio.shape[0] - slot.n_audio
        n = samples.shape[0]
        if n > room:
            self.overflow_count += 1
            n = room
        slot.audio[slot.n_audio : slot.n_audio + n] = samples[:n]
        slot.n_audio += n
        return n

    def write_features(self, slot: Slot, frames: np.ndarray) -> int:
        room = slot.features.shape[0] - slot.n_frames
        n = frames.shape[0]
        if n > room:
            self.overflow_count += 1
            n = room
        slot.features[slot.n_frames : slot.n_frames + n] = frames[:n]
        slot.n_frames += n
        return n

    def mark(self, slot: Slot, flag: int) -> None:
        slot.flags |= flag

    def release(self, k: int) -> None:
        """Tick k is published: its slot may be reused without counting it stale."""
        slot = self._slots[k % self.n_slots]
        if slot.k == k:
            slot.flags |= _PUBLISHED
            slot.result = None

    def busy_count(self) -> int:
        return sum(1 for s in self._slots if s.busy)


class FeatureHistory:
    """float32 [capacity_frames, n_bins] ring of feature frames indexed by absolute frame."""

    def __init__(self, capacity_frames: int, n_bins: int = 1) -> None:
        self.capacity = int(capacity_frames)
        self._buf = np.zeros((self.capacity, n_bins), dtype=np.float32)
        self.end_frame = 0

    def write(self, start_frame: int, frames: np.ndarray) -> None:
        n = frames.shape[0]
        if n > self.capacity:
            start_frame += n - self.capacity
            frames = frames[n - self.capacity :]
            n = self.capacity
        pos = start_frame % self.capacity
        first = min(n, self.capacity - pos)
        self._buf[pos : pos + first] = frames[:first]
        if first < n:
            self._buf[: n - first] = frames[first:n]
        self.end_frame = max(self.end_frame, start_frame + n)

    def read(self, start_frame: int, end_frame: int) -> np.ndarray:
        start_frame = max(start_frame, self.end_frame - self.capacity)
        idx = np.arange(start_frame, end_frame) % self.capacity
        return self._buf[idx]
