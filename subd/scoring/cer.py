"""Character error rate for scripts without spaces (Chinese, Japanese): the usual measure where
"words" are not written. Marks and spaces are not counted; a Latin word counts as one unit, as
in word error rate. Traditional and simplified Chinese are one spelling only if the caller
converts them first (Whisper writes either; OpenCC's ``t2s`` maps one to the other: subd.script).

Numbers are compared digit by digit in Chinese numerals, in the reference and the hypothesis
alike: Whisper writes the digits its subtitles were written in ("12 线城市"), AISHELL's
references spell every number ("一二线城市"), and which of the two Whisper writes is a coin flip
(the same clip after 0.4 s of silence: "12" offline too). Unnormalised, the spelling alone cost 2
of 38 characters. A number read as a cardinal ("十二") still counts its difference to the digits
("一二": 1 error), which neither system gains from."""

from __future__ import annotations

import re
import unicodedata

from subd.scoring.wer import word_errors

_UNIT = re.compile(r"[a-z0-9']+|\S")
_DIGITS = str.maketrans("0123456789", "零一二三四五六七八九")


def units(text: str) -> list[str]:
    """Characters of ``text`` (Latin words and numbers whole), without marks or spaces."""
    text = unicodedata.normalize("NFKC", text).lower()
    return [u for u in _UNIT.findall(text) if not unicodedata.category(u[0]).startswith(("P", "S"))]


def numerals(text: str) -> str:
    """``text`` with its digits (half- or full-width) as Chinese numerals, one for one."""
    return unicodedata.normalize("NFKC", text).translate(_DIGITS)


def cer(ref: str, hyp: str, *, digits_as_numerals: bool = True) -> float:
    """Character errors per reference unit; ``digits_as_numerals``: see the module's note."""
    if digits_as_numerals:
        ref, hyp = numerals(ref), numerals(hyp)
    ref_units = units(ref)
    return word_errors(ref_units, units(hyp)) / max(1, len(ref_units))
