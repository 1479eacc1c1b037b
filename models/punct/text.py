"""Text handling for the punctuation tagger: the recogniser's view of a word, and labels.

The tagger sees words as a streaming recogniser gives them once subd has stripped their
punctuation: lower-cased, no marks, numbers in digits, apostrophes and inner hyphens kept.
Training text (punctuated, cased) is turned into that view plus one label per word: the mark
after it and its capitalisation. What the recogniser itself wrote ("them." / "Mr." / "man,") is
kept apart as evidence (:class:`RecogniserMark`) that the tagger weighs, not as the answer.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

PUNCTS: tuple[str, ...] = ("", ",", ".", "?", "!")
CASES: tuple[str, ...] = ("lower", "cap", "upper")
SENTENCE_END = frozenset({".", "?", "!"})

# Abbreviations whose full stop is not a sentence end (the recogniser writes "Mr." too).
_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "st", "jr", "sr", "vs", "etc", "mt", "prof", "capt", "col", "gen",
     "lt", "sgt", "rev", "hon", "messrs", "co", "inc", "ltd", "no", "e.g", "i.e", "viz", "cf"}
)
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'"})
_EDGE_JUNK = "\"'()[]{}<>*_\u201c\u201d\u00ab\u00bb#~|/\\"
_KEEP_INNER = re.compile(r"[^\w'\-]+", re.UNICODE)


def normalise_word(text: str) -> str:
    """The recogniser's view of ``text``: lower-case, no marks, apostrophes/inner hyphens kept.

    Returns "" for a token with no letter or digit (pure punctuation).
    """
    text = unicodedata.normalize("NFC", text).translate(_APOSTROPHES)
    text = _KEEP_INNER.sub("", text).replace("_", "")
    text = text.strip("'-")
    if not any(ch.isalnum() for ch in text):
        return ""
    return text.lower()


def case_of(text: str) -> str:
    """"upper" for an all-capital word of 2+ letters, "cap" for a leading capital, else "lower"."""
    letters = [ch for ch in text if ch.isalpha()]
    if not letters:
        return "lower"
    if len(letters) >= 2 and all(ch.isupper() for ch in letters):
        return "upper"
    return "cap" if letters[0].isupper() else "lower"


def apply_case(word: str, case: str) -> str:
    """Write ``word`` (recogniser view) with ``case``; the first letter gets the capital."""
    if case == "upper":
        return word.upper()
    if case == "cap":
        for i, ch in enumerate(word):
            if ch.isalpha():
                return word[:i] + ch.upper() + word[i + 1 :]
    return word


def mark_of(trailing: str) -> str:
    """The tag mark for the punctuation that follows a word ("" if none)."""
    if "?" in trailing:
        return "?"
    if "!" in trailing:
        return "!"
    if "." in trailing or "\u2026" in trailing:
        return "."
    if any(ch in trailing for ch in ",;:\u2014\u2013") or "--" in trailing:
        return ","
    return ""


@dataclass(frozen=True, slots=True)
class LabelledWord:
    """One word of training text: the recogniser view plus its true mark and case."""

    word: str
    punct: str
    case: str


_TOKEN = re.compile(r"\S+")
_SPLIT_DASH = re.compile(r"(--+|\u2014|\u2013)")


def label_text(text: str) -> list[LabelledWord]:
    """Split punctuated text into labelled words; marks between words go to the word before."""
    out: list[LabelledWord] = []
    for raw in _TOKEN.findall(_SPLIT_DASH.sub(r" \1 ", text.translate(_APOSTROPHES))):
        core_start = 0
        while core_start < len(raw) and not raw[core_start].isalnum():
            core_start += 1
        core_end = len(raw)
        while core_end > core_start and not raw[core_end - 1].isalnum():
            core_end -= 1
        core = raw[core_start:core_end]
        trailing = raw[core_end:]
        word = normalise_word(core)
        if not word:
            # A pure punctuation token ("--", "?", "...") belongs to the word before it.
            if out:
                mark = mark_of(raw)
                prev = out[-1]
                if mark and _mark_rank(mark) > _mark_rank(prev.punct):
                    out[-1] = LabelledWord(prev.word, mark, prev.case)
            continue
        if word in _ABBREVIATIONS and trailing.startswith("."):
            trailing = trailing[1:]
        if word.endswith("'") and trailing == "":
            word = word.rstrip("'")
        out.append(LabelledWord(word, mark_of(trailing), case_of(core)))
    return out


def _mark_rank(mark: str) -> int:
    return {"": 0, ",": 1, ".": 2, "!": 3, "?": 3}[mark]


_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * (i + 2) for i, w in enumerate(
    "twenty thirty forty fifty sixty seventy eighty ninety".split())}


def number_to_digits(word: str) -> str | None:
    """"seven" -> "7", "twenty-five" -> "25"; None for anything else (Whisper writes digits)."""
    if word in _UNITS:
        return str(_UNITS[word])
    if word in _TENS:
        return str(_TENS[word])
    if "-" in word:
        tens, _, unit = word.partition("-")
        if tens in _TENS and unit in _UNITS and 0 < _UNITS[unit] < 10:
            return str(_TENS[tens] + _UNITS[unit])
    return None


@dataclass(frozen=True, slots=True)
class RecogniserMark:
    """What the recogniser wrote for one word: its mark after it and its case.

    ``n_after``: how many words the recogniser had decoded after this one when it wrote it
    (0 = the word ended its decoded window / commit batch, where its marks are least reliable;
    None = unknown).
    """

    punct: str
    case: str
    n_after: int | None = None
    probs: tuple[float, float] | None = None  # (p('.'), p(',')) it weighed there (Word.mark_p)


def recogniser_mark(text: str, n_after: int | None = None,
                    probs: tuple[float, float] | None = None) -> RecogniserMark:
    """The recogniser's own mark and case in its spelling of a word ("Mr." has no mark)."""
    labelled = label_text(text)
    if not labelled:
        return RecogniserMark("", "lower", n_after, probs)
    return RecogniserMark(labelled[-1].punct, labelled[0].case, n_after, probs)
