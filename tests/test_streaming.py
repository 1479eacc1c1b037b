"""The streaming recogniser: committed words never change, WER close to offline, bounded window."""

from __future__ import annotations

import numpy as np
import pytest

from subd.audio import load_audio
from subd.errors import ConfigError
from subd.streaming import StreamingConfig, StreamingRecognizer
from subd.types import SAMPLE_RATE_HZ, AudioChunk
from tests.conftest import normalise, word_errors

STEP_SAMPLES = SAMPLE_RATE_HZ // 2  # an update every 0.5 s of audio: deterministic cadence


def stream(rec: StreamingRecognizer, audio: np.ndarray, step: int = STEP_SAMPLES):
    """Feed ``audio`` in steps, update after each; return (all committed words, updates)."""
    committed, updates = [], []
    for start in range(0, len(audio), step):
        rec.accept(AudioChunk(start, audio[start : start + step]))
        hyp = rec.update()
        updates.append(hyp)
        committed.extend(hyp.committed)
        window_s = (rec.audio.end_sample - rec.state.window_start) / SAMPLE_RATE_HZ
        assert window_s <= 30.0
    final = rec.finish()
    updates.append(final)
    committed.extend(final.committed)
    return committed, updates


@pytest.fixture(scope="module")
def int8_engine():
    from subd.models.engine import WhisperEngine

    return WhisperEngine.load("tiny.en", quantize=True)


@pytest.fixture(scope="module")
def joined(speech_clips):
    parts, ref = [], []
    for clip in speech_clips:
        parts += [load_audio(clip.path), np.zeros(12_000, np.float32)]
        ref += clip.transcript.split()
    return np.concatenate(parts), ref


def test_streaming_wer_within_1_5_points_of_offline(int8_engine, joined):
    from subd.transcriber import Transcriber

    audio, ref = joined
    offline_words = [
        w.text for s in Transcriber(int8_engine).transcribe_blocks([audio]) for w in s.words
    ]
    offline = word_errors(ref, normalise(" ".join(offline_words))) / len(ref)
    committed, _ = stream(StreamingRecognizer(engine=int8_engine), audio)
    streamed = word_errors(ref, normalise(" ".join(w.text for w in committed))) / len(ref)
    print(f"WER offline {offline:.1%}, streaming {streamed:.1%}")
    assert streamed <= offline + 0.015


def test_committed_words_are_final_and_ordered(int8_engine, joined):
    audio, _ = joined
    committed, updates = stream(StreamingRecognizer(engine=int8_engine), audio)
    starts = [w.start_ns for w in committed]
    assert starts == sorted(starts)
    assert all(w.start_ns <= w.end_ns for w in committed)
    for a, b in zip(committed, committed[1:], strict=False):
        assert a.end_ns <= b.start_ns  # no overlap: nothing committed twice
    # tentative words always lie after everything committed so far
    seen_end = 0
    for hyp in updates:
        if hyp.committed:
            seen_end = hyp.committed[-1].end_ns
        assert all(w.end_ns >= seen_end for w in hyp.tentative)


def test_long_speech_without_pauses_never_overflows_the_window(int8_engine, speech_clips):
    """40 s of speech with no pause: forced commits keep the window under 30 s, no words lost."""
    clips = [load_audio(c.path) for c in speech_clips]
    audio = np.concatenate(clips + clips)[: 40 * SAMPLE_RATE_HZ]
    ref = " ".join(c.transcript for c in speech_clips).split() * 2
    rec = StreamingRecognizer(engine=int8_engine, max_window_ms=12000, trim_after_ms=20000)
    committed, _ = stream(rec, audio, step=SAMPLE_RATE_HZ)
    hyp = normalise(" ".join(w.text for w in committed))
    # 40 s covers about 1.6 passes of the clips; compare against the matching prefix
    ref = ref[: len(hyp) + 3]
    assert word_errors(ref, hyp) / len(ref) < 0.2


def test_hours_of_silence_cost_no_decodes(int8_engine):
    rec = StreamingRecognizer(engine=int8_engine)
    step = SAMPLE_RATE_HZ
    zeros = np.zeros(step, np.float32)
    for k in range(600):  # 10 minutes
        rec.accept(AudioChunk(k * step, zeros))
        hyp = rec.update()
        assert hyp.committed == () and hyp.tentative == ()
    assert rec.n_decodes == 0
    assert rec.audio.end_sample - rec.state.window_start <= 30 * SAMPLE_RATE_HZ


def test_config_is_validated():
    with pytest.raises(ConfigError, match=r"\[recognizer\] max_window_ms"):
        StreamingConfig(max_window_ms=40000)
