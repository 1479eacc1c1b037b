"""Chinese cues: 16 characters a line, reading speed, no spaces between CJK words, no line that
starts with a closing mark, Latin words spaced, full-width marks; read back from SRT and VTT."""

from __future__ import annotations

import pysrt
import pytest

from subd.commands.transcribe import render
from subd.layout.cjk import line_faults
from subd.layout.cues import CueLayout, LayoutConfig, RollUp
from subd.script import columns
from subd.types import TaggedWord, Word

NS_PER_S = 1_000_000_000
# Debian's code of conduct as fortunes-zh ships it, split as models.words splits Whisper's tokens
TEXT = ("在 Debian 这种规模的项目中,很难避免遇到与你意见不和,或者难以合作的人。请接受这一事实,"
        "并保持礼貌。意见不一致并不是糟糕举止或者人身攻击的借口,而且让人感觉受到威胁显然不是健康的"
        "社区氛围。")


def units(text: str) -> list[str]:
    """Characters, a Latin word whole, marks attached to the unit before them."""
    out: list[str] = []
    for part in text.split(" "):
        if part.isascii():
            out.append(part)
            continue
        for ch in part:
            if ch in ",。" and out:
                out[-1] += ch
            else:
                out.append(ch)
    return out


def words(text: str = TEXT, chars_per_s: float = 4.0) -> list[Word]:
    step = int(NS_PER_S / chars_per_s)
    return [Word(u, i * step, i * step + step - 20_000_000) for i, u in enumerate(units(text))]


def tagged(ws: list[Word]) -> list[TaggedWord]:
    """The recogniser's marks as tags (what the tag stage passes on for Chinese)."""
    out = []
    for w in ws:
        punct = w.text[-1] if w.text[-1] in ",。" else ""
        out.append(TaggedWord(w, w.text, punct, "lower", 1.0 if punct == "。" else 0.0, True))
    return out


def lay_out(ws: list[Word], config: LayoutConfig | None = None):
    layout = CueLayout(config)
    cues = layout.push(tagged(ws), audio_end_ns=ws[-1].end_ns)
    return cues + layout.finish(), layout.stats


def test_chinese_cues_follow_the_cjk_rules():
    cues, stats = lay_out(words())
    lines = [line for cue in cues for line in cue.lines]
    faults = [f for line in lines for f in line_faults(line, 16)]
    assert faults == []
    assert max(columns(line) for line in lines) <= 32
    assert any(columns(line) >= 24 for line in lines)  # lines are filled, not one word each
    # nothing lost: the cues read back as the text, with full-width marks
    shown = "".join("".join(c.lines) for c in cues).replace(" ", "")
    assert shown == TEXT.replace(" ", "").replace(",", "，")
    assert "在 Debian 这种" in lines[0]
    # reading speed: 4 characters/s speech fits in 9 characters/s cues
    assert stats.n_cps_violations == 0


def test_chinese_reading_speed_is_nine_characters_a_second():
    cues, stats = lay_out(words(chars_per_s=12.0))  # speech faster than anyone reads
    assert stats.n_cps_violations > 0
    assert stats.max_cps > 9.0
    slow, slow_stats = lay_out(words(chars_per_s=12.0), LayoutConfig(cjk_max_cps=20.0))
    assert slow_stats.n_cps_violations == 0


def test_no_line_starts_with_a_closing_mark_even_inside_a_long_word():
    long_word = Word("这是一个非常非常长而且没有任何停顿的中文句子，" * 2, 0, 4 * NS_PER_S)
    cues, _ = lay_out([long_word, Word("好。", 4 * NS_PER_S, 5 * NS_PER_S)])
    lines = [line for cue in cues for line in cue.lines]
    assert [f for line in lines for f in line_faults(line, 16)] == []
    assert not any(line.startswith("-") or line.endswith("-") for line in lines)  # no hyphens


@pytest.mark.parametrize("suffix", [".srt", ".vtt"])
def test_chinese_cues_read_back_from_srt_and_vtt(tmp_path, suffix):
    ws = words()
    path = tmp_path / f"out{suffix}"
    path.write_text(render(ws, suffix), encoding="utf-8")
    if suffix == ".srt":
        lines = [line for item in pysrt.open(str(path), encoding="utf-8")
                 for line in item.text.split("\n")]
    else:
        body = path.read_text(encoding="utf-8").split("\n")
        assert body[0] == "WEBVTT"
        lines = [b for b in body[1:] if b and "-->" not in b]
    assert lines and [f for line in lines for f in line_faults(line, 16)] == []
    assert "".join(lines).replace(" ", "") == TEXT.replace(" ", "").replace(",", "，")


def test_english_lines_are_unchanged():
    ws = [Word(w, i * 300_000_000, i * 300_000_000 + 250_000_000)
          for i, w in enumerate("where are you going tonight with the old dog".split())]
    cues, _ = lay_out(ws)
    assert all(len(line) <= 42 for c in cues for line in c.lines)
    assert " ".join(" ".join(c.lines) for c in cues) == " ".join(w.text for w in ws)


def test_roll_up_keeps_chinese_lines_within_sixteen_characters():
    roll = RollUp(LayoutConfig(mode="rollup"))
    roll.push(tagged(words()))
    shown = roll.display("还有")
    assert shown and all(columns(line.text) <= 32 for line in shown)
    assert all(line.text[:1] not in "，。" for line in shown)


def test_a_chinese_cue_that_fits_on_one_line_is_one_line():
    """Eight characters and a comma in the middle fit one line of 16: one line, not "秀妹，" over
    "失意昂然。" (THCHS-30 A2_0 at D = 2 s)."""
    ws = words("秀妹,失意昂然。", chars_per_s=3.0)
    cues, _ = lay_out(ws)
    assert [c.lines for c in cues] == [("秀妹，失意昂然。",)]


def test_digits_next_to_chinese_are_spaced_however_the_recogniser_grouped_them():
    """Whisper wrote "12" for 一二 after "情况" (a live run, 2026-12-07), once as the rest of the
    word before it ("joined", which glues a word's rest to it) and once inside one word: both
    lines read "情况 12 线", as the joiner spaces two words (issue 20: mixed text is spaced)."""
    step = NS_PER_S // 4

    def word(i: int, text: str, joined: bool = False) -> Word:
        return Word(text, i * step, i * step + step - 20_000_000, joined=joined)

    for ws in ([word(0, "情"), word(1, "况"), word(2, "12", joined=True), word(3, "线")],
               [word(0, "情况12"), word(1, "线")]):
        cues, _ = lay_out(ws)
        lines = [line for cue in cues for line in cue.lines]
        assert lines == ["情况 12 线"], lines
        assert [f for line in lines for f in line_faults(line, 16)] == []
    # a Latin word's rest stays glued ("ill" + "-disposed")
    cues, _ = lay_out([word(0, "ill"), word(1, "-disposed", joined=True), word(2, "man")])
    assert [line for cue in cues for line in cue.lines] == ["ill-disposed man"]
