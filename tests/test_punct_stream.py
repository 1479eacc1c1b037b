"""Streaming punctuation: decided only with right context, and never taken back."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from subd.errors import ConfigError
from subd.models.punct import PunctTagger, render
from subd.punct.stream import PunctConfig, PunctStream
from subd.types import Hypothesis, Word

MS = 1_000_000
TEXT = (
    "where are you going i am going home it is late and the bus has gone "
    "so we walked all the way back to the house by the river did you see the 3 dogs "
    "they're mine élodie said they were hers but i don't believe her "
) * 3


@pytest.fixture(scope="module")
def tagger() -> PunctTagger:
    return PunctTagger.load()


def _timed(text: str, rng: random.Random, marks: bool = False) -> list[Word]:
    """Timed words; with ``marks`` spelled as a noisy recogniser might ("Home." "going,")."""
    out, t = [], 0
    for w in text.split():
        dur = 150 + 40 * len(w)
        if marks and rng.random() < 0.2:
            w = rng.choice([w.capitalize(), w]) + rng.choice([".", ",", "?", ""])
        out.append(Word(w, t * MS, (t + dur) * MS))
        t += dur + (rng.choice([20, 40, 60, 500, 900]) if rng.random() < 0.15 else 30)
    return out


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"\[punct\] right_context_words must be in 1\.\.32"):
        PunctConfig(right_context_words=0)
    with pytest.raises(ConfigError, match="pause_commit_ms"):
        PunctConfig(pause_commit_ms="fast")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_pending_words"):
        PunctConfig(right_context_words=8, max_pending_words=4)
    with pytest.raises(ConfigError, match="left_context_words"):
        PunctConfig(left_context_words=0)
    with pytest.raises(ConfigError, match="recogniser_marks must be true or false"):
        PunctConfig(recogniser_marks="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"comma_weight must be in 0\.0\.\.1\.0"):
        PunctConfig(comma_weight=1.5)
    assert PunctConfig(right_context_words=5).right_context_words == 5


@pytest.mark.parametrize("seed", range(6))
def test_committed_punctuation_is_never_retracted(tagger: PunctTagger, seed: int) -> None:
    rng = random.Random(seed)
    words = _timed(TEXT, rng, marks=seed % 2 == 0)
    cfg = PunctConfig(right_context_words=rng.randint(1, 5),
                      pause_commit_ms=rng.choice([200.0, 350.0, 800.0]),
                      left_context_words=rng.choice([1, 4, 16]),
                      recogniser_marks=seed % 3 != 0)
    stream = PunctStream(tagger, cfg)
    finals = []
    i = 0
    while i < len(words):
        committed = words[i : i + rng.randint(0, 5)]
        i += len(committed)
        # The tentative tail may be wrong: the recogniser revises it later.
        tentative = [Word(rng.choice(["uh", w.text, "the"]), w.start_ns, w.end_ns)
                     for w in words[i : i + rng.randint(0, 6)]]
        last = (tentative or committed or words[max(0, i - 1) : i])[-1]
        audio_end = last.end_ns + rng.randint(0, 1200) * MS
        before = render(finals)
        update = stream.update(committed, tentative, audio_end)
        assert all(t.final for t in update.final)
        assert not any(t.final for t in update.provisional)
        finals += update.final
        # What was shown stays: the finals so far only ever grow at the end.
        assert render(finals).startswith(before)
        # Decided words are exactly the committed words, in order, each once.
        assert [t.word for t in finals] == words[: len(finals)]
        assert len(finals) + stream.n_pending == i
        assert [t.word for t in update.provisional[: stream.n_pending]] == \
            words[len(finals) : i]
        if rng.random() < 0.3:  # the tag stage may be asked again without news
            again = stream.update((), tentative, audio_end)
            finals += again.final
            assert [t.word for t in finals] == words[: len(finals)]
    finals += stream.flush().final
    assert [t.word for t in finals] == words
    assert stream.n_pending == 0
    for prev, cur in zip(finals, finals[1:], strict=False):
        if prev.punct in {".", "?", "!"}:
            assert cur.case != "lower"  # a decided sentence end is followed by a capital
    assert finals[0].case == "cap"


def test_chunk_edge_waits_for_right_context(tagger: PunctTagger) -> None:
    rng = random.Random(0)
    words = _timed("i went to the market and then we walked home together", rng)
    words = [Word(w.text, i * 300 * MS, (i * 300 + 250) * MS) for i, w in enumerate(words)]
    edge = 7  # "then" ends the first chunk
    stream = PunctStream(tagger, PunctConfig(right_context_words=3, pause_commit_ms=400.0))
    first = stream.update(words[:edge], (), words[edge - 1].end_ns + 100 * MS)
    assert [t.word.text for t in first.final] == ["i", "went", "to", "the"]
    assert [t.word.text for t in first.provisional] == ["market", "and", "then"]
    later = stream.update(words[edge:], (), words[-1].end_ns + 100 * MS)
    done = stream.flush()
    finals = [*first.final, *later.final, *done.final]
    assert [t.word for t in finals] == words
    assert finals[edge - 1].punct == ""  # "then": no sentence break at the chunk edge
    assert finals[edge].text == "we"  # and no capital after it
    assert render(finals).startswith("I went to the market")
    assert render(finals).endswith(" and then we walked home together.")


def test_long_pause_decides_without_right_words(tagger: PunctTagger) -> None:
    words = [Word(w, i * 300 * MS, (i * 300 + 250) * MS)
             for i, w in enumerate("i am going home".split())]
    # words without the recogniser's spelling: decided on words and pauses alone
    stream = PunctStream(tagger, PunctConfig(right_context_words=5, pause_commit_ms=400.0,
                                             recogniser_marks=False))
    short = stream.update(words, (), words[-1].end_ns + 100 * MS)
    assert short.final == ()
    # 900 ms after the last word recognised so far: maybe silence, maybe a word the recogniser
    # has not transcribed yet; not enough to decide on
    unsure = stream.update((), (), words[-1].end_ns + 900 * MS)
    assert unsure.final == ()
    long = stream.update((), (), words[-1].end_ns + 1300 * MS)
    assert render(long.final) == "I am going home."


def test_pause_before_a_known_word_decides_at_once(tagger: PunctTagger) -> None:
    words = [Word(w, i * 300 * MS, (i * 300 + 250) * MS)
             for i, w in enumerate("i am going home".split())]
    nxt = Word("then", words[-1].end_ns + 500 * MS, words[-1].end_ns + 750 * MS)
    cfg = PunctConfig(right_context_words=5, pause_commit_ms=400.0)
    # the same 500 ms: between two recognised words it is a pause ...
    between = PunctStream(tagger, cfg).update(words, (nxt,), nxt.end_ns)
    assert [t.word.text for t in between.final] == ["i", "am", "going", "home"]
    # ... after the last word so far it is not known to be one
    trailing = PunctStream(tagger, cfg).update(words, (), words[-1].end_ns + 500 * MS)
    assert trailing.final == ()


def test_trailing_pause_setting_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"trailing_pause_commit_ms must be in 50\.0\.\.10000"):
        PunctConfig(trailing_pause_commit_ms=20000.0)


def test_update_from_hypothesis(tagger: PunctTagger) -> None:
    words = [Word(w, i * 300 * MS, (i * 300 + 250) * MS)
             for i, w in enumerate("what time is it".split())]
    stream = PunctStream(tagger, PunctConfig(right_context_words=2))
    up = stream.update_from(Hypothesis(tuple(words[:3]), tuple(words[3:]), words[-1].end_ns))
    assert [t.word.text for t in up.final] == ["what", "time"]
    assert up.final[0].text == "What"
    assert [t.word.text for t in up.provisional] == ["is", "it"]


def test_recogniser_marks_reach_the_tagger(tagger: PunctTagger) -> None:
    # Whisper heard a question (intonation) that the words alone do not show.
    spelled = "you are going home? i thought you would stay."
    words = [Word(w, i * 300 * MS, (i * 300 + 250) * MS) for i, w in enumerate(spelled.split())]
    words[4:] = [Word(w.text, w.start_ns + 600 * MS, w.end_ns + 600 * MS) for w in words[4:]]
    shown = {}
    for use in (True, False):
        stream = PunctStream(tagger, PunctConfig(recogniser_marks=use))
        first = stream.update_from(Hypothesis(tuple(words[:6]), tuple(words[6:]),
                                              words[-1].end_ns))
        rest = stream.update_from(Hypothesis(tuple(words[6:]), (), words[-1].end_ns))
        done = stream.flush(words[-1].end_ns + 900 * MS)
        shown[use] = render([*first.final, *rest.final, *done.final])
    assert shown[True] == "You are going home? I thought you would stay."
    assert shown[False] != shown[True]


class _EchoTagger:
    """Stand-in tagger that believes the recogniser's marks completely (the worst case for
    window-edge full stops); pinned words keep their tags."""

    def tag(self, words, pauses_ms=None, right_context_complete=True, fixed=None,
            stream_start=True, recogniser=None):
        from subd.models.punct import WordTag

        out = []
        for i, _ in enumerate(words):
            if fixed is not None and fixed[i] is not None:
                out.append(WordTag(fixed[i][0], fixed[i][1], 0.0))
                continue
            mark = recogniser[i].punct if recogniser and recogniser[i] is not None else ""
            starts = out[-1].punct in (".", "?", "!") if out else stream_start
            out.append(WordTag(mark, "cap" if starts else "lower", 0.0))
        return out


def _two_decodes(gap_ms: int, first_text: str = "i went to the market and then.") -> str:
    """"and then." ends the first decode (nothing decoded after it), then ``gap_ms`` of
    silence, then the sentence goes on."""
    first = [Word(w, i * 300 * MS, (i * 300 + 250) * MS)
             for i, w in enumerate(first_text.split())]
    t0 = first[-1].end_ns + gap_ms * MS
    rest = [Word(w, t0 + i * 300 * MS, t0 + (i * 300 + 250) * MS)
            for i, w in enumerate("we walked home.".split())]
    stream = PunctStream(_EchoTagger(), PunctConfig(right_context_words=3, pause_commit_ms=350.0))
    shown = [*stream.update_from(Hypothesis(tuple(first), (), first[-1].end_ns)).final]
    shown += stream.update_from(Hypothesis(tuple(rest), (), rest[-1].end_ns)).final
    shown += stream.flush(rest[-1].end_ns).final
    return render(shown)


def test_a_full_stop_at_the_decode_edge_alone_breaks_no_sentence() -> None:
    # no pause and no word says the sentence ended: the recogniser's edge mark is set aside
    assert _two_decodes(gap_ms=50) == "I went to the market and then we walked home."


def test_a_full_stop_at_the_decode_edge_with_a_real_pause_stands() -> None:
    assert _two_decodes(gap_ms=600) == "I went to the market and then. We walked home."


def test_a_question_mark_at_the_decode_edge_stands_without_a_pause() -> None:
    # Whisper closes a decode with a full stop whatever was said, not with a question mark
    assert _two_decodes(gap_ms=50, first_text="what do you think?") == (
        "What do you think? We walked home.")


def test_a_full_stop_with_words_decoded_after_it_is_evidence() -> None:
    words = [Word(w, i * 300 * MS, (i * 300 + 250) * MS)
             for i, w in enumerate("it is late. we walked home.".split())]
    stream = PunctStream(_EchoTagger(), PunctConfig(right_context_words=2))
    shown = [*stream.update_from(Hypothesis(tuple(words[:3]), tuple(words[3:]),
                                            words[-1].end_ns)).final]
    shown += stream.update_from(Hypothesis(tuple(words[3:]), (), words[-1].end_ns)).final
    shown += stream.flush(words[-1].end_ns).final
    assert render(shown) == "It is late. We walked home."
    assert stream.n_edge_marks_set_aside == 0


def test_a_tentative_word_that_starts_early_is_no_pause(tagger: PunctTagger) -> None:
    # Word times move between decodes: the next decode's first tentative word may start a
    # little before the last committed word ends. It is still the next word, not a gap.
    words = [Word(w, i * 300 * MS, (i * 300 + 250) * MS)
             for i, w in enumerate("we will meet again".split())]
    end = words[-1].end_ns
    tentative = (Word("on", end - 120 * MS, end + 150 * MS),
                 Word("tuesday", end + 700 * MS, end + 1000 * MS))
    stream = PunctStream(tagger, PunctConfig(right_context_words=3, pause_commit_ms=350.0))
    up = stream.update_from(Hypothesis(tuple(words), tentative, tentative[-1].end_ns))
    assert [t.word.text for t in up.final] == ["we", "will", "meet"]  # "again" waits
    assert [t.word.text for t in up.provisional] == ["again", "on", "tuesday"]


def _paused_after(spelled: list[str], word: str) -> tuple[list[Word], int]:
    """``spelled`` timed 300 ms a word with a 400 ms pause after ``word``; and how many words
    run up to and including it."""
    words, t = [], 0
    for w in spelled:
        words.append(Word(w, t * MS, (t + 250) * MS))
        t += 300 + (400 if w == word else 0)
    return words, spelled.index(word) + 1


@pytest.mark.parametrize("tagger_commas", [True, False])
def test_a_comma_the_recogniser_left_out_is_the_taggers_to_add(
        tagger: PunctTagger, tagger_commas: bool) -> None:
    """Deadline mode: Whisper, with words decoded after it, wrote "antecedents" bare (LibriVox
    0920, "... nothing of my antecedents, nor of the circumstances ..."; offline it writes the
    comma). Its own marks stand where it wrote them; where it wrote none, the tagger's comma
    is kept."""
    spelled = ("If the reader will excuse me, I will say nothing of my antecedents nor of the "
               "circumstances which led me to leave my native country.").split()
    words, n = _paused_after(spelled, "antecedents")
    stream = PunctStream(tagger, PunctConfig(tagger_commas=tagger_commas))
    out = stream.update(words[:n + 3], words[n + 3:], words[-1].end_ns,
                        decide_until_ns=words[n - 1].end_ns)
    shown = render(out.final)
    assert shown.startswith("If the reader will excuse me,"), shown  # Whisper's own comma
    assert shown.endswith("antecedents,") == tagger_commas, shown


@pytest.mark.parametrize(("decoded_after", "shown"), [(3, "antecedents,"), (5, "antecedents.")])
def test_a_full_stop_whisper_wrote_with_little_after_it_is_the_taggers_to_decide(
        tagger: PunctTagger, decoded_after: int, shown: str) -> None:
    """Deadline mode on one core (D = 2 s): the decode that decides "antecedents" heard a pause
    and three words after it, and wrote "antecedents. Nor of the" (offline, with the whole
    sentence: "antecedents, nor of the circumstances"). With so little decoded after it the
    mark is the tagger's, which reads a comma; with more, Whisper's own full stop stands."""
    spelled = ("If the reader will excuse me, I will say nothing of my antecedents. Nor of the "
               "circumstances which led me").split()
    words, n = _paused_after(spelled, "antecedents.")
    after = words[n:n + decoded_after]
    out = PunctStream(tagger).update(words[:n], after, after[-1].end_ns,
                                     decide_until_ns=words[n - 1].end_ns)
    assert render(out.final).endswith(shown), render(out.final)


def _weighed(words: list[Word], word: str, probs: tuple[float, float] | None) -> list[Word]:
    """``words`` with Whisper's mark probabilities ``probs`` (p('.'), p(',')) on ``word``."""
    return [replace(w, mark_p=probs) if w.text == word else w for w in words]


