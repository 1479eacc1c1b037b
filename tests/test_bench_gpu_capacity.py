"""``subd bench gpu --capacity``: the daemon-policy bench with a second model of a given size
and RANDOM weights, teacher-forced with the real model's tokens. Run on the CPU at a tiny size
(``test``: 2 layers, d = 64, but 128 mel bins and the large-v3 vocabulary)."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from subd.bench.gpu_capacity import SIZES, capacity_windows, random_model
from subd.models.batched_window import WindowJob
from subd.models.engine import DEFAULT_OPTIONS, FallbackPolicy
from subd.sources.decode import load_audio


def test_the_random_model_decodes_exactly_the_real_transcript(speech_clips):
    """Each window the real model decodes, the random one decodes too, step by step, with the
    real tokens forced: as many tokens, the same ones, whatever its weights would choose."""
    from subd.gpu.serve import load_batching_engine

    real = load_batching_engine("tiny.en", "cpu", "int8", 16).windows
    cap = capacity_windows(real, "test", "cpu", torch.float32, 16)
    assert cap.big.batched.model.dims == SIZES["test"]
    audio = [load_audio(c.path) for c in speech_clips[:3]]
    jobs = [WindowJob(a, None, FallbackPolicy((0.0,)), DEFAULT_OPTIONS) for a in audio]
    out = cap.transcribe(jobs)
    n_real = [len(r.decode.tokens) for r in out]
    assert all(n > 5 for n in n_real)
    assert cap.n_rows_replayed == 3
    assert cap.n_tokens_forced == sum(n_real)
    assert cap.n_short == 0
    # without the forcing the random model writes something else
    free = cap.big._decode(cap.big.batched.encode(cap.big.batched.features(
        *cap.big.batched.upload([audio[0]]), 3000)), [cap.big._row(None, (), 40, None)],
        DEFAULT_OPTIONS)
    assert list(free[0].tokens) != list(out[0].decode.tokens)


def test_random_weights_are_of_the_size_asked_for():
    from subd.models.loading import load_model

    dims = SIZES["large-v3-turbo"]  # the size (built on the GPU machine only)
    assert (dims.n_audio_layer, dims.n_text_layer, dims.n_audio_state, dims.n_mels,
            dims.n_vocab) == (32, 4, 1280, 128, 51866)
    small = random_model("test", load_model("tiny.en"))
    n_params = sum(p.numel() for p in small.model.parameters())
    assert small.name == "test (random weights)"
    assert all(torch.isfinite(p).all() for p in small.model.parameters())
    assert n_params > 51866 * 64  # the large vocabulary's embedding
    std = float(small.model.decoder.token_embedding.weight.detach().std())
    assert np.isclose(std, 0.02, atol=0.002)


def test_bench_gpu_capacity_mode_says_so_and_runs_the_daemon_policy(speech_clips, tmp_path):
    log = tmp_path / "bench.log"
    proc = subprocess.run(
        [sys.executable, "-m", "subd.cli", "bench", "gpu", "--policy", "daemon", "--device",
         "cpu", "--capacity", "test", "--model", "tiny.en", "--streams", "2",
         "--naive-streams", "1", "--duration-s", "4", "--ramp-s", "0.5", "--warm-s", "0",
         "--lead-s", "1.5",
         "--plot", "", "--log", str(log)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = log.read_text()
    assert out.count("CAPACITY MODE, RANDOM WEIGHTS") == 2  # at the start and with the result
    assert "randomly initialised test: 2 encoder layers, 2 decoder layers, d = 64, 128 mel" in out
    assert "4.0 s per trial after a 0.5 s ramp and 1.5 s of every channel's updates not counted" \
        in out
    trials = re.findall(r"^(batched|naive) N=\s*(\d+) .* words=\s*(\d+) .* failed=(\d+) "
                        r"full_span=(\d+)", out, re.M)
    assert [(t[0], t[1]) for t in trials] == [("batched", "2"), ("naive", "1")]
    assert all(t[3] == "0" for t in trials)  # no update failed
    assert sum(int(t[2]) for t in trials) > 0  # the real model's words came through
    m = re.search(r"random model: (\d+) windows decoded, (\d+) tokens teacher-forced, "
                  r"(\d+) rows stopped short", out)
    assert m and int(m[1]) > 0 and int(m[2]) > int(m[1]) and m[3] == "0"
    assert re.search(r"largest N served .*: batched \d+, naive \d+", out)
    # the default answers: the clips' transcript, every window found in the library
    assert "teacher-forced with the clips' transcript" in out
    m = re.search(r"transcript: (\d+) windows answered, (\d+) with sound not found in the "
                  r"library, (\d+) forced prefixes not the transcript's words", out)
    assert m and int(m[1]) > 0 and m[2] == "0" and m[3] == "0"


def test_windows_are_answered_from_the_clips_transcript():
    """Transcript decisions: a window is found in the library by its samples (also one that
    starts in the silence between clips or runs past the library's end), and answered with the
    forced prefix, then the transcript's words after it that the window holds in full, timed
    from the window's start."""
    from subd.bench.gpu_sim import load_library
    from subd.bench.gpu_transcript import LibraryIndex, TranscriptWindows, TranscriptWord
    from subd.gpu.serve import load_batching_engine

    real = load_batching_engine("tiny.en", "cpu", "int8", 4).windows
    library, clips = load_library(None)
    tok = real.tokenizer
    words = [TranscriptWord(s, e, t, tuple(tok.encode(t)), 0.9) for s, e, t in
             ((16_000, 24_000, " One"), (24_000, 30_000, " two,"), (32_000, 40_000, " three"),
              (40_000, 47_000, " four."))]
    tw = TranscriptWindows(real, library, words)
    index = LibraryIndex(library)
    n = len(library)
    for at in (12_345, len(clips[0]) + 100, n - 50_000):  # inside speech, in a gap, the wrap
        window = np.concatenate([library, library])[at : at + 160_000]
        assert index.find(window) == at
    assert index.find(np.zeros(8000, np.float32)) is None
    assert index.find(np.full(8000, 0.123, np.float32)) is None

    sp = tok.special
    policy, opts = FallbackPolicy((0.0,)), DEFAULT_OPTIONS
    res = tw.answer(WindowJob(library[8000:42_000].copy(), None, policy, opts))
    assert [w.text for w in res.words] == [" One", " two,", " three"]  # " four." not heard out
    assert [(w.start_s, w.end_s) for w in res.words] == [(0.5, 1.0), (1.0, 1.375), (1.5, 2.0)]
    assert res.decode.tokens[0] == sp.timestamp_begin and res.is_speech
    assert res.decode.tokens[-1] == sp.timestamp_begin + 100  # <|2.00|>
    prefix = (sp.timestamp_begin, *words[0].tokens, *words[1].tokens)
    res = tw.answer(WindowJob(library[8000:48_000].copy(), None, policy, opts, prefix))
    assert [w.text for w in res.words] == [" three", " four."] and res.prefix_used
    assert list(res.decode.tokens) == [*prefix, *words[2].tokens, *words[3].tokens,
                                       sp.timestamp_begin + 122]  # <|2.44|>: 47000 - 8000 samples
    res = tw.answer(WindowJob(np.zeros(8000, np.float32), None, policy, opts))
    assert not res.is_speech and res.words == () and res.decode.tokens == ()
    assert (tw.n_windows, tw.n_unfound, tw.n_prefix_mismatch) == (3, 0, 0)


def test_capacity_host_takes_its_decisions_from_the_transcript_or_the_model():
    """``--capacity-decisions``: the transcript (the default) answers every window without the
    real model; ``model`` keeps the real model's engine deciding; anything else is an error."""
    from subd.bench.gpu_capacity import CapacityHost
    from subd.bench.gpu_transcript import TranscriptWindows
    from subd.models.batched_window import WindowEngine

    by_model = CapacityHost("tiny.en", "cpu", "int8", 4, capacity="test", decisions="model")
    assert isinstance(by_model.engine.windows.real, WindowEngine)
    assert not by_model.engine.windows.full_timings
    by_text = CapacityHost("tiny.en", "cpu", "int8", 4, capacity="test")
    assert isinstance(by_text.engine.windows.real, TranscriptWindows)
    assert by_text.engine.windows.full_timings
    assert len(by_text.engine.windows.real.words) > 50  # the clips' words, in every round
    with pytest.raises(ValueError, match="capacity decisions"):
        CapacityHost("tiny.en", "cpu", "int8", 4, capacity="test", decisions="oracle")
