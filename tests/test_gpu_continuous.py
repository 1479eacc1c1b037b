"""Continuous batching (rows join and leave a running batch) gives single-stream transcripts.

Runs on the CPU (eager steps) with the packaged tiny.en; tests/test_gpu.py runs the same with
CUDA graphs on a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from subd.kernels.mel_gpu import log_mel_batch
from subd.models.batched import BatchedEngine, EngineConfig
from subd.models.batched_continuous import ContinuousDecoder, Request
from subd.models.decoding import DecodeOptions
from subd.models.engine import FallbackPolicy
from subd.sources.decode import load_audio

OPTIONS = DecodeOptions(max_new_tokens=96)
N_FRAMES = 3000  # the single-stream engine's full window, so tokens compare exactly


@pytest.fixture(scope="module")
def clips(speech_clips) -> list[np.ndarray]:
    return [load_audio(c.path) for c in speech_clips]


def _encode(engine: BatchedEngine, rows: list[np.ndarray]) -> torch.Tensor:
    audio, lengths = engine.upload(rows)
    with torch.inference_mode():
        return engine.encode(log_mel_batch(audio, lengths, N_FRAMES, engine.n_mels))


def test_rows_joining_a_running_batch_decode_like_single_streams(engine, clips):
    batched = BatchedEngine(engine.loaded, device="cpu",
                            config=EngineConfig(max_rows=4, chunk_steps=4))
    dec = ContinuousDecoder(batched, FallbackPolicy(), OPTIONS)
    dec.admit(_encode(batched, clips[:2]), [Request(0), Request(1)])
    got = {}
    for _ in range(3):  # two rows are mid-sentence when the third joins
        got.update({f.key: f.result for f in dec.iterate()})
    assert dec.n_busy == 2 and not got
    dec.admit(_encode(batched, clips[2:3]), [Request(2)])
    got.update({f.key: f.result for f in dec.drain()})
    assert sorted(got) == [0, 1, 2] and dec.n_free == 4
    for i in range(3):
        ref = engine.decode_with_fallback(engine.encode(engine.features(clips[i])), None,
                                          options=OPTIONS)
        assert got[i].tokens == ref.tokens
        assert got[i].avg_logprob == pytest.approx(ref.avg_logprob, abs=1e-3)
    assert "dashwood" in batched.text(got[0]).lower()


def test_a_freed_slot_takes_a_new_stream_and_a_full_batch_refuses_more(engine, clips):
    batched = BatchedEngine(engine.loaded, device="cpu",
                            config=EngineConfig(max_rows=1, chunk_steps=8))
    dec = ContinuousDecoder(batched, FallbackPolicy(), OPTIONS)
    feats = _encode(batched, clips[3:5])
    dec.admit(feats[:1], [Request("a")])
    with pytest.raises(ValueError):
        dec.admit(feats[1:], [Request("b")])
    first = dec.drain()
    dec.admit(feats[1:], [Request("b")])
    second = dec.drain()
    assert [f.key for f in first] == ["a"] and [f.key for f in second] == ["b"]
    for f, clip in zip(first + second, clips[3:5], strict=True):
        ref = engine.decode_with_fallback(engine.encode(engine.features(clip)), None,
                                          options=OPTIONS)
        assert f.result.tokens == ref.tokens


def _failing_decoder(engine) -> tuple[BatchedEngine, ContinuousDecoder]:
    """Two rows; an impossible log-probability threshold makes every greedy result "bad": each
    row is re-decoded at the next temperature, and the last attempt is returned."""
    batched = BatchedEngine(engine.loaded, device="cpu",
                            config=EngineConfig(max_rows=2, chunk_steps=8))
    policy = FallbackPolicy(temperatures=(0.0, 0.2), logprob_threshold=0.0,
                            no_speech_threshold=1.0, max_fallback_tokens=16)
    return batched, ContinuousDecoder(batched, policy, OPTIONS)


def test_a_row_that_fails_greedy_decoding_is_retried_in_its_own_slot(engine, clips):
    batched, dec = _failing_decoder(engine)
    dec.admit(_encode(batched, clips[:2]), [Request(0), Request(1)])
    out = dec.drain()
    assert sorted(f.key for f in out) == [0, 1]
    assert all(f.n_attempts == 2 and f.result.temperature == 0.2 for f in out)
    assert all(0 < len(f.result.tokens) <= 16 for f in out)


def test_rows_moved_down_when_others_leave_still_decode_like_single_streams(engine, clips):
    batched = BatchedEngine(engine.loaded, device="cpu",
                            config=EngineConfig(max_rows=3, chunk_steps=4))
    dec = ContinuousDecoder(batched, FallbackPolicy(), OPTIONS)
    order = sorted(range(len(clips)), key=lambda i: len(clips[i]))
    rows = [order[0], order[-1], order[-2]]  # the shortest leaves first: the others move down
    dec.admit(_encode(batched, [clips[i] for i in rows]), [Request(i) for i in rows])
    got = {f.key: f.result for f in dec.drain()}
    assert dec.n_moved >= 1 and sorted(got) == sorted(rows) and dec.n_free == 3
    for i in rows:
        ref = engine.decode_with_fallback(engine.encode(engine.features(clips[i])), None,
                                          options=OPTIONS)
        assert got[i].tokens == ref.tokens


def test_a_greedy_only_request_that_fails_the_checks_comes_back_unaccepted(engine, clips):
    batched, dec = _failing_decoder(engine)
    dec.admit(_encode(batched, clips[:2]), [Request(0, max_attempts=1), Request(1)])
    out = {f.key: f for f in dec.drain()}
    assert out[0].n_attempts == 1 and not out[0].accepted and out[0].result.temperature == 0.0
    assert out[1].n_attempts == 2 and not out[1].accepted  # the last attempt fails too
