"""The recogniser's view of training text: words, pauses and cut right context.

Pauses after a word are sampled conditionally on the true mark (long after '.', shorter after
',', mostly short otherwise, with hesitations), so the model learns how much a pause says and
not more. Windows end either at the end of a sentence with the stream complete, or at a random
word with the right context cut, so the model learns what a word with no right context looks
like (and the streaming committer waits for context instead of trusting it).

The recogniser's own marks (Whisper's punctuation) are simulated from the true marks with the
errors a streaming recogniser makes: mostly right where it had right context (but '?' often
written as '.', commas often dropped, clause marks turned into full stops), and a spurious
sentence end on many words that ended its decoded window with speech still to come. Its
capitals follow its own sentence ends. Some windows carry no recogniser marks at all, so plain
text still works.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from .features import N_EVIDENCE, evidence_row
from .text import SENTENCE_END, LabelledWord, RecogniserMark, label_text, number_to_digits

# (probability, low ms, high ms) mixtures of the pause after a word, by its true mark.
_PAUSES: dict[str, tuple[tuple[float, float, float], ...]] = {
    "": ((0.84, 0.0, 70.0), (0.12, 70.0, 300.0), (0.04, 300.0, 900.0)),
    # read speech often holds a long pause at ';' and ':' (labelled ',')
    ",": ((0.38, 0.0, 120.0), (0.45, 120.0, 450.0), (0.12, 450.0, 900.0), (0.05, 900.0, 1600.0)),
    ".": ((0.12, 0.0, 150.0), (0.30, 150.0, 500.0), (0.58, 500.0, 2000.0)),
    "?": ((0.12, 0.0, 150.0), (0.30, 150.0, 500.0), (0.58, 500.0, 2000.0)),
    "!": ((0.12, 0.0, 150.0), (0.30, 150.0, 500.0), (0.58, 500.0, 2000.0)),
}
# A word after which a clause usually starts is a fair place to break a subtitle line.
_CLAUSE_OPENERS = frozenset(
    "and but or so because which who whom whose when where while if that then though although "
    "unless until since as to for with without after before".split()
)


# The recogniser's mark for a word it decoded with right context: how often it deviates from the
# true mark (scaled per window by a noise level), and what it writes instead.
_DEVIATE = {"": 0.02, ",": 0.4, ".": 0.35, "?": 0.45, "!": 0.7}
_INSTEAD: dict[str, tuple[tuple[str, float], ...]] = {
    "": ((",", 0.75), (".", 0.25)),
    ",": (("", 0.75), (".", 0.25)),  # ';' and ':' count as ',' and are often written as '.'
    ".": (("", 0.6), (",", 0.2), ("?", 0.1), ("!", 0.1)),
    "?": ((".", 0.65), ("", 0.25), (",", 0.1)),
    "!": ((".", 0.8), ("", 0.15), (",", 0.05)),
}
# A word that ended the recogniser's decoded window while speech went on: how often it gets a
# spurious sentence end, by how many words were decoded after it (0, 1); scaled per window.
_EDGE_FALSE_END = (0.06, 0.015)
UTTERANCE_PAUSE_MS = 600.0  # a commit at a pause this long is a real end of speech
P_NO_MARKS = 0.25  # windows without recogniser marks (plain text)
P_NO_EDGES = 0.1  # windows with marks but no window-edge information


def _pick(table: tuple[tuple[str, float], ...], rng: random.Random) -> str:
    r = rng.random()
    for mark, p in table:
        if r < p:
            return mark
        r -= p
    return table[-1][0]


@dataclass(frozen=True, slots=True)
class CommitBatch:
    """Words a simulated recogniser commits together, the tentative words it had decoded after
    them, and whether the batch ended at a real pause (speech had stopped)."""

    n_words: int
    n_tentative: int
    at_pause: bool


def commit_batches(pauses_ms: list[float | None], rng: random.Random) -> list[CommitBatch]:
    """Simulated decode structure of a word sequence: batches of 1-6 committed words, cut at a
    long pause most of the time, with 0-4 tentative words decoded after them."""
    n = len(pauses_ms)
    out: list[CommitBatch] = []
    i = 0
    while i < n:
        end = min(n, i + rng.randint(1, 6))
        at_pause = False
        for j in range(i, end):  # a long pause commits the batch there (end of utterance)
            p = pauses_ms[j]
            if p is not None and p >= UTTERANCE_PAUSE_MS and rng.random() < 0.7:
                end, at_pause = j + 1, True
                break
        n_tentative = 0 if at_pause or rng.random() < 0.35 else rng.randint(1, 4)
        out.append(CommitBatch(end - i, n_tentative, at_pause))
        i = end
    return out


def _decode_context(batches: list[CommitBatch]) -> tuple[list[int], list[bool]]:
    """Per word: recogniser words decoded after it, and whether speech stopped after it."""
    n_after: list[int] = []
    at_pause: list[bool] = []
    for b in batches:
        n_after += [b.n_words - 1 - j + b.n_tentative for j in range(b.n_words)]
        at_pause += [False] * (b.n_words - 1) + [b.at_pause]
    return n_after, at_pause


def simulate_recogniser(
    window: list[LabelledWord], pauses_ms: list[float | None], complete: bool,
    rng: random.Random, starts_sentence: bool = True, always: bool = False,
    batches: list[CommitBatch] | None = None,
) -> list[RecogniserMark | None]:
    """What a streaming recogniser would have written for the words of a training window.

    ``starts_sentence``: the word before the window ended a sentence (or there is none).
    ``always``: never leave the marks out (held-out scoring with marks). ``batches``: the
    decode structure (default: ``commit_batches`` drawn from ``rng``).
    """
    r = 1.0 if always else rng.random()
    if r < P_NO_MARKS:
        return [None] * len(window)
    with_edges = r >= P_NO_MARKS + P_NO_EDGES
    noise = rng.choice((0.5, 1.0, 1.0, 1.5))
    edge_noise = rng.choice((0.0, 0.5, 1.0, 2.0))
    n_after, at_pause = _decode_context(batches or commit_batches(pauses_ms, rng))
    out: list[RecogniserMark | None] = []
    prev_end = prev_true_end = starts_sentence
    last = len(window) - 1
    for i, w in enumerate(window):
        mark = w.punct
        if rng.random() < _DEVIATE[mark] * noise:
            mark = _pick(_INSTEAD[mark], rng)
        speech_follows = not at_pause[i] and not (complete and i == last)
        if speech_follows and n_after[i] < len(_EDGE_FALSE_END) and mark not in SENTENCE_END:
            if rng.random() < _EDGE_FALSE_END[n_after[i]] * edge_noise:
                mark = "."
        case = w.case
        if prev_end and case == "lower":
            case = "cap"
        elif prev_true_end and not prev_end and case == "cap" and w.word != "i":
            case = "lower" if rng.random() < 0.8 else case
        out.append(RecogniserMark(mark, case, n_after[i] if with_edges else None))
        prev_end = mark in SENTENCE_END
        prev_true_end = w.punct in SENTENCE_END
    return out


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
    evidence: np.ndarray  # int64 [T, 3]: the recogniser's mark/case/edge ids (0 = unknown)


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
    starts = start == 0 or doc[start - 1].punct in SENTENCE_END
    marks = simulate_recogniser(window, pauses, complete, rng, starts)
    evidence = np.array([evidence_row(m) for m in marks], dtype=np.int64).reshape(t, N_EVIDENCE)
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
        evidence=evidence,
    )


def eval_stream(
    doc: list[LabelledWord], seed: int
) -> tuple[list[str], list[float], list[str], list[str]]:
    """A whole held-out document with pauses sampled under a fixed seed (for the benchmark)."""
    rng = random.Random(seed)
    pauses = [float(np.float32(sample_pause_ms(w.punct, rng))) for w in doc]
    return [w.word for w in doc], pauses, [w.punct for w in doc], [w.case for w in doc]


def eval_marks(
    doc: list[LabelledWord], pauses_ms: list[float], seed: int
) -> tuple[list[RecogniserMark], list[CommitBatch]]:
    """Simulated recogniser marks of a whole held-out document under a fixed seed, and the
    commit batches they were simulated for (the streaming benchmark commits the same way)."""
    rng = random.Random(seed)
    batches = commit_batches(list(pauses_ms), rng)
    marks = simulate_recogniser(doc, list(pauses_ms), True, rng, always=True, batches=batches)
    return [m for m in marks if m is not None], batches
