"""Word error rate after Whisper's English text normaliser (benchmarks and tests share it).

The normaliser is OpenAI's (MIT), as packaged by ``whisper-normalizer``: the scoring that
published Whisper figures and issue reports use. It spells numbers as digits ("eight" and "8"
score alike), British spellings as American, contractions and titles out ("Mr." -> "mister"),
and drops marks and fillers ("um"): a recogniser is not charged for a way of writing a word.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def _english():
    from whisper_normalizer.english import EnglishTextNormalizer  # 60 KB of spellings, once

    return EnglishTextNormalizer()


def normalise(text: str) -> list[str]:
    """The words of ``text`` as Whisper's English normaliser writes them."""
    return _english()(text).split()


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
