"""The daemon's streaming policy on the batched engine (CPU, float32: runs in CI).

Several channels' recognisers, each with its own state, decode through one
:class:`~subd.gpu.batcher.BatchingEngine`: their windows go to the GPU engine's code as one
batch. A viewer must see the same captions as with one single-stream engine per channel.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from batched_helpers import serial, stream_in_steps, together

from subd.gpu.batcher import BatchingEngine
from subd.models.batched_window import WindowEngine, WindowJob
from subd.models.engine import DEFAULT_OPTIONS, EncoderSpan, FallbackPolicy
from subd.recognise.streaming import StreamingRecognizer
from subd.sources.decode import load_audio
from subd.types import AudioChunk

GREEDY = FallbackPolicy(temperatures=(0.0,))
SPAN = EncoderSpan(2000, 4000)


@pytest.fixture(scope="module")
def clips(speech_clips) -> list[np.ndarray]:
    return [load_audio(c.path) for c in speech_clips[:3]]


@pytest.fixture(scope="module")
def windows(engine) -> WindowEngine:
    return WindowEngine(engine.loaded, "cpu", max_rows=4)


def test_windows_with_prompt_and_forced_prefix_equal_the_single_stream_engine(
        engine, windows, clips):
    tok = engine.tokenizer
    jobs = []
    for i, audio in enumerate(clips):
        cut = audio[: int(len(audio) * 0.8)]
        prefix: tuple[int, ...] = ()
        if i > 0:  # the first words, as committed by an earlier window, forced
            first = [w.text.strip() for w in engine.transcribe_window(cut[:48_000]).words[:3]]
            prefix = (tok.special.timestamp_begin, *tok.encode(" " + " ".join(first)))
        prompt = None if i == 1 else tok.encode(" Earlier words of the stream.")
        jobs.append(WindowJob(cut, prompt, GREEDY, dataclasses.replace(
            DEFAULT_OPTIONS, max_new_tokens=60), prefix, None, SPAN))
    got = windows.transcribe(jobs)
    for job, res in zip(jobs, got, strict=True):
        ref = engine.transcribe_window(job.audio, job.previous, job.policy, job.options,
                                       job.prefix, span=job.span)
        assert res.decode.tokens == ref.decode.tokens
        assert res.decode.capped == ref.decode.capped
        assert res.prefix_used == ref.prefix_used and res.is_speech == ref.is_speech
        assert [w.text for w in res.words] == [w.text for w in ref.words]
        for a, b in zip(res.words, ref.words, strict=True):
            assert abs(a.start_s - b.start_s) <= 0.021 and abs(a.end_s - b.end_s) <= 0.021
            assert np.isclose(a.probability, b.probability, atol=1e-4, equal_nan=True)
            # what Whisper weighed after each word (the deadline's comma rule reads it)
            assert a.mark_p is not None and np.allclose(a.mark_p, b.mark_p, atol=1e-4), (a, b)
    assert windows.n_decode_calls >= 1


def test_each_window_falls_back_under_its_own_policy(engine, windows, clips):
    """A channel decoding with temperature fallback (a stalled one; here a policy whose every
    reading fails) shares a batch with greedy channels: it goes again at the next temperature,
    and they keep the single-stream engine's greedy reading, whichever comes first."""
    failing = FallbackPolicy(temperatures=(0.0, 0.5), logprob_threshold=1.0,
                             no_speech_threshold=1.0)
    options = dataclasses.replace(DEFAULT_OPTIONS, max_new_tokens=60)
    audio = [c[: 4 * 16_000] for c in clips[:2]]
    for policies in ((failing, GREEDY), (GREEDY, failing)):
        jobs = [WindowJob(a, None, p, options, (), None, SPAN)
                for a, p in zip(audio, policies, strict=True)]
        got = windows.transcribe(jobs)
        for job, res in zip(jobs, got, strict=True):
            if job.policy is failing:
                assert res.decode.temperature == 0.5
            else:
                ref = engine.transcribe_window(job.audio, None, GREEDY, options, span=SPAN)
                assert res.decode.temperature == 0.0
                assert res.decode.tokens == ref.decode.tokens


def test_streaming_policy_batched_gives_every_channel_the_serial_captions(
        engine, windows, clips):
    opts = dict(min_update_ms=400, encoder_pad_ms=2000)
    one_by_one = [StreamingRecognizer(engine=engine, **opts) for _ in clips]
    want = stream_in_steps(one_by_one, clips, serial)
    shared = BatchingEngine(windows)
    batched = [StreamingRecognizer(engine=shared, **opts) for _ in clips]
    got = stream_in_steps(batched, clips, together(shared))
    assert got == want
    assert all(len(words) >= 5 for words in got), got
    # the channels' decodes went out together, not one by one
    assert shared.stats.mean_batch > 1.5
    shared.close()


