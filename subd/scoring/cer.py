"""Character error rate for scripts without spaces (Chinese, Japanese): the usual measure where
"words" are not written. Marks and spaces are not counted; a Latin word counts as one unit, as
in word error rate. Traditional and simplified Chinese are one spelling only if the caller
converts them first (Whisper writes either; ``opencc -c t2s.json`` maps one to the other)."""

from __future__ import annotations

import re
import unicodedata

from subd.scoring.wer import word_errors

_UNIT = re.compile(r"[a-z0-9']+|\S")


def units(text: str) -> list[str]:
    """Characters of ``text`` (Latin words and numbers whole), without marks or spaces."""
    text = unicodedata.normalize("NFKC", text).lower()
    return [u for u in _UNIT.findall(text) if not unicodedata.category(u[0]).startswith(("P", "S"))]


def cer(ref: str, hyp: str) -> float:
    ref_units = units(ref)
    return word_errors(ref_units, units(hyp)) / max(1, len(ref_units))
