"""Counters and duration statistics of the tick scheduler (preallocated, no hot-path growth)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class Durations:
    """The last ``capacity`` durations (ns) in a preallocated ring, plus count and max."""

    __slots__ = ("_buf", "count", "max_ns", "total_ns")

    def __init__(self, capacity: int = 8192) -> None:
        self._buf = np.zeros(capacity, dtype=np.int64)
        self.count = 0
        self.max_ns = 0
        self.total_ns = 0

    def add(self, ns: int) -> None:
        self._buf[self.count % self._buf.shape[0]] = ns
        self.count += 1
        self.total_ns += ns
        if ns > self.max_ns:
            self.max_ns = ns

    def values(self) -> np.ndarray:
        return self._buf[: min(self.count, self._buf.shape[0])].copy()

    def percentile_ns(self, q: float) -> float:
        vals = self.values()
        return float(np.percentile(vals, q)) if vals.size else 0.0

    def summary_ms(self) -> dict[str, float]:
        if not self.count:
            return {"n": 0}
        return {
            "n": self.count,
            "p50_ms": self.percentile_ns(50) / 1e6,
            "p99_ms": self.percentile_ns(99) / 1e6,
            "max_ms": self.max_ns / 1e6,
        }


STAGES = ("ingest", "recognise", "tag", "layout", "publish")


@dataclass
class Counters:
    ticks: int = 0
    deadline_misses: int = 0
    fallbacks: int = 0
    stale_slots: int = 0
    degraded_ticks: int = 0
    recognition_behind: int = 0  # ticks fetched before the recogniser reached their audio
    late_results: int = 0  # tag results that arrived after their tick was published
    superseded_requests: int = 0  # tag requests replaced by a newer tick before they ran
    sink_errors: int = 0
    lost_samples: int = 0  # live audio overwritten before the recogniser read it
    updates_skipped: int = 0  # planned updates left out: the recogniser fell behind them
    # updates a shared recogniser answered without a decode: they would have missed their due
    # time (subd.service.batching), the due words decided from the last reading
    updates_degraded: int = 0
    stage: dict[str, Durations] = field(default_factory=lambda: {s: Durations() for s in STAGES})
    publish_error: Durations = field(default_factory=Durations)  # sent − due

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if isinstance(v, int)}
        out["stage_ms"] = {name: d.summary_ms() for name, d in self.stage.items()}
        out["publish_error_ms"] = self.publish_error.summary_ms()
        return out
