"""The ingest stage: source chunks into the channel's one copy of its audio.

Each chunk is written once into the shared-memory :class:`~subd.history.AudioHistory`, which the
recogniser reads in place; nothing else is computed on the event loop per chunk.
"""

from __future__ import annotations

from subd.clock import Clock
from subd.history import AudioHistory
from subd.pipeline.tickstats import Counters
from subd.types import AudioChunk


class Ingest:
    def __init__(self, history: AudioHistory, clock: Clock, counters: Counters) -> None:
        self.history, self.clock, self.counters = history, clock, counters
        self.ingested = 0  # samples [0, ingested) are in

    def write(self, chunk: AudioChunk) -> None:
        t_ns = self.clock.now_ns()
        self.history.write(chunk.start_sample, chunk.samples)
        self.ingested = max(self.ingested, chunk.start_sample + chunk.n_samples)
        self.counters.stage["ingest"].add(self.clock.now_ns() - t_ns)
