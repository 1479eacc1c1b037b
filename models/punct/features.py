"""Per-word input features of the punctuation tagger.

A word is described by: its vocabulary id (or a hashed out-of-vocabulary bucket), hashed
character n-grams (prefixes, suffixes, inner trigrams: they carry "-ly", "wh-", digits,
apostrophes for words never seen), a few shape flags, the pause after it (bucketed) and how
many words of right context the tagger can see after it (bucketed, "complete" = end of stream),
and the recogniser's own evidence: the mark it wrote after the word, the word's case as it wrote
it, and how many words it had decoded after the word (0 = window / commit-batch edge, where its
marks are least reliable). Each evidence id has an "unknown" value 0 so plain text works too.
Hashes are CRC-32 so that ids are stable across processes (Python's ``hash`` is salted).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .text import CASES, PUNCTS, RecogniserMark

PAD = 0
OOV_BUCKETS = 1024
NGRAM_BUCKETS = 16384
MAX_NGRAMS = 14
N_SHAPE = 6
# Pause buckets (ms). Bucket 0 = unknown pause (text without timings).
PAUSE_EDGES_MS = (40.0, 100.0, 180.0, 300.0, 450.0, 700.0, 1000.0, 1600.0)
N_PAUSE_BUCKETS = len(PAUSE_EDGES_MS) + 2
RIGHT_CONTEXT_CAP = 8  # right-context bucket 0..8; 8 also means "complete"
N_RC_BUCKETS = RIGHT_CONTEXT_CAP + 1
# Recogniser evidence ids [T, 3]: mark (0 unknown, 1+PUNCTS index), case (0 unknown, 1+CASES
# index), words decoded after the word (0 unknown, 1 + min(n, EDGE_CAP)).
N_RMARK = len(PUNCTS) + 1
N_RCASE = len(CASES) + 1
EDGE_CAP = 2
N_REDGE = EDGE_CAP + 2
N_EVIDENCE = 3


def evidence_row(mark: RecogniserMark | None) -> tuple[int, int, int]:
    """Ids of one word's recogniser evidence; (0, 0, 0) when there is none."""
    if mark is None:
        return (0, 0, 0)
    edge = 0 if mark.n_after is None else 1 + min(max(mark.n_after, 0), EDGE_CAP)
    return (1 + PUNCTS.index(mark.punct), 1 + CASES.index(mark.case), edge)


def evidence_ids(marks: Sequence[RecogniserMark | None] | None, n: int) -> np.ndarray:
    """Evidence ids [n, 3] of a sequence (None, or a None entry = recogniser marks unknown)."""
    out = np.zeros((n, N_EVIDENCE), dtype=np.int64)
    if marks is not None:
        for i, m in enumerate(marks):
            out[i] = evidence_row(m)
    return out


def _h(text: str, buckets: int) -> int:
    return zlib.crc32(text.encode("utf-8")) % buckets


