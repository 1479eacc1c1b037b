"""Word timings for a batch of live windows: ``WindowEngine``'s alignment pass.

One decoder pass with the alignment heads per chunk of rows, the matrices DTW walks computed on
the device for the whole chunk (models.alignment.alignment_matrices), the token probabilities in
one softmax a chunk, one read back of each, then one DTW sweep for every row and the
single-stream code's word grouping: the timings ``align_words`` gives row by row."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from subd.models.alignment import alignment_matrices, words_from_path
from subd.models.batched import read_back, to_host
from subd.models.dtw import dtw_paths, dtw_paths_on_device
from subd.models.words import word_splitter

ALIGN_ROWS = 16  # rows per alignment pass: its logits are [rows, tokens, vocabulary] floats
PROB_ROWS = 256  # token positions per softmax over the vocabulary (float32: 53 MB at 51 866)


def _token_probs(logits: torch.Tensor, at: torch.Tensor, pos: torch.Tensor,
                 want: torch.Tensor) -> torch.Tensor:
    """p(want[i] | row at[i], position pos[i]) from ``logits`` [rows, L, vocabulary], in
    slices of PROB_ROWS positions (a float32 softmax over the vocabulary each)."""
    out = [torch.softmax(logits[at[i : i + PROB_ROWS], pos[i : i + PROB_ROWS]].float(), -1)
           .gather(-1, want[i : i + PROB_ROWS, None])[:, 0]
           for i in range(0, want.shape[0], PROB_ROWS)]
    return torch.cat(out) if len(out) > 1 else out[0]


@torch.inference_mode()
def alignment_pass(windows: Any, feats: torch.Tensor, rows: list[int],
                   languages: list[str | None], texts: list[list[int]], frames: list[int],
                   known: list[int]) -> tuple[list, list]:
    """The word-timing pass's device work for the rows ``rows`` of ``feats`` (``texts[k]``
    non-empty): one decoder pass with the alignment heads per chunk of ``ALIGN_ROWS`` rows
    (padded with end-of-text after each row's own), the matrices DTW walks and the
    probabilities of the text tokens after each row's ``known`` prefix. Returns, per chunk,
    ``([(k, first, count)], probabilities)`` where a chunk has tokens to score, and each row's
    alignment matrix in row order (the DTW's costs are their negation), all still on the
    device."""
    sp = windows.tokenizer.special
    heads = windows.single.loaded.alignment_heads
    decoder = windows.batched.model.decoder
    dev_p, dev_w = [], []
    for lo in range(0, len(rows), ALIGN_ROWS):
        part = list(range(lo, min(lo + ALIGN_ROWS, len(rows))))
        seqs = [[*windows.sot(languages[k]), sp.no_timestamps, *texts[k], sp.eot] for k in part]
        width = max(len(q) for q in seqs)
        n_sots = [len(q) - len(texts[k]) - 2 for q, k in zip(seqs, part, strict=True)]
        # one host block: the token rows, then (row, position, token) of every text
        # token whose probability is wanted (those after the row's known prefix)
        wanted = [(r, k, min(known[k], len(texts[k]))) for r, k in enumerate(part)]
        picks = [(r, n_sots[r] + j, texts[k][j]) for r, k, first in wanted
                 for j in range(first, len(texts[k]))]
        host = torch.full((len(part) * width + 3 * len(picks),), sp.eot, dtype=torch.long)
        for r, q in enumerate(seqs):
            host[r * width : r * width + len(q)] = torch.tensor(q)
        if picks:
            host[len(part) * width :] = torch.tensor(picks, dtype=torch.long).t().reshape(-1)
        sub = windows.take_rows(feats, [rows[k] for k in part])
        dev = host.to(sub.device, non_blocking=True)
        cache = decoder.new_cache(sub)
        logits, qks = decoder(dev[: len(part) * width].view(len(part), width), cache,
                              return_cross_qk=heads)
        if picks:
            at, pos, want = dev[len(part) * width :].view(3, -1)
            dev_p.append(([(k, first, len(texts[k]) - first) for _, k, first in wanted],
                          _token_probs(logits, at, pos, want)))
        qk = torch.stack(qks, dim=1).float()  # [rows, heads, L, T]
        if not windows.batched.cuda:  # the reference computes it on the CPU
            qk = qk.cpu()
        n_frames = [max(1, min(frames[k] // 2, sub.shape[1])) for k in part]
        mats = alignment_matrices(qk, n_frames, [len(q) for q in seqs], n_sots)
        dev_w += mats
    return dev_p, dev_w


@torch.inference_mode()
def align_rows(windows: Any, feats: torch.Tensor, rows: list[int], jobs: list[Any],
               texts: list[list[int]], frames: list[int], known: list[int],
               marks_after: list[list] | None = None) -> dict[int, list]:
    """``align_words`` for many rows of a ``WindowEngine`` batch (``jobs``: its
    ``WindowJob`` list): :func:`alignment_pass` on the device, one read back of each kind,
    and one DTW sweep for all (models.dtw); the same timings as row by row.
    ``marks_after``: each row's ``DecodeResult.marks_after_text``, as ``align_words`` takes."""
    tok = windows.tokenizer
    todo = [k for k in range(len(rows)) if texts[k]]
    out: dict[int, list] = {rows[k]: [] for k in range(len(rows)) if not texts[k]}
    dev_p, dev_w = alignment_pass(windows, feats, [rows[k] for k in todo],
                                  [jobs[k].language for k in todo], [texts[k] for k in todo],
                                  [frames[k] for k in todo], [known[k] for k in todo])
    # one read per kind for every row (a read per row waited on the device twice a row)
    probs = {k: np.full(len(texts[k]), np.nan) for k in todo}
    for (spans, _), got in zip(dev_p, read_back([t for _, t in dev_p]), strict=True):
        at = 0
        for i, first, n in spans:
            probs[todo[i]][first:] = got[at : at + n]
            at += n
    # on a GPU the matrices stay there and only the DTW's steps come back
    paths = dtw_paths_on_device(dev_w, to_host, negate=True) if windows.batched.cuda \
        else dtw_paths(read_back([-m.double() for m in dev_w]))
    language = getattr(windows.single, "language", "en")
    for k, (text_idx, time_idx) in zip(todo, paths, strict=True):
        split = word_splitter(tok, jobs[k].language or language)
        out[rows[k]] = words_from_path(tok, texts[k], min(known[k], len(texts[k])),
                                       probs[k], text_idx, time_idx, split,
                                       marks_after[k] if marks_after else None)
    return out
