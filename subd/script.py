"""Languages and writing systems: the language setting, which languages write without spaces,
how words join, how wide text is.

Chinese and Japanese put no space between words; a Latin word or a number inside them is set off
by a half-width space on each side (the convention of Debian's own Chinese texts, "在 Debian
这种规模的项目中", and of the W3C's Chinese layout requirements). Width is counted in half-width
columns: a CJK character or full-width mark is two, anything else one, so an English line's
width is its length and a Chinese line of 16 characters is 32 columns. Broadcasters' Chinese
style guides count a half-width character as half a character, which this gives too.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Callable

from subd.errors import ConfigError
from subd.validate import check_choice

# Whisper language codes of scripts written without spaces between words.
SPACELESS_LANGUAGES = frozenset({"zh", "yue", "ja", "th", "lo", "my", "km", "bo"})

# Half-width marks and their full-width forms (used when the text around them is CJK).
FULLWIDTH = {",": "，", ".": "。", "?": "？", "!": "！", ":": "：", ";": "；", "(": "（",
             ")": "）"}

# Title abbreviations as English writes them: their period is the word's, and ends no sentence
# ("Mr. | John" is a bad break; the tagger, which decides sentence ends, sees "mr").
TITLE_ABBREVIATIONS = frozenset({"mr.", "mrs.", "ms.", "dr.", "st.", "jr.", "sr.", "vs.", "prof.",
                                 "mt."})

# No line may start with these (closing brackets, marks that end something) ...
CLOSING = frozenset("，。？！：；、）》」』】〕〉”’…·ー々〜ゝゞ,.?!:;)]}%")
# ... and none may end with these (opening brackets and quotes).
OPENING = frozenset("（《「『【〔〈“‘([{")


# no code point below this is drawn wide (unicodedata: U+0378, unassigned; U+1100 Hangul Jamo is
# the first assigned one)
WIDE_FROM = "\u0378"


def is_wide(ch: str) -> bool:
    """A character drawn two columns wide: CJK ideographs, kana, hangul, full-width forms."""
    if ch < WIDE_FROM:  # Latin letters and marks: without a table lookup
        return False
    return unicodedata.east_asian_width(ch) in ("W", "F")


def is_cjk(ch: str) -> bool:
    """A character of a script written without spaces (ideographs, kana, CJK marks)."""
    if not is_wide(ch):
        return False
    name = unicodedata.name(ch, "")
    return not name.startswith("HANGUL")  # Korean separates words with spaces


def has_cjk(text: str) -> bool:
    return not text.isascii() and any(is_cjk(ch) for ch in text)


def spaceless(language: str | None) -> bool:
    return (language or "") in SPACELESS_LANGUAGES


def columns(text: str) -> int:
    """Display width in half-width columns (``len`` for text without wide characters)."""
    if text.isascii():
        return len(text)
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
    if all(t and t.isascii() for t in texts):  # no CJK: a space between words (``joiner``)
        return " ".join(texts)
    return joined(texts)


def joined(texts: list[str] | tuple[str, ...]) -> str:
    """``texts`` with ``joiner``'s choice between each two (``join_words`` without its ASCII
    shortcut)."""
    out: list[str] = []
    for text in texts:
        if out:
            out.append(joiner(out[-1], text))
        out.append(text)
    return "".join(out)


def latin_meets_cjk(a: str, b: str) -> bool:
    """Two adjacent characters, a Latin letter or digit and a CJK character (not a mark), that
    need a space between them (CJK layout)."""
    return (is_cjk(a) and not _is_mark(a) and b.isascii() and b.isalnum()) or (
        a.isascii() and a.isalnum() and is_cjk(b) and not _is_mark(b))


def latin_spaced(text: str) -> str:
    """A space where a Latin letter or digit meets a CJK character inside one word ("情况12"
    -> "情况 12"), as ``joiner`` puts one between two words."""
    out = text[:1]
    for a, b in zip(text, text[1:], strict=False):
        out += " " + b if latin_meets_cjk(a, b) else b
    return out


def fullwidth_marks(text: str) -> str:
    """Half-width marks that follow a CJK character become full-width ("很好," -> "很好，").
    A mark after a Latin letter or digit stays ("3.5", "Debian,")."""
    chars = list(text)
    for i, ch in enumerate(chars):
        if ch in FULLWIDTH and i > 0 and is_cjk(chars[i - 1]) and ch not in "()":
            chars[i] = FULLWIDTH[ch]
    return "".join(chars)


# [recognizer] chinese_script: the script Chinese is written in, and OpenCC's conversion to it.
# Whisper writes Mandarin in either script, and changes from one decode to the next ("我认为" in
# one, "認為" in the next: a caption line of both, and two decodes of the same words that do not
# agree); "decoded" leaves Whisper's text as it is.
CHINESE_SCRIPTS = {"simplified": "t2s", "traditional": "s2t", "taiwan": "s2tw",
                   "hongkong": "s2hk", "decoded": None}
DEFAULT_CHINESE_SCRIPT = "simplified"


def check_chinese_script(value: object) -> str:
    """``value`` if it names a script of CHINESE_SCRIPTS, else a one-line ConfigError."""
    check_choice("recognizer", "chinese_script", value, tuple(CHINESE_SCRIPTS))
    return str(value)


@functools.cache
def _opencc(conversion: str) -> Callable[[str], str]:
    import opencc

    return opencc.OpenCC(conversion).convert


def script_writer(script: str, language: str | None) -> Callable[[str], str] | None:
    """What writes a decode's text in ``script`` (CHINESE_SCRIPTS) when ``language`` is
    Chinese; None: the text stays as decoded."""
    conversion = CHINESE_SCRIPTS[check_chinese_script(script)]
    return _opencc(conversion) if conversion and language == "zh" else None


# Whisper's languages (the <|xx|> tokens of the multilingual vocabulary, large-v3's "yue"
# included). Checked at load time, without the model: a typo is a config error, not a crash in
# the recogniser process.
WHISPER_LANGUAGES = frozenset(
    """
    en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no
    th ur hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw
    gl mr pa si km sn yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl
    mg as tt haw ln ha ba jw su yue
    """.split()
)
AUTO = "auto"
ENGLISH_MODEL = "tiny.en"
MULTILINGUAL_MODEL = "base"  # the packaged multilingual model (subd[base])


def check_language(value: object, where: str = "[recognizer] language") -> str:
    """``value`` as a language setting ("auto" or a Whisper ISO code), or a ConfigError."""
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string (\"auto\" or an ISO code like \"zh\"), "
                          f"got {value!r}")
    code = value.strip().lower()
    if code == AUTO or code in WHISPER_LANGUAGES:
        return code
    raise ConfigError(f"{where}: {value!r} is not \"auto\" or a language Whisper knows "
                      "(ISO 639-1 codes such as en, zh, ja, de, fr, es)")


def default_model(language: str) -> str:
    """English gets the small English-only model; any other language (or "auto") the packaged
    multilingual ``base``."""
    return ENGLISH_MODEL if language == "en" else MULTILINGUAL_MODEL


def check_model_language(model_multilingual: bool, language: str, model: str) -> None:
    if not model_multilingual and language not in ("en", AUTO):
        raise ConfigError(f"[recognizer] language = {language!r}: the model {model!r} knows only "
                          f"English (use model = \"{MULTILINGUAL_MODEL}\" or another "
                          "multilingual model)")
