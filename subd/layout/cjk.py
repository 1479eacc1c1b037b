"""Layout rules for Chinese and Japanese cues (the script decides, not a setting per sink).

A cue whose words hold CJK characters is laid out by the CJK limits: lines of
``cjk_max_chars_per_line`` characters (16 for Chinese, as broadcasters' Chinese style guides set
it; 13 for Japanese, ``ja_max_chars_per_line``) and a reading speed of ``cjk_max_cps`` (9
characters/s for Chinese; 4 for Japanese). Widths are counted in half-width columns
(:func:`subd.script.columns`): a CJK character or full-width mark is one character, a Latin letter,
digit or space half of one, as those guides count them. Words join without spaces except around
Latin words (:func:`subd.script.joiner`), a line never starts with a closing mark nor ends with an
opening one (:mod:`subd.layout.rules`), and half-width marks after CJK text become full-width.
English cues are untouched: without CJK characters every limit is the configured one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from subd.layout.rules import Token
from subd.script import columns, has_cjk

_KANA = (0x3040, 0x30FF)  # hiragana and katakana: the text is Japanese, not Chinese


def script_of(tokens: Sequence[Token]) -> str:
    """"ja", "zh" or "" (no CJK characters: the configured, Latin-script limits apply)."""
    text = "".join(t.text for t in tokens)
    if not has_cjk(text):
        return ""
    if any(_KANA[0] <= ord(ch) <= _KANA[1] for ch in text):
        return "ja"
    return "zh"


def line_columns(config, tokens: Sequence[Token]) -> int:
    """The line width for ``tokens`` in half-width columns."""
    script = script_of(tokens)
    if script == "zh":
        return 2 * config.cjk_max_chars_per_line
    if script == "ja":
        return 2 * config.ja_max_chars_per_line
    return config.max_chars_per_line


def max_cps(config, tokens: Sequence[Token]) -> float:
    script = script_of(tokens)
    if script == "zh":
        return config.cjk_max_cps
    if script == "ja":
        return config.ja_max_cps
    return config.max_cps


def reading_chars(lines: Iterable[str], tokens: Sequence[Token]) -> float:
    """Characters to read, as the limits count them: CJK text in full-width characters (a
    half-width character is half of one), other text in characters."""
    if not script_of(tokens):
        return float(sum(len(line) for line in lines))
    return sum(columns(line) for line in lines) / 2


def line_faults(line: str, max_chars: int) -> list[str]:
    """What breaks the CJK layout rules in one laid-out line (empty: nothing): too wide, a
    closing mark first, an opening mark last, a space between two CJK characters, a Latin word
    glued to CJK text, or a half-width mark after a CJK character."""
    from subd.script import CLOSING, FULLWIDTH, OPENING, is_cjk, latin_meets_cjk

    faults = []
    if columns(line) > 2 * max_chars:
        faults.append(f"wider than {max_chars} characters: {line!r}")
    if line[:1] in CLOSING:
        faults.append(f"starts with a closing mark: {line!r}")
    if line[-1:] in OPENING:
        faults.append(f"ends with an opening mark: {line!r}")
    for a, b, c in zip(line, line[1:], line[2:], strict=False):
        if b == " " and is_cjk(a) and is_cjk(c):
            faults.append(f"space between CJK characters: {line!r}")
    for a, b in zip(line, line[1:], strict=False):
        if latin_meets_cjk(a, b):
            faults.append(f"Latin text glued to CJK text: {line!r}")
        if is_cjk(a) and b in FULLWIDTH and b not in "()":
            faults.append(f"half-width mark after CJK text: {line!r}")
    return faults
