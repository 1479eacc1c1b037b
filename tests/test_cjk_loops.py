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


class _Engine:
    """Stands in for WhisperEngine.transcribe_window: which decodes a loop triggers is what
    is tested here (the real decodes that loop are the espeak-ng stream on the full input,
    tests/test_mandarin.py)."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)
        self.calls: list[tuple] = []

    def transcribe_window(self, window, prompt, policy, **kwargs):
        from subd.models.alignment import WordTiming

        self.calls.append((prompt, kwargs.get("prefix")))
        text = self.texts.pop(0)
        return type("Result", (), {"prefix_used": False, "words": tuple(
            WordTiming(ch, (), i * 0.2, (i + 1) * 0.2, 0.9) for i, ch in enumerate(text))})()


def test_a_looped_decode_with_context_is_redone_without_it():
    from subd.recognise.loops import transcribe_unlooped

    eng = _Engine("不和和和和和和", "不和或者难以合作")
    out = transcribe_unlooped(eng, None, [1, 2], None, prefix=(5, 6), retry_without_prefix=None)
    assert "".join(w.text for w in out.words) == "不和或者难以合作"
    assert eng.calls == [([1, 2], (5, 6)), (None, ())]
    # the second decode loops too: the first is kept (and cut later, cut_loop)
    eng = _Engine("千千千千千", "和和和和和")
    out = transcribe_unlooped(eng, None, [1], None, prefix=())
    assert "".join(w.text for w in out.words) == "千千千千千"
    # no context to drop, or no loop: one decode
    for texts, prompt in ((("千千千千千",), None), (("请接受这一事实",), [1])):
        eng = _Engine(*texts)
        transcribe_unlooped(eng, None, prompt, None, prefix=())
        assert len(eng.calls) == 1
