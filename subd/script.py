"""Writing systems: which languages write without spaces, how words join, how wide text is.

Chinese and Japanese put no space between words; a Latin word or a number inside them is set off
by a half-width space on each side (the convention of Debian's own Chinese texts, "在 Debian
这种规模的项目中", and of the W3C's Chinese layout requirements). Width is counted in half-width
columns: a CJK character or full-width mark is two, anything else one, so an English line's
width is its length and a Chinese line of 16 characters is 32 columns. Broadcasters' Chinese
style guides count a half-width character as half a character, which this gives too.
"""

from __future__ import annotations

import unicodedata

# Whisper language codes of scripts written without spaces between words.
SPACELESS_LANGUAGES = frozenset({"zh", "yue", "ja", "th", "lo", "my", "km", "bo"})

# Half-width marks and their full-width forms (used when the text around them is CJK).
FULLWIDTH = {",": "，", ".": "。", "?": "？", "!": "！", ":": "：", ";": "；", "(": "（",
             ")": "）"}
# No line may start with these (closing brackets, marks that end something) ...
CLOSING = frozenset("，。？！：；、）》」』】〕〉”’…·ー々〜ゝゞ,.?!:;)]}%")
# ... and none may end with these (opening brackets and quotes).
OPENING = frozenset("（《「『【〔〈“‘([{")


def is_wide(ch: str) -> bool:
    """A character drawn two columns wide: CJK ideographs, kana, hangul, full-width forms."""
    return unicodedata.east_asian_width(ch) in ("W", "F")


def is_cjk(ch: str) -> bool:
    """A character of a script written without spaces (ideographs, kana, CJK marks)."""
    if not is_wide(ch):
        return False
    name = unicodedata.name(ch, "")
    return not name.startswith("HANGUL")  # Korean separates words with spaces


def has_cjk(text: str) -> bool:
    return any(is_cjk(ch) for ch in text)


def spaceless(language: str | None) -> bool:
    return (language or "") in SPACELESS_LANGUAGES


def columns(text: str) -> int:
    """Display width in half-width columns (``len`` for text without wide characters)."""
    return sum(2 if is_wide(ch) else 1 for ch in text)


def joiner(left: str, right: str) -> str:
    """What goes between two words: nothing between CJK characters or next to a full-width
    mark, a space between CJK and Latin text ("用 Debian 系统") and between Latin words."""
    if not left or not right:
        return ""
    last = left[-1]
    if _is_mark(last) and not is_wide(last) and len(left) > 1 and is_cjk(left[-2]):
        last = left[-2]  # "避免," is CJK text that ends in a half-width mark
    if is_cjk(last) and is_cjk(right[0]):
        return ""
    if (is_cjk(last) and _is_mark(last)) or (is_cjk(right[0]) and _is_mark(right[0])):
        return ""  # a full-width mark carries its own space
    return " "


def _is_mark(ch: str) -> bool:
    return unicodedata.category(ch).startswith("P")


def join_words(texts: list[str] | tuple[str, ...]) -> str:
    out: list[str] = []
    for text in texts:
        if out:
            out.append(joiner(out[-1], text))
        out.append(text)
    return "".join(out)


def fullwidth_marks(text: str) -> str:
    """Half-width marks that follow a CJK character become full-width ("很好," -> "很好，").
    A mark after a Latin letter or digit stays ("3.5", "Debian,")."""
    chars = list(text)
    for i, ch in enumerate(chars):
        if ch in FULLWIDTH and i > 0 and is_cjk(chars[i - 1]) and ch not in "()":
            chars[i] = FULLWIDTH[ch]
    return "".join(chars)
