"""Layout rules: line/cue limits, reading speed, durations, gaps, break places, roll-up."""

from __future__ import annotations

import re

import pytest

from subd.errors import ConfigError
from subd.layout.cues import CueLayout, LayoutConfig, RollUp, token_of
from subd.layout.rules import GLUE_WORDS
from subd.testing.sinks import SPEECH, script_states, script_words
from subd.types import CaptionState, Cue, TaggedWord, Word

MS = 1_000_000


def lay_out(config: LayoutConfig, text: str = SPEECH, words_per_s: float = 2.5) -> list[Cue]:
    layout = CueLayout(config)
    cues: list[Cue] = []
    for state in script_states(script_words(text, words_per_s=words_per_s)):
        cues += layout.push(state.committed, state.audio_end_ns, state.tentative)
    cues += layout.finish()
    return cues


def cue_words(cues: list[Cue]) -> list[str]:
    """Words of the cues in order, hyphenated pieces of long words joined again."""
    text = " ".join(" ".join(c.lines) for c in cues)
    return re.sub(r"-\s+", "", text).split()


def expected_words(text: str) -> list[str]:
    return text.split()


@pytest.mark.parametrize("chars", [42, 32])
@pytest.mark.parametrize("words_per_s", [2.5, 4.0, 9.0])
def test_cues_respect_limits_and_keep_every_word(chars: int, words_per_s: float) -> None:
    config = LayoutConfig(max_chars_per_line=chars)
    cues = lay_out(config, words_per_s=words_per_s)
    assert cue_words(cues) == expected_words(SPEECH)  # nothing lost, duplicated or reordered
    gap_ns = config.gap_ns
    for cue in cues:
        assert 1 <= len(cue.lines) <= 2
        assert all(len(line) <= chars for line in cue.lines), cue.lines
        assert cue.end_ns - cue.start_ns <= 7000 * MS
        assert cue.committed
    for a, b in zip(cues, cues[1:], strict=False):
        assert b.start_ns - a.end_ns >= gap_ns, (a, b)  # at least 2 frames between cues
        assert b.index == a.index + 1


def test_normal_speech_meets_reading_speed_and_minimum_duration() -> None:
    layout = CueLayout(LayoutConfig())
    cues = []
    for state in script_states(script_words(words_per_s=2.5)):
        cues += layout.push(state.committed, state.audio_end_ns, state.tentative)
    cues += layout.finish()
    long_word_cues = [c for c in cues if any("-" in line for line in c.lines)]
    for cue in cues:
        duration_s = (cue.end_ns - cue.start_ns) / 1e9
        assert duration_s >= 5 / 6 - 1e-9
        chars = sum(len(line) for line in cue.lines)
        if cue not in long_word_cues:
            assert chars / duration_s <= 17.0 + 1e-6, cue
    assert layout.stats.n_cues == len(cues)
    assert layout.stats.n_cps_violations <= len(long_word_cues)


def test_very_fast_speech_reports_reading_speed_violations() -> None:
    layout = CueLayout(LayoutConfig(max_chars_per_line=32))
    for state in script_states(script_words(words_per_s=12.0)):
        layout.push(state.committed, state.audio_end_ns, state.tentative)
    layout.finish()
    stats = layout.stats
    assert stats.n_cps_violations > 0  # too fast to read: counted, not hidden
    assert stats.max_cps > 17.0


def test_pause_starts_a_new_cue() -> None:
    words = script_words("one two three", words_per_s=3)
    late = script_words("four five", words_per_s=3, start_ns=words[-1].word.end_ns + 2000 * MS)
    layout = CueLayout()
    cues = layout.push(words + late, audio_end_ns=late[-1].word.end_ns) + layout.finish()
    assert [c.lines for c in cues] == [("one two three",), ("four five",)]


def test_long_word_is_hyphenated_to_fit_lines() -> None:
    long = "Pneumonoultramicroscopicsilicovolcanoconiosis" * 2  # 90 characters
    cues = lay_out(LayoutConfig(max_chars_per_line=32), f"He said {long} twice.", 2.0)
    lines = [line for cue in cues for line in cue.lines]
    assert all(len(line) <= 32 for line in lines)
    assert cue_words(cues) == ["He", "said", long, "twice."]