@pytest.mark.parametrize(("probs", "config", "shown"), [
    ((0.45, 0.31), PunctConfig(), "feats of strength, round his"),
    ((0.80, 0.10), PunctConfig(), "feats of strength. Round his"),  # a sure full stop
    ((0.45, 0.15), PunctConfig(), "feats of strength. Round his"),  # a comma barely weighed
    (None, PunctConfig(), "feats of strength. Round his"),          # not known
    ((0.45, 0.31), PunctConfig(comma_weight=0.0), "feats of strength. Round his"),  # off
])
def test_a_full_stop_whisper_was_unsure_of_is_a_comma_where_it_weighed_one(
        tagger: PunctTagger, probs: tuple[float, float] | None, config: PunctConfig,
        shown: str) -> None:
    """Deadline mode at D = 2 s (dev, LibriTTS 5895): the decode that decided "strength" had
    1.5 s of audio after it and wrote "strength. Round his neck", unsure (p('.') 0.45, p(',')
    0.31); with 3 s Whisper writes the comma that the sentence has. The comma it weighed is
    written, and the word after it keeps no capital the full stop alone gave it."""
    spelled = ("Gwynplain had besides for his work and for his feats of strength. Round his "
               "neck and over his shoulders").split()
    words, n = _paused_after(spelled, "strength.")
    words = _weighed(words, "strength.", probs)
    stream = PunctStream(tagger, config)
    out = stream.update(words[:n + 2], words[n + 2:], words[-1].end_ns,
                        decide_until_ns=words[n + 1].end_ns)
    assert render(out.final).endswith(shown), render(out.final)