def char_ngrams(word: str) -> list[int]:
    """Hashed n-gram bucket ids (1..NGRAM_BUCKETS-1) of ``word``; at most MAX_NGRAMS."""
    w = "<" + word + ">"
    grams = [w[: i + 1] for i in range(1, 4)] + [w[-i - 1 :] for i in range(1, 5)]
    inner = [w[i : i + 3] for i in range(1, max(1, len(w) - 3))]
    step = max(1, len(inner) // (MAX_NGRAMS - len(grams)))
    grams += inner[::step]
    ids = [1 + _h(g, NGRAM_BUCKETS - 1) for g in dict.fromkeys(grams)]
    return ids[:MAX_NGRAMS]


def shape_of(word: str) -> tuple[float, ...]:
    return (
        float(any(ch.isdigit() for ch in word)),
        float(word.isdigit()),
        float("'" in word),
        float(any(ord(ch) > 127 for ch in word)),
        float("-" in word),
        min(len(word), 20) / 10.0,
    )


def pause_bucket(pause_ms: float | None) -> int:
    if pause_ms is None or not np.isfinite(pause_ms) or pause_ms < 0:
        return 0
    return 1 + int(np.searchsorted(PAUSE_EDGES_MS, pause_ms, side="right"))


def pause_buckets(pauses_ms: Sequence[float | None] | None, n: int) -> np.ndarray:
    """pause_bucket over a sequence (None or NaN = unknown), vectorised."""
    if pauses_ms is None:
        return np.zeros(n, dtype=np.int64)
    arr = np.array([np.nan if p is None else p for p in pauses_ms], dtype=np.float64)
    out = 1 + np.searchsorted(PAUSE_EDGES_MS, np.nan_to_num(arr, nan=0.0), side="right")
    out[~np.isfinite(arr) | (arr < 0)] = 0
    return out.astype(np.int64)


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """Word -> id. Ids 1..n are known words; n+1..n+OOV_BUCKETS hash unseen ones; 0 pads."""

    words: tuple[str, ...]

    @property
    def n_ids(self) -> int:
        return len(self.words) + 1 + OOV_BUCKETS

    def build_index(self) -> dict[str, int]:
        return {w: i + 1 for i, w in enumerate(self.words)}


class Featuriser:
    """Turns recogniser-view words into id arrays; caches each word's static features."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self._index = vocab.build_index()
        self._oov_base = len(vocab.words) + 1
        self.word_static = lru_cache(maxsize=200_000)(self._word_static)

    def oov_id(self, word: str) -> int:
        return self._oov_base + _h(word, OOV_BUCKETS)

    def _word_static(self, word: str) -> tuple[int, tuple[int, ...], tuple[float, ...]]:
        wid = self._index.get(word)
        if wid is None:
            wid = self.oov_id(word)
        return wid, tuple(char_ngrams(word)), shape_of(word)

    def encode(
        self,
        words: Sequence[str],
        pauses_ms: Sequence[float | None] | None,
        n_right: Sequence[int],
        evidence: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        """Arrays for one sequence: word [T], ngram [T,K], shape [T,S], pause [T], rc [T],
        evidence [T,3] (``evidence_ids``; None = no recogniser marks)."""
        n = len(words)
        word_ids = np.zeros(n, dtype=np.int64)
        ngrams = np.zeros((n, MAX_NGRAMS), dtype=np.int64)
        shape = np.zeros((n, N_SHAPE), dtype=np.float32)
        for i, w in enumerate(words):
            wid, grams, shp = self.word_static(w)
            word_ids[i] = wid
            ngrams[i, : len(grams)] = grams
            shape[i] = shp
        pause = pause_buckets(pauses_ms, n)
        rc = np.minimum(np.asarray(n_right, dtype=np.int64), RIGHT_CONTEXT_CAP)
        if evidence is None:
            evidence = np.zeros((n, N_EVIDENCE), dtype=np.int64)
        elif evidence.shape != (n, N_EVIDENCE):
            raise ValueError(f"evidence has shape {evidence.shape}, want {(n, N_EVIDENCE)}")
        return {"word": word_ids, "ngram": ngrams, "shape": shape, "pause": pause, "rc": rc,
                "evidence": evidence}


def right_context(n_words: int, complete: bool) -> np.ndarray:
    """Words of right context after each position (capped); all "complete" at stream end."""
    if complete:
        return np.full(n_words, RIGHT_CONTEXT_CAP, dtype=np.int64)
    return np.minimum(np.arange(n_words - 1, -1, -1, dtype=np.int64), RIGHT_CONTEXT_CAP)


def stack(batch: Sequence[dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Pad sequences to one length; returns arrays [B, T, ...] and the mask [B, T]."""
    t_max = max(len(b["word"]) for b in batch)
    out: dict[str, np.ndarray] = {}
    for key in batch[0]:
        first = batch[0][key]
        arr = np.zeros((len(batch), t_max, *first.shape[1:]), dtype=first.dtype)
        for i, b in enumerate(batch):
            arr[i, : len(b[key])] = b[key]
        out[key] = arr
    mask = np.zeros((len(batch), t_max), dtype=bool)
    for i, b in enumerate(batch):
        mask[i, : len(b["word"])] = True
    return out, mask
