"""The network: word + char n-gram + pause + right-context + recogniser-evidence features,
a BiGRU, a CRF. The recogniser's own marks are inputs, not answers: the encoder sees them with
the words, pauses and how much context both the recogniser and the tagger had, and the CRF
learns when to keep, drop or change them.

Tags are punctuation x case (5 x 3 = 15 CRF states), decoded with Viterbi. The subtitle break
preference is a separate sigmoid head on the same encoder: it is a soft score (0..1) that the
layout stage weighs against line length, not a decision with its own sequence structure, and
folding it into the CRF would triple the state space for no gain in the marks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn
from torchcrf import CRF

from .features import (
    MAX_NGRAMS,
    N_PAUSE_BUCKETS,
    N_RC_BUCKETS,
    N_RCASE,
    N_REDGE,
    N_RMARK,
    N_SHAPE,
    NGRAM_BUCKETS,
)
from .text import CASES, PUNCTS

N_TAGS = len(PUNCTS) * len(CASES)


def tag_index(punct: str, case: str) -> int:
    return PUNCTS.index(punct) * len(CASES) + CASES.index(case)


def tag_parts(tag: int) -> tuple[str, str]:
    return PUNCTS[tag // len(CASES)], CASES[tag % len(CASES)]


@dataclass(frozen=True, slots=True)
class NetConfig:
    n_ids: int
    word_dim: int = 64
    char_dim: int = 32
    pause_dim: int = 8
    rc_dim: int = 8
    rmark_dim: int = 8
    rcase_dim: int = 4
    redge_dim: int = 4
    hidden: int = 96
    dropout: float = 0.2

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


class PunctNet(nn.Module):
    def __init__(self, cfg: NetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.word = nn.Embedding(cfg.n_ids, cfg.word_dim, padding_idx=0)
        self.chars = nn.EmbeddingBag(NGRAM_BUCKETS, cfg.char_dim, mode="mean", padding_idx=0)
        self.pause = nn.Embedding(N_PAUSE_BUCKETS, cfg.pause_dim)
        self.rc = nn.Embedding(N_RC_BUCKETS, cfg.rc_dim)
        self.rmark = nn.Embedding(N_RMARK, cfg.rmark_dim)
        self.rcase = nn.Embedding(N_RCASE, cfg.rcase_dim)
        self.redge = nn.Embedding(N_REDGE, cfg.redge_dim)
        d_in = (cfg.word_dim + cfg.char_dim + cfg.pause_dim + cfg.rc_dim + N_SHAPE
                + cfg.rmark_dim + cfg.rcase_dim + cfg.redge_dim)
        self.proj = nn.Linear(d_in, cfg.hidden)
        self.gru = nn.GRU(cfg.hidden, cfg.hidden, batch_first=True, bidirectional=True)
        self.drop = nn.Dropout(cfg.dropout)
        self.emit = nn.Linear(2 * cfg.hidden, N_TAGS)
        self.brk = nn.Linear(2 * cfg.hidden, 1)
        self.crf = CRF(N_TAGS, batch_first=True)

    def forward(self, x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """x: word [B,T], ngram [B,T,K], shape [B,T,S], pause [B,T], rc [B,T], evidence
        [B,T,3] (recogniser mark, case, edge ids).

        Returns emissions [B,T,N_TAGS] and break logits [B,T].
        """
        b, t = x["word"].shape
        chars = self.chars(x["ngram"].reshape(b * t, MAX_NGRAMS)).reshape(b, t, -1)
        ev = x["evidence"]
        h = torch.cat(
            [self.word(x["word"]), chars, self.pause(x["pause"]), self.rc(x["rc"]), x["shape"],
             self.rmark(ev[..., 0]), self.rcase(ev[..., 1]), self.redge(ev[..., 2])],
            dim=-1,
        )
        h = torch.relu(self.proj(self.drop(h)))
        h, _ = self.gru(h)
        h = self.drop(h)
        return self.emit(h), self.brk(h).squeeze(-1)

    def transitions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (
            self.crf.start_transitions.detach().numpy().astype(np.float64),
            self.crf.transitions.detach().numpy().astype(np.float64),
            self.crf.end_transitions.detach().numpy().astype(np.float64),
        )


def viterbi(
    emissions: np.ndarray,
    lengths: np.ndarray,
    start: np.ndarray,
    trans: np.ndarray,
    end: np.ndarray,
    allowed: np.ndarray | None = None,
) -> list[list[int]]:
    """Batched Viterbi over emissions [B,T,N] (same scores as torchcrf's decode).

    ``allowed`` [B,T,N] (bool) pins positions to a subset of tags: the streaming committer
    uses it to keep already-committed words fixed while it decodes the words after them.
    """
    n_batch, t_max, n_tags = emissions.shape
    em = emissions.astype(np.float64)
    if allowed is not None:
        em = np.where(allowed, em, -1e9)
    score = start[None, :] + em[:, 0]
    history = np.zeros((n_batch, max(t_max - 1, 0), n_tags), dtype=np.int64)
    for t in range(1, t_max):
        cand = score[:, :, None] + trans[None, :, :]  # [B, from, to]
        best = cand.argmax(axis=1)
        nxt = cand.max(axis=1) + em[:, t]
        active = (t < lengths)[:, None]
        score = np.where(active, nxt, score)
        history[:, t - 1] = best
    out: list[list[int]] = []
    for b in range(n_batch):
        n = int(lengths[b])
        if n == 0:
            out.append([])
            continue
        last = int((score[b] + end).argmax())
        path = [last]
        for t in range(n - 1, 0, -1):
            last = int(history[b, t - 1, last])
            path.append(last)
        out.append(path[::-1])
    return out
