"""On an NVIDIA GPU: the batched window engine keeps Whisper's own marks (skips without CUDA).

On the H200 the daemon's live decodes on CUDA carried no commas at D = 2 s ("excuse me I will
say nothing of my antecedents nor of"), where offline on the same GPU and every CPU path write
them (docs/MEASUREMENTS.md, "Live captions against the same engine offline"). Here one window of
LibriSpeech speech, with the previous text as prompt and a forced prefix as the live policy sends
them, on the full input and on the cut span, with CUDA graphs and without: the words, marks
included, must be the single-stream engine's on the CPU (float32 both).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CLIP = Path(__file__).resolve().parents[1] / "data" / "speech" / "libri-2412-153948-0000.wav"
PROMPT = " And Mr. John Dashwood had then leisure to consider how much there might be."


@pytest.fixture(scope="module")
def engines():
    from subd.gpu.serve import load_weights
    from subd.models.batched_window import WindowEngine
    from subd.models.engine import WhisperEngine

    loaded = load_weights(os.environ.get("SUBD_GPU_TEST_MODEL", "tiny.en"))
    cpu = WhisperEngine(loaded)  # float32, not quantised
    gpu = WindowEngine(loaded, "cuda", torch.float32, max_rows=4)
    gpu.warm()
    return cpu, gpu


@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("seconds", [7, 10, 0])
@pytest.mark.parametrize("prefix_text", ["", " If the reader will excuse"])
@pytest.mark.parametrize("pad_ms", [0, 2000])
def test_windows_on_cuda_keep_the_cpu_engines_words_and_marks(engines, graphs, seconds,
                                                              prefix_text, pad_ms):
    from subd.models.batched_window import WindowJob
    from subd.models.engine import DEFAULT_OPTIONS, DEFAULT_POLICY, EncoderSpan

    cpu, gpu = engines
    gpu.batched.config = dataclasses.replace(gpu.batched.config, graphs=graphs)
    audio, _ = sf.read(CLIP, dtype="float32")
    window = audio[: seconds * 16000] if seconds else audio
    tok = gpu.tokenizer
    prompt = tok.encode(PROMPT)
    prefix = (tok.special.timestamp_begin, *tok.encode(prefix_text)) if prefix_text else ()
    span = EncoderSpan(pad_ms, 4000)
    want = cpu.transcribe_window(window, prompt, DEFAULT_POLICY, DEFAULT_OPTIONS, prefix, None,
                                 span)
    got = gpu.transcribe([WindowJob(window, prompt, DEFAULT_POLICY, DEFAULT_OPTIONS, prefix,
                                    None, span)])[0]
    assert [w.text for w in got.words] == [w.text for w in want.words]
    # the marks Whisper weighed after each word, which the punctuation reads at a deadline
    for a, b in zip(got.words, want.words, strict=True):
        assert a.mark_p is not None and b.mark_p is not None, (a, b)
        assert np.allclose(a.mark_p, b.mark_p, atol=2e-3), (a, b)
    if seconds == 0:  # the whole sentence: Whisper's commas are in it
        assert sum(w.text.endswith(",") for w in want.words) >= 2