def test_a_comma_whisper_weighed_but_left_out_is_written(tagger: PunctTagger) -> None:
    """Held to its deadline Whisper left out a comma it already weighed (dev, LJ001-0012,
    "the wood cutters of the Netherlands, by a similar process": p(',') 0.25 with 1.5 s after
    it); not weighed, no comma is added; and the rule is for deadline decisions only."""
    spelled = ("for centuries before the wood cutters of the Netherlands by a similar process "
               "of printing").split()
    words, n = _paused_after(spelled, "Netherlands")
    for probs, deadline, shown in (((0.02, 0.25), True, "Netherlands, by"),
                                   ((0.02, 0.05), True, "Netherlands by"),
                                   ((0.02, 0.25), False, "Netherlands by")):
        timed = _weighed(words, "Netherlands", probs)
        until = timed[n + 1].end_ns if deadline else None
        out = PunctStream(tagger).update(timed[:n + 2], timed[n + 2:], timed[-1].end_ns,
                                         decide_until_ns=until)
        text = render([*out.final, *out.provisional])
        assert shown in text, (probs, deadline, text)


def test_a_streams_last_word_keeps_its_full_stop_when_due_at_the_flush() -> None:
    """The end of a stream: the recogniser's last decode commits "read." (nothing decoded after
    it, a window edge), due at once, in the tag pass that also flushes. Decided first as a
    deadline word, the edge rule set the mark aside and the stream ended "easier to read"
    (LJ001-0025, held-out, D = 0.5 s); the flush decides it knowing the stream ends there."""
    from subd.workers.hosts import FactorySpec, TagHost, TagRequest

    host = TagHost(FactorySpec("subd.workers.hosts:make_punct_stream"))
    text = "it imitates a much freer hand and therefore far pleasanter and easier to".split()
    words = [Word(t, i * 300 * MS, (i * 300 + 250) * MS) for i, t in enumerate(text)]
    first = host.handle(TagRequest(0, 0, tuple(words), (), words[-1].end_ns,
                                   decide_until_ns=words[-1].end_ns))
    last = Word("read.", words[-1].end_ns + 50 * MS, words[-1].end_ns + 400 * MS)
    end = host.handle(TagRequest(1, len(words), (last,), (), last.end_ns, flush=True,
                                 decide_until_ns=last.end_ns))
    final = [*first.final, *end.final]
    assert [tw.word.text for tw in final] == [*text, "read."]
    assert final[-1].punct == "."