@pytest.mark.parametrize("n_filler", range(0, 12))
def test_never_breaks_after_article_preposition_or_before_a_unit(n_filler: int) -> None:
    filler = " ".join(["word"] * n_filler)
    text = (
        f"{filler} we met the president of the republic in a small town and 25 percent "
        f"of the voters said that 10 km is far for an old man with a bad leg"
    )
    for chars in (32, 42):
        cues = lay_out(LayoutConfig(max_chars_per_line=chars), text.strip(), 3.0)
        for cue in cues:
            for line in cue.lines:
                last = line.split()[-1].lower()
                assert last not in GLUE_WORDS, (chars, cue.lines)
                assert not re.fullmatch(r"\d+", last), (chars, cue.lines)  # "25 | percent"


def test_breaks_prefer_punctuation_and_tagger_preference() -> None:
    text = "Well after all the long talks, we finally agreed on a plan for the summer"
    cues = lay_out(LayoutConfig(), text, 3.0)
    assert cues[0].lines[0] == "Well after all the long talks,"
    words = list(script_words("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda"))
    words[3] = TaggedWord(words[3].word, words[3].text, break_after=1.0)  # break after "delta"
    layout = CueLayout(LayoutConfig(max_chars_per_line=40))
    cues = layout.push(words, words[-1].word.end_ns) + layout.finish()
    assert cues[0].lines[0] == "alpha beta gamma delta"


@pytest.mark.parametrize("break_after", [0.0, 0.9, 1.0])
def test_a_cue_that_fits_on_one_line_is_one_line(break_after: float) -> None:
    """A good break place is no reason to break a line that fits (JFK at D = 2 s: "And", a
    pause the tagger reads as a break, then "so," was shown as two one-word lines)."""
    words = list(script_words("And so,", words_per_s=2))
    words[0] = TaggedWord(words[0].word, words[0].text, break_after=break_after)
    after = script_words("my fellow Americans", words_per_s=3,
                         start_ns=words[-1].word.end_ns + 2000 * MS)
    layout = CueLayout()
    cues = layout.push([*words, *after], after[-1].word.end_ns) + layout.finish()
    assert [c.lines for c in cues] == [("And so,",), ("my fellow Americans",)]


def test_numbers_are_kept_whole() -> None:
    cues = lay_out(LayoutConfig(max_chars_per_line=32), "It cost 1,250,000 dollars in 2024.", 2)
    assert cue_words(cues) == ["It", "cost", "1,250,000", "dollars", "in", "2024."]
    assert any("1,250,000 dollars" in line for cue in cues for line in cue.lines)


def test_apply_marks_the_open_cue_uncommitted() -> None:
    layout = CueLayout()
    word = TaggedWord(Word("hello", 0, 300 * MS), "Hello", case="cap")
    state = layout.apply(CaptionState(k=0, due_ns=0, audio_end_ns=400 * MS, committed=(word,)))
    assert state.cues == (Cue(1, 0, 300 * MS, ("Hello",), committed=False),)


def test_the_open_cue_is_laid_out_again_only_when_its_words_change() -> None:
    """Each tick's open cue is the one its words give now, yet ticks that bring no word and
    close no cue reuse the last layout (30 a second per channel, most of them without words)."""
    layout = CueLayout()
    fresh = layout._lay_out_open
    calls = []
    layout._lay_out_open = lambda: calls.append(1) or fresh()  # type: ignore[method-assign]
    ticks = changed = 0
    for state in script_states(script_words(SPEECH, words_per_s=2.5)):
        n_before = layout.stats.n_cues
        out = layout.apply(state)
        ticks += 1
        changed += bool(state.committed) or layout.stats.n_cues != n_before
        open_now = [c for c in out.cues if not c.committed]
        assert open_now == ([fresh()] if fresh() is not None else [])
    assert changed < ticks / 4  # the script: words every 0.4 s, ticks every 33 ms
    assert len(calls) <= changed + 1


def test_case_and_punctuation_are_applied() -> None:
    word = TaggedWord(Word("bbc", 0, 1), "bbc", punct="?", case="upper")
    assert token_of(word).text == "BBC?"