def test_a_failing_channel_does_not_stall_or_change_the_others(engine, windows, clips):
    shared = BatchingEngine(windows)
    opts = dict(min_update_ms=400)
    good = [StreamingRecognizer(engine=shared, **opts) for _ in clips[:2]]
    ref = [StreamingRecognizer(engine=engine, **opts) for _ in clips[:2]]
    n = 3 * 16_000
    for rec, audio in zip(good + ref, clips[:2] * 2, strict=True):
        rec.accept(AudioChunk(0, audio[:n]))

    def broken():
        raise RuntimeError("channel c fell over")

    out = shared.run([good[0].update, broken, good[1].update])
    assert [ok for ok, _ in out] == [True, False, True]
    assert "fell over" in str(out[1][1])
    for (_, hyp), r in zip([out[0], out[2]], ref, strict=True):
        want = r.update()
        assert [w.text for w in hyp.committed + hyp.tentative] == \
            [w.text for w in want.committed + want.tentative]
    shared.close()


def test_one_dtw_sweep_gives_each_matrix_its_own_path():
    from subd.models.dtw import dtw_path, dtw_paths

    rng = np.random.default_rng(3)
    costs = [rng.standard_normal((n, m)) for n, m in ((5, 40), (12, 9), (1, 1), (30, 300))]
    costs.append(np.zeros((6, 6)))  # all ties: broken as the single sweep breaks them
    for (rows, cols), cost in zip(dtw_paths(costs), costs, strict=True):
        want_rows, want_cols = dtw_path(cost)
        assert rows.tolist() == want_rows.tolist() and cols.tolist() == want_cols.tolist()


def test_the_device_sweep_walks_the_numpy_sweeps_paths(monkeypatch):
    """dtw_paths_on_device (a GPU round's DTW, run here on the CPU's torch) gives the numpy
    sweep's paths, also where the matrices are cut into groups of DEVICE_CELLS cells."""
    import torch

    from subd.models import dtw

    rng = np.random.default_rng(7)
    costs = [rng.standard_normal((n, m)) for n, m in
             ((5, 40), (12, 9), (1, 1), (30, 300), (45, 350), (9, 1), (1, 9))]
    costs.append(np.zeros((6, 6)))  # all ties
    want = dtw.dtw_paths(costs)
    for cells in (dtw.DEVICE_CELLS, 400):  # one group; then a group a matrix or two
        monkeypatch.setattr(dtw, "DEVICE_CELLS", cells)
        got = dtw.dtw_paths_on_device([torch.from_numpy(c) for c in costs])
        assert [(r.tolist(), c.tolist()) for r, c in got] == \
            [(r.tolist(), c.tolist()) for r, c in want]
        # as the batched engine gives them: float32 alignment weights, the costs' negation
        weights = [torch.from_numpy(-c.astype(np.float32)) for c in costs]
        want32 = dtw.dtw_paths([-w.double().numpy() for w in weights])
        got = dtw.dtw_paths_on_device(weights, negate=True)
        assert [(r.tolist(), c.tolist()) for r, c in got] == \
            [(r.tolist(), c.tolist()) for r, c in want32]


def test_batched_alignment_matrices_equal_each_rows_own():
    """Rows of other lengths and frame counts in one batch (masked softmax, per-row
    normalisation and reflect padding); 3 frames or fewer: no median filter, as alone."""
    import torch

    from subd.models.alignment import alignment_matrices, alignment_matrix

    gen = torch.Generator().manual_seed(5)
    qk = torch.randn(6, 4, 20, 300, generator=gen) * 3
    frames, lengths, n_sots = [300, 1, 3, 4, 150, 57], [20, 5, 7, 12, 18, 9], [3, 2, 3, 3, 4, 3]
    got = alignment_matrices(qk, frames, lengths, n_sots)
    for r, mat in enumerate(got):
        want = alignment_matrix(qk[r, :, : lengths[r]], frames[r], n_sots[r])
        assert mat.shape == want.shape
        assert torch.allclose(mat, want, atol=1e-5), r


def test_dtw_rows_give_the_cell_by_cell_recurrences_path():
    """dtw_path sweeps rows with running sums and minima; the textbook recurrence (each cell
    from its diagonal, upper and left neighbour, ties in that order) walks the same path."""
    from subd.models.dtw import dtw_path

    def reference(cost):
        n, m = cost.shape
        acc = np.full((n + 1, m + 1), np.inf)
        acc[0, 0] = 0.0
        step = np.zeros((n + 1, m + 1), dtype=int)
        for i in range(1, n + 1):
            for j in range(1, m + 1):
                options = (acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1])
                step[i, j] = int(np.argmin(options))
                acc[i, j] = cost[i - 1, j - 1] + options[step[i, j]]
        i, j, cells = n, m, []
        while i > 0 and j > 0:
            cells.append((i - 1, j - 1))
            i, j = (i - 1, j - 1) if step[i, j] == 0 else (i - 1, j) if step[i, j] == 1 \
                else (i, j - 1)
        return cells[::-1]

    rng = np.random.default_rng(11)
    for n, m in ((1, 1), (1, 9), (9, 1), (4, 30), (12, 40), (25, 25)):
        cost = rng.standard_normal((n, m))
        rows, cols = dtw_path(cost)
        assert list(zip(rows.tolist(), cols.tolist(), strict=True)) == reference(cost), (n, m)
