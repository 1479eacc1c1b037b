"""Words for scripts without spaces, language settings and CER (fast: tokenizer only)."""

from __future__ import annotations

import unicodedata

import pytest

from subd.errors import ConfigError
from subd.models.loading import PACKAGED, _pinned_path
from subd.models.tokenizer import WhisperTokenizer
from subd.models.words import prompt_text, split_spaceless, word_splitter
from subd.scoring.cer import cer
from subd.script import (
    WHISPER_LANGUAGES,
    check_language,
    columns,
    default_model,
    fullwidth_marks,
    is_wide,
    join_words,
    joined,
)


@pytest.fixture(scope="module")
def tok() -> WhisperTokenizer:
    spec = PACKAGED["base"]
    return WhisperTokenizer(_pinned_path(spec.tokenizer, spec.pip_name), multilingual=True)


def test_chinese_tokens_group_into_characters_with_marks_attached(tok):
    text = "在 Debian 这种规模的项目中，很难避免遇到与你意见不和的人。"
    tokens = tok.encode(text) + [tok.special.eot]
    words, groups = split_spaceless(tok, tokens)
    assert words[-1] == "" and groups[-1] == [tok.special.eot]
    words = words[:-1]
    assert "".join(words) == text  # nothing lost, nothing added
    assert " Debian" in words  # a Latin word stays whole
    assert all(w.strip() for w in words)
    # a mark never starts a word, and no CJK word is longer than Whisper's longest token piece
    assert not any(w[0] in "，。" for w in words)
    assert max(len(w.strip("，。")) for w in words if w != " Debian") <= 3
    assert len(words) >= 20  # the sentence is many units, not one "word"
    # every token is in exactly one word, in order
    assert [t for g in groups[:-1] for t in g] == tokens[:-1]


def test_english_split_is_unchanged(tok):
    tokens = tok.encode(" Where are you going, John?")
    assert word_splitter(tok, "en")(tokens) == tok.split_to_words(tokens)
    words, _ = word_splitter(tok, "zh")(tokens)
    assert words == [" Where", " are", " you", " going,", " John?"]


def test_prompt_text_spells_words_as_whisper_writes_them():
    assert prompt_text(["one", "two."]) == " one two."
    assert prompt_text(["很", "难", "避免，", "用", "Debian", "系统"]) == "很难避免，用 Debian 系统"
    assert join_words(["你好，", "world", "用"]) == "你好，world 用"
    assert join_words(["避免,", "用"]) == "避免,用"


def test_the_latin_fast_paths_agree_with_the_tables():
    """is_wide skips unicodedata below WIDE_FROM, columns and join_words skip it for ASCII text
    (the recogniser joins its committed words at every update): the same answers as the full
    rules, for every code point and for words of both kinds."""
    assert all(is_wide(chr(c)) == (unicodedata.east_asian_width(chr(c)) in ("W", "F"))
               for c in range(0x110000) if not 0xD800 <= c < 0xE000)

    for texts in (["Mr.", "John", "Dashwood,"], ["10", "of", "clubs."], ["x"], ["用", "Debian"],
                  ["café", "au", "lait"], ["a", "'s", "-"], ["to", "be", "to"]):
        assert join_words(texts) == joined(texts)
        assert columns(" ".join(texts)) == sum(2 if is_wide(ch) else 1 for ch in " ".join(texts))
    assert join_words(["Mr.", "John"]) == "Mr. John"


def test_fullwidth_marks_and_widths():
    assert fullwidth_marks("很好,我们走吧.") == "很好，我们走吧。"
    assert fullwidth_marks("Debian, 3.5") == "Debian, 3.5"
    assert columns("abc") == 3 and columns("中文，") == 6


def test_language_setting_is_validated():
    assert check_language("ZH") == "zh" and check_language("auto") == "auto"
    for bad in ("xx", "chinese", 3, ""):
        with pytest.raises(ConfigError, match=r"\[recognizer\] language"):
            check_language(bad)
    assert default_model("en") == "tiny.en"
    assert default_model("zh") == default_model("auto") == "base"


def test_known_languages_are_the_tokenizers(tok):
    # large-v3's "yue" is not in base's vocabulary; every other one is
    assert WHISPER_LANGUAGES - {"yue"} == set(tok.language_tokens())


def test_cer_counts_characters_not_marks():
    assert cer("今天天气很好。", "今天天气很好") == 0.0
    assert cer("今天天气很好", "今天天汽很好") == pytest.approx(1 / 6)
    assert cer("用 Debian 系统", "用Debian系統") == pytest.approx(1 / 4)
