"""A loop of one CJK character (or a short n-gram) is cut to its first copy; doubled
characters, English repeats and text around a loop that is no loop stay as they are."""

from __future__ import annotations

from subd.recognise.loops import cut_loop, loop_start
from subd.types import Word


def words(text: str, step_ms: int = 200) -> list[Word]:
    units = text.split() if " " in text else list(text)
    return [Word(u, i * step_ms * 10**6, (i + 1) * step_ms * 10**6, 0.9)
            for i, u in enumerate(units)]


def texts(ws: list[Word]) -> str:
    return "".join(w.text for w in ws)


def test_one_character_loop_keeps_its_first_copy_and_nothing_after():
    # espeak-ng Mandarin on Whisper's full input: "与你一件不和和和和和…" then more loop
    assert texts(cut_loop(words("与你一件不和和和和和和和和和"))) == "与你一件不和"
    assert texts(cut_loop(words("的人千千千千千和和和和和"))) == "的人千"


def test_ngram_loop_is_cut_after_one_copy():
    assert texts(cut_loop(words("付出不利不利不利不利"))) == "付出不利"
    assert loop_start(words("甚至出现出现出现交易")) == (2, 2)


def test_real_repetition_is_kept():
    for text in ("谢谢你", "看看看", "研究研究", "哈哈哈", "一二线城市虽然也处于调整中"):
        assert texts(cut_loop(words(text))) == text
    # marks do not hide a copy, and the mark of the kept copy stays
    assert texts(cut_loop(words("不 和， 和， 和， 和"))) == "不和，"


def test_latin_repeats_are_left_to_the_decoder_guards():
    ws = words("no no no no no more")
    assert cut_loop(ws) == ws
    ws = words("1,2,3,4,4,4,4,4")  # one "word" of digits: not CJK
    assert cut_loop(ws) == ws
