"""Sample clock vs monotonic clock: how fast a live source really runs.

A sound card at "16 kHz" delivers 16 000·(1 + ε) samples per monotonic second, |ε| ≈ 100 ppm, so
a fixed mapping loses D over hours. Chunk arrivals are only ever *late* (scheduling, network),
never early, so the estimator keeps the least-delayed arrival per block of audio (the lower
envelope) and fits a Theil–Sen line (robust to the odd outlier) through the last blocks of a
sliding window. File sources have no drift: :class:`NominalRate` is exact.

The fitted rate is clamped to ``max_ppm`` (500 ppm: five times what sound cards are off by). A
push source that pauses and then resumes at real time leaves a step in the arrivals, and every
pair of points across it reads as a clock running percents slow: unclamped, one 5 s gap skewed
the rate by ~1.7 % (17 000 ppm) for as long as the step stayed in the 10 minute window, and D
with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from subd.types import SAMPLE_RATE_HZ

MAX_PPM = 500.0  # the largest sample-clock error believed (module docstring)


@dataclass(frozen=True, slots=True)
class DriftFit:
    """monotonic_ns ≈ intercept_ns + sample_index · ns_per_sample."""

    intercept_ns: float
    ns_per_sample: float
    n_points: int

    @property
    def ppm(self) -> float:
        """Sample-clock error: positive when the source runs fast."""
        nominal = 1e9 / SAMPLE_RATE_HZ
        return (nominal / self.ns_per_sample - 1.0) * 1e6

    def rate(self) -> Fraction:
        """Audio seconds per monotonic second, as an exact-enough rational (1e-9 steps)."""
        return Fraction(round((1e9 / SAMPLE_RATE_HZ / self.ns_per_sample) * 1e9), 10**9)

    def monotonic_ns(self, sample_index: int) -> int:
        return int(round(self.intercept_ns + sample_index * self.ns_per_sample))


class NominalRate:
    """A source with no clock of its own (a file): samples map to time at the nominal rate."""

    def __init__(self, t0_ns: int, speed: Fraction = Fraction(1)) -> None:
        self.t0_ns = t0_ns
        self.speed = speed

    def fit(self) -> DriftFit:
        return DriftFit(float(self.t0_ns), float(1e9 / SAMPLE_RATE_HZ / self.speed), 0)


class DriftEstimator:
    """Robust sliding-window fit of sample index → monotonic ns for a live source.

    ``observe`` is cheap and allocation-free (called per chunk); ``fit`` runs on demand
    (every few seconds). ``block_samples`` of audio form one point (its least-delayed arrival);
    ``window_points`` points form the window (default 1 s blocks × 600 = 10 minutes).
    """

    def __init__(self, block_samples: int = SAMPLE_RATE_HZ, window_points: int = 600,
                 min_points: int = 8, max_ppm: float = MAX_PPM) -> None:
        self.max_ppm = float(max_ppm)
        self.block_samples = int(block_samples)
        self.window_points = int(window_points)
        self.min_points = int(min_points)
        self._samples = np.zeros(self.window_points, dtype=np.float64)
        self._times = np.zeros(self.window_points, dtype=np.float64)
        self._n = 0
        self._next = 0
        self._block_start = -1
        self._best_residual = 0.0
        self._best_sample = 0
        self._best_time = 0
        self._nominal_ns = 1e9 / SAMPLE_RATE_HZ

    def observe(self, end_sample: int, arrival_ns: int) -> None:
        """A chunk ending at ``end_sample`` (exclusive) arrived at monotonic ``arrival_ns``."""
        residual = arrival_ns - end_sample * self._nominal_ns
        if self._block_start < 0:
            self._block_start = end_sample
            self._best_residual = residual
            self._best_sample, self._best_time = end_sample, arrival_ns
        elif residual < self._best_residual:
            self._best_residual = residual
            self._best_sample, self._best_time = end_sample, arrival_ns
        if end_sample - self._block_start >= self.block_samples:
            self._samples[self._next] = self._best_sample
            self._times[self._next] = self._best_time
            self._next = (self._next + 1) % self.window_points
            self._n = min(self._n + 1, self.window_points)
            self._block_start = -1

    @property
    def n_points(self) -> int:
        return self._n

    def fit(self) -> DriftFit | None:
        """Theil–Sen fit over the window, or None until ``min_points`` blocks were seen."""
        n = self._n
        if n < self.min_points:
            return None
        order = np.argsort(self._samples[:n], kind="stable")
        s = self._samples[:n][order]
        t = self._times[:n][order]
        # pairs half a window apart: O(n), each slope spans a long baseline
        half = n // 2
        ds = s[half:half * 2] - s[:half]
        dt = t[half:half * 2] - t[:half]
        ok = ds > 0
        if not ok.any():
            return None
        slope = float(np.median(dt[ok] / ds[ok]))
        # ns per sample: a fast clock (positive ppm) has a smaller slope than nominal
        limit = self.max_ppm * 1e-6
        slope = min(max(slope, self._nominal_ns / (1 + limit)), self._nominal_ns / (1 - limit))
        # arrivals are late, never early: the intercept follows the low envelope of residuals
        intercept = float(np.quantile(t - slope * s, 0.1))
        return DriftFit(intercept, slope, n)
