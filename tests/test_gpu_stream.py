"""The continuous-batching simulation behind ``subd bench gpu``, on the CPU with a fake clock:
every stream gets captions of its real speech, and nothing is late or dropped when the GPU
(here the CPU, given all the time it needs) keeps up."""

from __future__ import annotations

import numpy as np

from subd.bench.gpu import _options, _policy
from subd.bench.gpu_sim import SimConfig
from subd.bench.gpu_stream import StreamServer, simulate_stream
from subd.models.batched import BatchedEngine, EngineConfig
from subd.sources.decode import load_audio


class StepClock:
    """Fake time: every reading is 50 ms after the previous one, however long work takes."""

    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        self.now_ns += 50_000_000
        return self.now_ns


def test_every_stream_gets_captions_of_its_speech_and_none_is_late(engine, speech_clips):
    library = np.concatenate([load_audio(c.path) for c in speech_clips[:2]])
    batched = BatchedEngine(engine.loaded, device="cpu",
                            config=EngineConfig(max_rows=2, max_new_tokens=32, chunk_steps=8))
    server = StreamServer(batched, library, 2, window_s=3.0, n_frames=400, policy=_policy(),
                          options=_options())
    cfg = SimConfig(n_streams=2, duration_s=3.0, ramp_s=0.2, window_s=3.0,
                    first_budget_ms=60_000, budget_ms=60_000, max_rows=2)
    res = simulate_stream(cfg, len(library), server, clock_ns=StepClock())
    assert res.n_first_captions == 2 and res.served
    assert res.n_updates >= 4 and res.n_misses == 0 and res.n_degraded == 0
    words = set(" ".join(res.sample_texts).lower().split())
    assert words & {"the", "and", "to", "of", "was", "his", "he", "her", "mr.", "dashwood"}
