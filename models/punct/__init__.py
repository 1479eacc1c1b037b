"""CRF tagger for punctuation, capitals and subtitle breaks (``subd.models.punct``).

    tagger = PunctTagger.load()                      # packaged weights, SHA-256 checked
    tagger.tag(["where", "are", "you", "going"], [40, 30, 20, 900])
    tag_words(tagger, words)                         # subd.types.Word -> TaggedWord
    tag_words(tagger, words, use_marks=True)         # ... weighing the recogniser's own marks

See MODEL_CARD.md for the data, licences and held-out figures.

May import: ``subd.models`` and the top-level modules of ``subd`` only.
"""

from __future__ import annotations

from collections.abc import Sequence

from subd.script import TITLE_ABBREVIATIONS
from subd.types import TaggedWord, Word

from .tagger import PunctTagger, WordTag
from .text import (
    CASES,
    PUNCTS,
    SENTENCE_END,
    RecogniserMark,
    apply_case,
    normalise_word,
    recogniser_mark,
)

__all__ = [
    "CASES",
    "PUNCTS",
    "SENTENCE_END",
    "PunctTagger",
    "RecogniserMark",
    "WordTag",
    "pauses_ms_of",
    "recogniser_mark",
    "recogniser_marks_of",
    "render",
    "tag_words",
    "tagged_word",
]

NS_PER_MS = 1_000_000


def pauses_ms_of(words: Sequence[Word], after_last_ns: int | None) -> list[float | None]:
    """Silence after each word (ms): to the next word's start; for the last word, up to
    ``after_last_ns`` (the next word's start, or the end of the audio heard so far), else None.
    """
    out: list[float | None] = []
    for i, w in enumerate(words):
        nxt = words[i + 1].start_ns if i + 1 < len(words) else after_last_ns
        out.append(None if nxt is None else max(0.0, (nxt - w.end_ns) / NS_PER_MS))
    return out


def recogniser_marks_of(
    words: Sequence[Word], n_after_last: int | None = None
) -> list[RecogniserMark]:
    """The recogniser's own marks of ``words`` decoded together (one hypothesis): word i had
    ``len(words) - 1 - i`` words after it, plus ``n_after_last`` (None = unknown edges)."""
    n = len(words)
    return [recogniser_mark(w.text, None if n_after_last is None else n - 1 - i + n_after_last)
            for i, w in enumerate(words)]


def tagged_word(word: Word, tag: WordTag, final: bool) -> TaggedWord:
    """``text`` is the cased word without its mark; show it as ``text + punct``."""
    norm = normalise_word(word.text)
    if not norm:  # a token with no letter or digit: shown as the recogniser wrote it
        return TaggedWord(word, word.text, "", "lower", tag.break_after, final)
    text = apply_case(norm, tag.case)
    if word.text.strip().lower() in TITLE_ABBREVIATIONS and tag.punct != ".":
        text += "."  # the recogniser's "Mr.": the word's own period, no mark ("Mr. John")
    return TaggedWord(word, text, tag.punct, tag.case, tag.break_after, final)


def tag_words(
    tagger: PunctTagger,
    words: Sequence[Word],
    *,
    right_context_complete: bool = True,
    after_last_ns: int | None = None,
    final: bool = True,
    use_marks: bool = False,
) -> list[TaggedWord]:
    """Tag recogniser words in one pass. Their own punctuation and case are ignored, or with
    ``use_marks`` weighed as evidence (decoding edges unknown)."""
    marks = recogniser_marks_of(words) if use_marks else None
    tags = tagger.tag([w.text for w in words], pauses_ms_of(words, after_last_ns),
                      right_context_complete=right_context_complete, recogniser=marks)
    return [tagged_word(w, t, final) for w, t in zip(words, tags, strict=True)]


def render(tagged: Sequence[TaggedWord]) -> str:
    """Display text of tagged words: "Where are you going? I am going home."."""
    return " ".join(t.text + t.punct for t in tagged)
