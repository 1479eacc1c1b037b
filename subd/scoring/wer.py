"""Word error rate with a small English text normaliser (benchmarks and tests share it)."""

from __future__ import annotations

import re

import numpy as np

_ABBREVIATIONS = {"mr": "mister", "mrs": "missus", "dr": "doctor", "st": "saint"}


def normalise(text: str) -> list[str]:
    """Lower case, no punctuation, hyphenated words split, common title abbreviations spelt out."""
    text = re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " "))
    return [_ABBREVIATIONS.get(w, w) for w in text.split()]


def word_errors(ref: list[str], hyp: list[str]) -> int:
    """Levenshtein distance between word lists (substitutions + deletions + insertions)."""
    d = np.arange(len(hyp) + 1)
    for i, r in enumerate(ref, 1):
        prev, d = d, np.empty_like(d)
        d[0] = i
        for j, h in enumerate(hyp, 1):
            d[j] = min(prev[j] + 1, d[j - 1] + 1, prev[j - 1] + (r != h))
    return int(d[-1])


def wer(ref: list[str], hyp: list[str]) -> float:
    return word_errors(ref, hyp) / max(1, len(ref))
