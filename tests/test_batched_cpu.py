"""The batched engine on the CPU gives the single-stream engine's transcripts, row by row."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from subd.kernels.mel import log_mel, pad_or_trim_frames
from subd.kernels.mel_gpu import log_mel_batch, n_frames_for
from subd.models.batched import BatchedEngine, EngineConfig
from subd.models.decoding import DecodeOptions
from subd.sources.decode import load_audio

OPTIONS = DecodeOptions(max_new_tokens=96)  # both engines: the clips need < 60 tokens


@pytest.fixture(scope="module")
def clips(speech_clips) -> list[np.ndarray]:
    return [load_audio(c.path) for c in speech_clips]


@pytest.fixture(scope="module")
def batched(engine) -> BatchedEngine:
    return BatchedEngine(engine.loaded, device="cpu", config=EngineConfig(max_rows=3))


def _reference(engine, audio, previous=None):
    return engine.decode_with_fallback(engine.encode(engine.features(audio)), previous,
                                       options=OPTIONS)


def test_batched_front_end_equals_reference_per_row(clips):
    rows = clips[:3]
    width = max(len(c) for c in rows) + 1234
    audio = torch.randn(len(rows), width)  # junk past each row's end must not leak in
    for i, c in enumerate(rows):
        audio[i, : len(c)] = torch.from_numpy(c)
    lengths = torch.tensor([len(c) for c in rows])
    for n_frames in (3000, 400):
        mel = log_mel_batch(audio, lengths, n_frames)
        for i, c in enumerate(rows):
            ref = pad_or_trim_frames(log_mel(c), n_frames)
            assert float((mel[i] - ref).abs().max()) < 1e-5
    assert n_frames_for(16_000) == log_mel(np.zeros(16_000, np.float32)).shape[-1]


def test_batch_of_three_gives_the_same_transcripts(engine, batched, clips):
    rows = clips[:3]
    got = batched.transcribe(rows, options=OPTIONS)
    for audio, result in zip(rows, got, strict=True):
        ref = _reference(engine, audio)
        assert result.tokens == ref.tokens
        assert result.no_speech_prob == pytest.approx(ref.no_speech_prob, abs=1e-4)
        assert result.avg_logprob == pytest.approx(ref.avg_logprob, abs=1e-3)
    assert "dashwood" in batched.text(got[0]).lower()


def test_rows_with_different_prompts_decode_like_single_streams(engine, batched, clips):
    ts = engine.tokenizer.special.timestamp_begin
    previous = list(_reference(engine, clips[0]).text_tokens(ts))
    rows, prompts = clips[3:5], [previous, None]
    got = batched.transcribe(rows, prompts, options=OPTIONS)
    for audio, prompt, result in zip(rows, prompts, got, strict=True):
        assert result.tokens == _reference(engine, audio, prompt).tokens


def test_a_failed_row_is_decoded_again_at_the_next_temperature_with_capped_tokens(batched,
                                                                                  clips):
    """The batched fallback: a row whose reading fails (here every reading: the average
    log-probability must reach +1) goes again at the next temperature, a retry's tokens capped
    at ``max_fallback_tokens``; a row that passes is not decoded again."""
    from subd.models.engine import FallbackPolicy

    strict = FallbackPolicy(temperatures=(0.0, 0.5), logprob_threshold=1.0,
                            no_speech_threshold=1.0, max_fallback_tokens=6)
    got = batched.transcribe(clips[:2], policy=strict, options=OPTIONS)
    assert [r.temperature for r in got] == [0.5, 0.5]
    assert all(len(r.tokens) <= 6 for r in got)
    lenient = FallbackPolicy(temperatures=(0.0, 0.5), logprob_threshold=-100.0)
    got = batched.transcribe(clips[:2], policy=lenient, options=OPTIONS)
    assert [r.temperature for r in got] == [0.0, 0.0]
    assert all(len(r.tokens) > 6 for r in got)
