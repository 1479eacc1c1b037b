"""The recogniser's view of training text: words, pauses and cut right context.

Pauses after a word are sampled conditionally on the true mark (long after '.', shorter after
',', mostly short otherwise, with hesitations), so the model learns how much a pause says and
not more. Windows end either at the end of a sentence with the stream complete, or at a random
word with the right context cut, so the model learns what a word with no right context looks
like (and the streaming committer waits for context instead of trusting it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from .text import SENTENCE_END, LabelledWord, label_text, number_to_digits

# (probability, low ms, high ms) mixtures of the pause after a word, by its true mark.
_PAUSES: dict[str, tuple[tuple[float, float, float], ...]] = {
    "": ((0.84, 0.0, 70.0), (0.12, 70.0, 300.0), (0.04, 300.0, 900.0)),
    ",": ((0.40, 0.0, 120.0), (0.48, 120.0, 450.0), (0.12, 450.0, 900.0)),
    ".": ((0.12, 0.0, 150.0), (0.30, 150.0, 500.0), (0.58, 500.0, 2000.0)),
    "?": ((0.12, 0.0, 150.0), (0.30, 150.0, 500.0), (0.58, 500.0, 2000.0)),
    "!": ((0.12, 0.0, 150.0), (0.30, 150.0, 500.0), (0.58, 500.0, 2000.0)),
}
# A word after which a clause usually starts is a fair place to break a subtitle line.
_CLAUSE_OPENERS = frozenset(
    "and but or so because which who whom whose when where while if that then though although "
    "unless until since as to for with without after before".split()
)


def sample_pause_ms(punct: str, rng: random.Random) -> float:
    r = rng.random()
    for p, lo, hi in _PAUSES[punct]:
        if r < p:
            return rng.uniform(lo, hi)
        r -= p
    return rng.uniform(0.0, 70.0)


def break_target(punct: str, next_word: str | None) -> float:
    """Training target of the break head: sentence end 1, clause mark 0.7, clause start 0.35."""
    if punct in SENTENCE_END:
        return 1.0
    if punct:
        return 0.7
    if next_word is not None and next_word in _CLAUSE_OPENERS:
        return 0.35
    return 0.0


def document_words(paragraphs: tuple[str, ...], rng: random.Random) -> list[LabelledWord]:
    """Labelled words of a document; number words become digits as Whisper writes them."""
    out: list[LabelledWord] = []
    for para in paragraphs:
        words = label_text(para)
        if words and words[-1].punct == "":
            # A paragraph ends a thought even where the text has no mark (headings, verse).
            last = words[-1]
            words[-1] = LabelledWord(last.word, ".", last.case)
        for w in words:
            digits = number_to_digits(w.word)
            if digits is not None and rng.random() < 0.7:
                w = LabelledWord(digits, w.punct, "lower")
            out.append(w)
    return out


@dataclass(frozen=True, slots=True)
class Sample:
    """One training window in the recogniser's view, with its labels."""

    words: tuple[str, ...]
    pauses_ms: tuple[float | None, ...]
    n_right: tuple[int, ...]
    puncts: tuple[str, ...]
    cases: tuple[str, ...]
    breaks: tuple[float, ...]


def sample_window(
    doc: list[LabelledWord], rng: random.Random, min_len: int = 6, max_len: int = 64
) -> Sample:
    """A random window of ``doc``; half end at a sentence end with the stream complete."""
    n = len(doc)
    length = min(n, rng.randint(min_len, max_len))
    start = rng.randint(0, n - length)
    stop = start + length
    complete = rng.random() < 0.5
    if complete:
        # Stream ends where a sentence ends: extend to the next sentence end (bounded).
        limit = min(n, stop + 40)
        while stop < limit and doc[stop - 1].punct not in SENTENCE_END:
            stop += 1
    window = doc[start:stop]
    no_timing = rng.random() < 0.1
    pauses: list[float | None] = []
    for i, w in enumerate(window):
        if no_timing:
            pauses.append(None)
            continue
        pause = sample_pause_ms(w.punct, rng)
        if i == len(window) - 1 and not complete:
            # At the cut the silence after the word has only partly been heard yet.
            pause = None if rng.random() < 0.4 else rng.uniform(0.0, pause)
        pauses.append(pause)
    t = len(window)
    n_right = [8] * t if complete else [t - 1 - i for i in range(t)]
    nxt = [window[i + 1].word if i + 1 < t else (doc[stop].word if stop < n else None)
           for i in range(t)]
    return Sample(
        words=tuple(w.word for w in window),
        pauses_ms=tuple(pauses),
        n_right=tuple(n_right),
        puncts=tuple(w.punct for w in window),
        cases=tuple(w.case for w in window),
        breaks=tuple(break_target(w.punct, nx) for w, nx in zip(window, nxt, strict=True)),
    )


def eval_stream(
    doc: list[LabelledWord], seed: int
) -> tuple[list[str], list[float], list[str], list[str]]:
    """A whole held-out document with pauses sampled under a fixed seed (for the benchmark)."""
    rng = random.Random(seed)
    pauses = [float(np.float32(sample_pause_ms(w.punct, rng))) for w in doc]
    return [w.word for w in doc], pauses, [w.punct for w in doc], [w.case for w in doc]