def test_a_tagger_whose_flush_takes_no_words_still_gets_the_streams_last_words() -> None:
    """A third-party tagger with the plain ``flush(audio_end_ns)`` gets the last committed
    words in one last ``update``, then its flush; none is lost at the end of the stream."""
    from subd.workers.hosts import TagHost, TagRequest

    host = TagHost(None)  # the pass-through tagger: flush(audio_end_ns) only
    words = (Word("so", 0, 200 * MS), Word("long.", 250 * MS, 600 * MS))
    end = host.handle(TagRequest(0, 0, words, (), words[-1].end_ns, flush=True,
                                 decide_until_ns=words[-1].end_ns))
    assert [tw.text for tw in end.final] == ["so", "long."] and end.provisional == ()
    assert end.first_final_idx == 0 and host.n_final == 2


def test_a_title_keeps_its_period_which_ends_no_sentence(tagger: PunctTagger) -> None:
    # the stream showed "And Mr John Dashwood" where the recogniser and `subd transcribe`
    # write "Mr.": the tagger sees "mr" (its period is no mark), and the display dropped it
    words = [Word(w, i * 300 * MS, (i * 300 + 250) * MS)
             for i, w in enumerate("and Mr. John Dashwood had then leisure to consider".split())]
    stream = PunctStream(tagger, PunctConfig(right_context_words=2))
    up = stream.update_from(Hypothesis(tuple(words), (), words[-1].end_ns))
    assert render([*up.final, *up.provisional]).startswith("And Mr. John Dashwood had")
    # a recogniser that wrote it without the period is shown as it wrote it
    words[1] = Word("Mr", words[1].start_ns, words[1].end_ns)
    stream = PunctStream(tagger, PunctConfig(right_context_words=2))
    up = stream.update_from(Hypothesis(tuple(words), (), words[-1].end_ns))
    assert render([*up.final, *up.provisional]).startswith("And Mr John")


def test_a_tail_weighed_anew_is_tagged_anew(tagger: PunctTagger) -> None:
    """Two decodes may read the same tentative words at the same times (Whisper's 20 ms steps
    from the same window start) and weigh their marks differently: the second reading is
    tagged, not the first one's tags reused."""
    spelled = ("for centuries before the wood cutters of the Netherlands by a similar process "
               "of printing").split()
    words, _ = _paused_after(spelled, "Netherlands")
    stream = PunctStream(tagger)
    shown = []
    for probs in ((0.02, 0.05), (0.02, 0.25), (0.02, 0.05)):
        tail = _weighed(words, "Netherlands", probs)
        out = stream.update([], tail, tail[-1].end_ns, decide_until_ns=0)
        assert not out.final
        shown.append(render(out.provisional))
    assert "Netherlands by" in shown[0], shown
    assert "Netherlands, by" in shown[1], shown
    assert shown[2] == shown[0], shown