def test_rollup_shows_last_lines_with_tentative_tail_apart() -> None:
    config = LayoutConfig(max_chars_per_line=32, mode="rollup")
    rollup = RollUp(config)
    for state in script_states(script_words()):
        rollup.push(state.committed)
        display = rollup.display(state.tentative)
        assert len(display) <= 2
        for line in display:
            assert len(line.text) <= 32
        for line in display[:-1]:  # a finished line never ends with an article/preposition
            assert line.text.split()[-1].lower() not in GLUE_WORDS, display
    final = rollup.display("")
    assert final[-1].committed.endswith("good night.")
    tail = rollup.display("and then some")
    assert tail[-1].tentative.endswith("some") and "some" not in tail[-1].committed


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("max_chars_per_line", 5, "[layout] max_chars_per_line = 5: must be in 16..80"),
        ("max_cps", 0.0, "[layout] max_cps"),
        ("mode", "scroll", "must be one of 'popon', 'rollup'"),
        ("fps", "abc", "[layout] fps = 'abc'"),
        ("colour", 1, "unknown key 'colour'"),
        ("max_lines", "2", "expected int"),
    ],
)
def test_bad_config_is_one_line_error(key: str, value: object, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        LayoutConfig.from_mapping({key: value})
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_fractional_fps_gap_is_two_whole_frames() -> None:
    config = LayoutConfig(fps="30000/1001")
    assert config.gap_ns >= 2 * 1001 * 1_000_000_000 / 30000
    assert config.gap_ns - 2 * 1001 * 1_000_000_000 / 30000 < 3


def test_a_word_committed_cut_short_is_never_broken_from_its_rest() -> None:
    """The rest of a word committed cut short ("am" + "iable": ``Word.joined``) arrives in a
    later update. The line or cue it fills must not break between the two: a viewer read "made
    am" over "iable himself" (a line break was as good as a space there). The head moves down
    with its rest, in pop-on cues of one or two lines and in roll-up."""
    s = 320_000_000
    head = [Word(t, i * s, i * s + s - 20_000_000)
            for i, t in enumerate("he might even have been made am".split())]
    n = len(head)
    rest = Word("iable", n * s, n * s + s - 20_000_000, joined=True)
    after = [Word(t, (n + 1 + i) * s, (n + 1 + i) * s + s - 20_000_000)
             for i, t in enumerate("himself and then some more".split())]

    def tw(ws: list[Word]) -> list[TaggedWord]:
        return [TaggedWord(w, w.text, "", "lower", 0.0, True) for w in ws]

    for chars, lines in ((37, 2), (16, 2), (16, 1), (32, 1)):
        layout = CueLayout(LayoutConfig(max_chars_per_line=chars, max_lines=lines))
        cues = layout.push(tw(head), head[-1].end_ns)  # the rest comes with a later tick
        cues += layout.push(tw([rest]), rest.end_ns)
        cues += layout.push(tw(after), after[-1].end_ns) + layout.finish()
        shown = [w for c in cues for line in c.lines for w in line.split()]
        assert "amiable" in shown, (chars, lines, [c.lines for c in cues])
        assert shown == "he might even have been made amiable himself and then some more".split()
    roll = RollUp(LayoutConfig(mode="rollup", max_chars_per_line=34, max_lines=2))
    roll.push(tw(head))
    roll.push(tw([rest, *after]))
    assert [line.committed for line in roll.display()] == [
        "he might even have been made", "amiable himself and then some more"]


def test_the_rest_of_a_word_whose_cue_closed_starts_the_next_cue_whole() -> None:
    """A pause closed the cue ending in the head of a word committed cut short ("made am"),
    then its rest arrived ("iable", ``Word.joined``): the closed cue cannot change, and the
    next one read "iable himself". It shows the whole word: "amiable himself"."""
    s = 320_000_000
    head = [Word(t, i * s, i * s + s - 20_000_000)
            for i, t in enumerate("he might even have been made am".split())]
    n = len(head)
    rest = Word("iable", n * s, n * s + s - 20_000_000, joined=True)
    after = [Word("himself", (n + 1) * s, (n + 2) * s - 20_000_000)]

    def tw(ws: list[Word]) -> list[TaggedWord]:
        return [TaggedWord(w, w.text, "", "lower", 0.0, True) for w in ws]

    config = LayoutConfig(max_chars_per_line=37, max_lines=2)
    layout = CueLayout(config)
    # the audio runs on past the flush time with nothing tentative: the cue closes
    closed = layout.push(tw(head), head[-1].end_ns + (config.flush_after_ms + 10) * 1_000_000)
    assert [c.lines for c in closed] == [("he might even have been made am",)]
    cues = layout.push(tw([rest, *after]), after[-1].end_ns) + layout.finish()
    assert [c.lines for c in cues] == [("amiable himself",)]
    # a rest after a mark is no part of the word before it ("letter," + "press")
    layout = CueLayout(config)
    marked = [TaggedWord(w, w.text, "," if w is head[-1] else "", "lower", 0.0, True)
              for w in head]
    layout.push(marked, head[-1].end_ns + (config.flush_after_ms + 10) * 1_000_000)
    cues = layout.push(tw([rest]), rest.end_ns) + layout.finish()
    assert [c.lines for c in cues] == [("iable",)]
