"""A forced prefix of committed words is continued, not closed (DecodeOptions.continue_prefix).

The committed words are forced as the decode's prefix without their times, so a timestamp right
after them is the model's guess at a segment boundary it never decoded. On LibriSpeech
3436-172162-0000 ("The Adventure of the Cart. It befell in the month of May, ...") tiny.en
guessed the boundary at 2.0 s, the speech resuming at ~3.0 s, and int8 read the pause: "Hit B
cell". The streaming recogniser asks for the continuation where speech follows the committed
words; after them only silence, the decode may close the segment and end.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from batched_helpers import serial, stream_in_steps

from subd.models.batched_window import WindowEngine, WindowJob
from subd.models.engine import DEFAULT_OPTIONS, EncoderSpan, FallbackPolicy, WhisperEngine
from subd.recognise.streaming import StreamingRecognizer
from subd.sources.decode import load_audio

CLIP = Path(__file__).resolve().parent.parent / "data" / "speech" / "libri-3436-172162-0000.wav"
GREEDY = FallbackPolicy(temperatures=(0.0,))


@pytest.fixture(scope="module")
def audio() -> np.ndarray:
    return load_audio(str(CLIP))


@pytest.fixture(scope="module")
def int8() -> WhisperEngine:
    return WhisperEngine.load("tiny.en", quantize=True)  # the daemon's default on the CPU


def _cart(engine) -> tuple[int, ...]:
    tok = engine.tokenizer
    return (tok.special.timestamp_begin, *tok.encode(" the adventure of the cart."))


def _after_prefix(engine, audio: np.ndarray, cont: bool) -> tuple[list[int], list[str]]:
    """The tokens decoded after the committed "the adventure of the cart." (4.42 s heard)."""
    prefix = _cart(engine)
    opts = dataclasses.replace(DEFAULT_OPTIONS, continue_prefix=cont)
    res = engine.transcribe_window(audio[: int(4.42 * 16_000)], prefix=prefix, options=opts)
    new = list(res.decode.tokens[len(prefix):])
    ts = engine.tokenizer.special.timestamp_begin
    return new, engine.tokenizer.decode([t for t in new if t < ts]).split()


def test_the_decode_continues_the_committed_words(engine, int8, audio):
    ts = engine.tokenizer.special.timestamp_begin
    for eng in (engine, int8):
        cont, words = _after_prefix(eng, audio, True)
        assert cont[0] < ts
        assert words[0].startswith("It"), words
    closed, _ = _after_prefix(engine, audio, False)
    assert closed[0] >= ts  # left to itself, float32 closes the prefix's segment
    # int8 rounds as the CPU's int8 kernels do: on an Intel Xeon it closed the segment too and
    # read the pause as words; on an AMD EPYC it goes on with "It'll be fell" by itself
    closed, words = _after_prefix(int8, audio, False)
    if closed[0] >= ts:
        assert words[:3] == ["Hit", "B", "cell"]  # the pause read as words


def test_batched_windows_continue_the_prefix_as_the_single_stream_engine(engine, audio):
    windows = WindowEngine(engine.loaded, "cpu", max_rows=4)
    prefix = _cart(engine)
    span = EncoderSpan(2000, 4000)
    jobs = [WindowJob(audio[:n], None, GREEDY,
                      dataclasses.replace(DEFAULT_OPTIONS, max_new_tokens=40, continue_prefix=c),
                      p, None, span)
            for n, p, c in ((70_720, prefix, True), (70_720, prefix, False),
                            (96_000, prefix, True), (48_000, (), True))]
    for job, res in zip(jobs, windows.transcribe(jobs), strict=True):
        ref = engine.transcribe_window(job.audio, None, job.policy, job.options, job.prefix,
                                       span=job.span)
        assert res.decode.tokens == ref.decode.tokens
    ts = engine.tokenizer.special.timestamp_begin
    first = [windows.transcribe([j])[0].decode.tokens[len(prefix)] for j in jobs[:2]]
    assert first[0] < ts <= first[1]


class Recording:
    """The real engine; each decode's prefix and continue_prefix written down."""

    def __init__(self, engine: WhisperEngine) -> None:
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def transcribe_window(self, audio, previous_tokens=None, policy=None, options=DEFAULT_OPTIONS,
                          prefix=(), **kwargs):
        self.calls.append((bool(prefix), options.continue_prefix))
        return self.engine.transcribe_window(audio, previous_tokens, policy, options, prefix,
                                             **kwargs)


def test_the_recogniser_continues_the_prefix_only_where_speech_follows(engine, audio):
    rec = Recording(engine)
    quiet = np.zeros(3 * 16_000, np.float32)  # the clip's end, then silence
    words = stream_in_steps([StreamingRecognizer(engine=rec, min_update_ms=400)],
                            [np.concatenate([audio[: 9 * 16_000], quiet])], serial)[0]
    assert len(words) > 10
    assert (True, True) in rec.calls  # speech after the committed words: continued
    assert (True, False) in rec.calls  # silence after them: free to close and end
    assert (False, True) not in rec.calls  # nothing to continue without a prefix
