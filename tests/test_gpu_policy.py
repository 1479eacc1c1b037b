"""The daemon's recogniser on CUDA: every channel's captions as on the CPU (skips without CUDA).

Four channels stream four LibriVox clips through one batched engine on the GPU; the reference
is the single-stream engine on the CPU in float32, one channel at a time. In float32 on the GPU
the captions are the same; in float16 a near-tie between two tokens can go the other way: the
words that differ are counted and bounded, and the figure is printed (it is what the bench
reports as the fp16 difference).
"""

from __future__ import annotations

import os

import pytest
import torch
from batched_helpers import clip_files, read_wav, serial, stream_in_steps, together

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

MODEL = os.environ.get("SUBD_GPU_TEST_MODEL", "tiny.en")  # a portable copy on the GPU machine
OPTS = dict(min_update_ms=400, encoder_pad_ms=2000)


@pytest.fixture(scope="module")
def setup():
    from subd.gpu.serve import load_weights
    from subd.models.engine import WhisperEngine
    from subd.recognise.streaming import StreamingRecognizer

    files = clip_files()[:4]
    if len(files) < 4:
        pytest.skip("needs 4 LibriVox clips")
    loaded = load_weights(MODEL)
    audios = [read_wav(f) for f in files]
    cpu = WhisperEngine(loaded, threads=4)
    want = stream_in_steps([StreamingRecognizer(engine=cpu, **OPTS) for _ in audios], audios,
                           serial)
    return loaded, audios, want


def _on_cuda(loaded, audios, dtype):
    from subd.gpu.batcher import BatchingEngine
    from subd.models.batched_window import WindowEngine
    from subd.recognise.streaming import StreamingRecognizer

    shared = BatchingEngine(WindowEngine(loaded, "cuda", dtype, max_rows=8))
    got = stream_in_steps([StreamingRecognizer(engine=shared, **OPTS) for _ in audios],
                          audios, together(shared))
    shared.close()
    return got, shared.stats


def test_four_channels_fp32_on_cuda_give_the_cpu_captions(setup):
    loaded, audios, want = setup
    got, stats = _on_cuda(loaded, audios, torch.float32)
    assert got == want
    assert stats.mean_batch > 2


def test_four_channels_fp16_differ_from_the_cpu_in_few_words(setup):
    from subd.scoring.wer import normalise, wer

    loaded, audios, want = setup
    got, _ = _on_cuda(loaded, audios, torch.float16)
    rates = [wer(normalise(" ".join(w)), normalise(" ".join(g)))
             for w, g in zip(want, got, strict=True)]
    print(f"fp16 vs CPU fp32, word difference per channel: {rates}")
    assert max(rates) <= 0.1
