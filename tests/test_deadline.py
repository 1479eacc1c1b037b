"""Deadline-aware decisions (DESIGN, "The promise" 5): a word is decided as late as its tick's
look-ahead fetch allows, from the hypothesis with the most right context, and still in time when
D is short. Committed text never changes."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import numpy as np
import pytest

from subd.clock import FakeClock
from subd.history import AudioHistory
from subd.pipeline.scheduler import Pipeline, TickSettings
from subd.pipeline.ticks import TickGrid
from subd.punct.stream import PunctStream
from subd.recognise.streaming import StreamingRecognizer
from subd.sources.decode import load_audio
from subd.sources.live import FileSource
from subd.types import SAMPLE_RATE_HZ, AudioChunk, Hypothesis, Word
from subd.workers.hosts import FactorySpec, RecogniserHost, TagHost, UpdateRequest
from subd.workers.process import InlineWorker
from tests.test_scheduler import ListSink
from tests.test_streaming import _ScriptedEngine, _voiced

MS = 1_000_000
T0_NS = 5_000_000_000


# ---- the recogniser's commit policy -------------------------------------------------------------


@pytest.fixture(scope="module")
def voiced(speech_clips) -> np.ndarray:
    return _voiced(load_audio(speech_clips[0].path), 160)  # 4.8 s the VAD calls speech


def _feed(rec: StreamingRecognizer, audio: np.ndarray, end_s: float) -> None:
    end = int(end_s * SAMPLE_RATE_HZ)
    rec.accept(AudioChunk(rec.audio.end_sample, audio[rec.audio.end_sample:end]))


# Whisper's guess at "ill-disposed" changes as it hears more: the early decodes agree on the
# wrong word with high probability (what LocalAgreement commits), the later ones correct it.
EARLY = [("an", 0.2, 0.4, 0.9), ("old-sposed", 0.4, 1.0, 0.9), ("young", 1.0, 1.3, 0.9)]
LATE = [("an", 0.2, 0.4, 0.9), ("ill-disposed", 0.4, 1.0, 0.9), ("young", 1.0, 1.3, 0.9),
        ("man,", 1.3, 1.6, 0.9)]


def test_a_decode_that_reads_nothing_of_speech_keeps_the_last_reading(voiced):
    """Whisper on the cut span at a stream's start read "and Mr." from 0.64 s of audio,
    nothing from 1.08 and 1.28 s, then "Mr. John": the word due in
    between is taken from the last reading, not lost with the empty one."""
    first = [("and", 0.1, 0.3, 0.9), ("Mr.", 0.3, 0.6, 0.9)]
    later = [("Mr.", 0.28, 0.6, 0.9), ("John", 0.6, 0.9, 0.9), ("Dashwood", 0.9, 1.4, 0.9)]
    rec = StreamingRecognizer(engine=_ScriptedEngine(first, [], later),
                              confident_min_probability=1.0)
    _feed(rec, voiced, 0.8)
    assert rec.update(commit_until_ns=0).committed == ()
    _feed(rec, voiced, 1.2)
    hyp = rec.update(commit_until_ns=400 * MS)  # the empty decode: "and" is due
    assert [w.text for w in hyp.committed] == ["and"]
    assert [w.text for w in hyp.tentative] == ["Mr."]
    _feed(rec, voiced, 1.6)
    hyp = rec.update(commit_until_ns=1000 * MS)
    assert [w.text for w in hyp.committed] == ["Mr.", "John"]


def test_a_decode_that_reads_nothing_of_speech_moves_the_window_to_what_it_left_out(voiced):
    """... and when the speech it left out is heard out for a second, the window moves to the
    commit point at once, as after any decode that leaves speech out (a stall): AISHELL at
    D = 2 s (zh-dev, 2026-12-07), a 7 s window read "也" and then nothing three times, and
    "也注退了" came 1.2 s later, when the window was trimmed for its length, 0.2-0.4 s late."""
    first = [("and", 0.1, 0.3, 0.9), ("Mr.", 0.3, 0.6, 0.9)]
    rec = StreamingRecognizer(engine=_ScriptedEngine(first, []), confident_min_probability=1.0)
    _feed(rec, voiced, 0.8)
    assert rec.update(commit_until_ns=0).committed == ()
    _feed(rec, voiced, 2.4)
    hyp = rec.update(commit_until_ns=400 * MS)  # nothing read: "and" due from the last reading
    assert [w.text for w in hyp.committed] == ["and"]
    assert rec.state.stalled
    assert rec.state.window_start == int(0.1 * SAMPLE_RATE_HZ)  # "and" ends at 0.3 s, less 0.2
    # with less than a second of speech after the commit point left out, the window stays
    rec = StreamingRecognizer(engine=_ScriptedEngine(first, []), confident_min_probability=1.0)
    _feed(rec, voiced, 0.8)
    rec.update(commit_until_ns=0)
    _feed(rec, voiced, 1.2)
    rec.update(commit_until_ns=400 * MS)
    assert not rec.state.stalled and rec.state.window_start == 0


def test_a_word_timed_onto_the_silence_after_it_is_moved_back_to_its_speech(speech_clips):
    """DTW timed zh-dev's utterance-final "了吧" (56.16-56.58 s) at each window's end, three
    decodes in a row, so it was never heard out nor due: shown 2.65 s after it was said at
    D = 2 s. A word that runs 300 ms or more into silence the VAD has decided ends where the
    speech under it (or, moved wholly onto the silence, the speech no word before it accounts
    for) ends; a word whose speech goes on to the audio end is as timed."""
    from subd.history import AudioHistory
    from subd.recognise.settle import overruns_cut
    from subd.recognise.vad import VoiceActivityDetector

    speech = _voiced(load_audio(speech_clips[0].path), 40)  # 1.2 s, speech up to its end
    for silence_s, moved in ((1.5, True), (0.0, False)):
        history = AudioHistory(10 * SAMPLE_RATE_HZ)
        audio = np.concatenate([speech, np.zeros(int(silence_s * SAMPLE_RATE_HZ), np.float32)])
        history.write(0, audio)
        end_ns = len(audio) * 1_000_000_000 // SAMPLE_RATE_HZ
        before = Word("心", 600 * MS, 900 * MS)
        last = Word("了吧", end_ns - 450 * MS, end_ns - 50 * MS)  # at the window's end
        out = overruns_cut(VoiceActivityDetector(), history, [before, last], 0)
        assert out[0] == before
        if moved:
            assert 900 * MS <= out[1].start_ns < out[1].end_ns <= 1300 * MS, out[1]
            assert out[1].end_ns >= 1150 * MS and out[1].text == "了吧"
        else:
            assert out[1] == last
    assert overruns_cut(None, history, [before, last], 0) == [before, last]


def test_a_decode_that_stops_short_keeps_the_last_readings_words_after_it(voiced):
    """Whisper ends a decode before speech at the window's end that it takes for an unfinished
    segment: a decode read "gave them warning that", the next only "gave them" (libri-3436 on
    the cut span). The words the last decode read after it stay the tail, as they were read
    (the tagger's right context; without them the speech after "them" read as a pause and the
    tagger ended a sentence there: "gave them. Warning"), and one that falls due is taken
    from that reading rather than waiting for the next update."""
    full = [("gave", 0.2, 0.5, 0.9), ("them", 0.5, 0.8, 0.9), ("warning", 0.8, 1.3, 0.9),
            ("that", 1.4, 1.7, 0.9)]
    rec = StreamingRecognizer(engine=_ScriptedEngine(full, full[:2], full[:1]),
                              confident_min_probability=1.0)
    _feed(rec, voiced, 2.0)
    assert rec.update(commit_until_ns=0).committed == ()
    _feed(rec, voiced, 2.4)
    hyp = rec.update(commit_until_ns=600 * MS)  # stopped after "them": "gave" is due
    assert [w.text for w in hyp.committed] == ["gave"]
    assert [w.text for w in hyp.tentative] == ["them", "warning", "that"]
    assert hyp.audio_end_ns >= 1700 * MS  # the tail accounts for the speech up to its end
    _feed(rec, voiced, 2.8)
    hyp = rec.update(commit_until_ns=1350 * MS)  # read "gave" alone: "them", "warning" due
    assert [w.text for w in hyp.committed] == ["them", "warning"]
    assert [w.text for w in hyp.tentative] == ["that"]
    # where the two readings do not meet on the new one's last word, nothing is joined
    other = [("gave", 0.2, 0.5, 0.9), ("then", 0.5, 0.8, 0.9)]
    rec = StreamingRecognizer(engine=_ScriptedEngine(full, other),
                              confident_min_probability=1.0)
    _feed(rec, voiced, 2.0)
    rec.update(commit_until_ns=0)
    _feed(rec, voiced, 2.4)
    hyp = rec.update(commit_until_ns=600 * MS)
    assert [w.text for w in hyp.tentative] == ["then"]


def test_a_guess_at_a_window_edge_that_no_later_decode_read_is_not_committed(voiced):
    """At D = 1 s a decode ended "to reap any piece." ("piece." 20 ms before its window's end,
    where Whisper guesses at a word cut short), the next ones stopped after "any", and the
    guess was committed from that reading when due: every later decode, forced to continue
    it, read "piece I have pecuniary". A due word its own decode did not hear out, and read
    unsurely, is dropped: the decode that reads that audio again commits what it reads there.
    One Whisper was sure of is committed: decodes that read nothing after it do not make it
    wrong ("we will not go back. Thank you" lost "will" and "you" that way)."""
    edge = [("to", 0.2, 0.5, 0.9), ("reap", 0.5, 0.8, 0.9), ("piece.", 0.9, 0.98, 0.4)]
    later = [("to", 0.2, 0.5, 0.9), ("reap", 0.5, 0.8, 0.9), ("pecuniary", 0.9, 1.45, 0.9)]
    for stopped in (edge[:2], []):  # a decode that stops short of it, and one that reads nothing
        rec = StreamingRecognizer(engine=_ScriptedEngine(edge, stopped, later),
                                  confident_min_probability=1.0)
        _feed(rec, voiced, 1.0)
        assert rec.update(commit_until_ns=0).committed == ()
        _feed(rec, voiced, 1.2)
        hyp = rec.update(commit_until_ns=1000 * MS)  # every word of the first reading is due
        assert [w.text for w in hyp.committed] == ["to", "reap"]
        assert hyp.tentative == ()
        _feed(rec, voiced, 1.8)
        hyp = rec.update(commit_until_ns=1500 * MS)
        assert [w.text for w in hyp.committed] == ["pecuniary"]
    # heard out (ending 150 ms before its decode's end), or read surely, it is taken when due
    sure = [*edge[:2], ("you.", 0.9, 0.98, 0.92)]
    for script, end_s in ((edge, 1.15), (sure, 1.0)):
        rec = StreamingRecognizer(engine=_ScriptedEngine(script, script[:2]),
                                  confident_min_probability=1.0)
        _feed(rec, voiced, end_s)
        rec.update(commit_until_ns=0)
        _feed(rec, voiced, end_s + 0.2)
        assert [w.text for w in rec.update(commit_until_ns=1000 * MS).committed] == \
            ["to", "reap", script[2][0]]


def test_at_a_streams_end_a_due_guess_waits_for_the_final_decode(voiced):
    """At D = 0.5 s a clip's last word was due before the stream's final decode was in, and
    was committed from a decode that ended on it (its full stop set aside as a window edge's:
    dev '.' F1 0.17). The last update before ``finish`` (``ending``) leaves such a guess to the
    final decode, which reads it with the whole stream heard; one that decode leaves out is
    still committed (``finish``)."""
    edge = [("to", 0.2, 0.5, 0.9), ("reap", 0.5, 0.8, 0.9), ("you.", 0.9, 0.98, 0.92)]
    for final in ([], edge):
        rec = StreamingRecognizer(engine=_ScriptedEngine(edge, final),
                                  confident_min_probability=1.0)
        _feed(rec, voiced, 1.0)
        rec.update(commit_until_ns=0)
        hyp = rec.update(commit_until_ns=1000 * MS, ending=True)  # no new audio: no decode
        assert [w.text for w in hyp.committed] == ["to", "reap"]
        assert [w.text for w in hyp.tentative] == ["you."]
        assert [w.text for w in rec.finish().committed] == ["you."]
        assert rec.engine.n_calls == 2  # the final decode ran


def test_a_word_waits_for_right_context_when_its_deadline_allows(voiced):
    """Long D: the decodes agree on "old-sposed" at once, but its deadline is far; the word
    stays tentative (shown as such) and is decided by the last decode before its deadline,
    the one that heard 1.6 s after it."""
    rec = StreamingRecognizer(engine=_ScriptedEngine(EARLY, EARLY, EARLY, LATE, LATE),
                              confident_min_probability=1.0, agree_context_ms=3000)
    deadline_ns = 1100 * MS  # "old-sposed" (ends 1.0 s) is due by the update at 2.6 s
    committed = []
    for end_s in (1.4, 1.6, 1.8, 2.2, 2.6):
        _feed(rec, voiced, end_s)
        hyp = rec.update(commit_until_ns=deadline_ns if end_s >= 2.6 else 0)
        if end_s < 2.6:
            assert hyp.committed == ()  # agreement alone decides nothing this early
            assert [w.text for w in hyp.tentative][:2] == ["an", EARLY[1][0]
                                                           if end_s < 2.2 else "ill-disposed"]
        committed += hyp.committed
    assert [w.text for w in committed] == ["an", "ill-disposed"]
    assert [w.text for w in rec.update(commit_until_ns=deadline_ns).tentative] == ["young",
                                                                                   "man,"]


def test_an_unsure_change_at_the_deadline_does_not_outvote_a_sure_agreed_reading(voiced):
    """Four decodes read "the Netherlands" surely (0.91-0.95); the one at its deadline, 200 ms
    more audio after it, "nether lens" (0.51 / 0.16), and that was committed. Three decodes
    or more that agreed on a sure reading outvote an unsure change at the deadline. The change
    stands where it is sure (the test above: "old-sposed" -> "ill-disposed", 0.9), where the
    reading it changes was unsure, or where only two decodes had read it ("married him",
    0.69 / 0.52, then "married a", 0.23, as said)."""
    agreed = [("the", 0.2, 0.4, 0.98), ("Netherlands", 0.4, 1.0, 0.93), ("by", 1.1, 1.3, 0.5)]
    unsure = [("the", 0.2, 0.4, 0.98), ("nether", 0.4, 0.75, 0.51), ("lens", 0.75, 1.0, 0.16),
              ("by", 1.1, 1.3, 0.6)]
    sure = [("the", 0.2, 0.4, 0.98), ("neither", 0.4, 0.75, 0.8), ("lens", 0.75, 1.0, 0.7),
            ("by", 1.1, 1.3, 0.6)]
    unsure_agreed = [(w, a, b, 0.2 if w == "Netherlands" else p) for w, a, b, p in agreed]
    changed = ["the", "nether", "lens"]
    for n_before, before, at_deadline, expected in (
            (3, agreed, unsure, ["the", "Netherlands"]),
            (3, agreed, sure, ["the", "neither", "lens"]),
            (3, unsure_agreed, unsure, changed), (2, agreed, unsure, changed)):
        rec = StreamingRecognizer(engine=_ScriptedEngine(*[before] * n_before, at_deadline),
                                  confident_min_probability=1.0, agree_context_ms=3000)
        committed = []
        for i in range(n_before + 1):
            _feed(rec, voiced, 1.6 + 0.2 * i)
            committed += rec.update(commit_until_ns=1050 * MS if i == n_before else 0).committed
        assert [w.text for w in committed] == expected
        assert [w.text for w in rec.update(commit_until_ns=1050 * MS).tentative] == ["by"]


def test_a_short_deadline_is_still_met_from_the_first_hypothesis(voiced):
    """Short D: every word due is committed by the first decode that heard it out, without a
    second opinion (the deadline wins over agreement). A word ending at the audio end may be
    cut short: it waits for the next update rather than put a guess into every later
    decode."""
    rec = StreamingRecognizer(engine=_ScriptedEngine(EARLY, LATE), confident_min_probability=1.0)
    _feed(rec, voiced, 1.35)
    hyp = rec.update(commit_until_ns=1350 * MS)
    assert [w.text for w in hyp.committed] == ["an", "old-sposed"]
    assert [w.text for w in hyp.tentative] == ["young"]  # ends 50 ms before the audio end
    _feed(rec, voiced, 1.6)
    hyp = rec.update(commit_until_ns=1600 * MS)
    assert [w.text for w in hyp.committed] == ["young"]
    assert [w.text for w in hyp.tentative] == ["man,"]


def test_words_heard_out_long_enough_commit_early_on_agreement(voiced):
    """D = 10 s: words two decodes agree on, heard out for agree_context_ms, commit before
    their deadline (they will not change; the decoded tail stays short)."""
    words = [("So", 0.0, 0.1, 0.9), ("he", 0.1, 0.3, 0.9), ("was", 0.3, 0.6, 0.9),
             ("not", 2.0, 2.4, 0.9)]
    rec = StreamingRecognizer(engine=_ScriptedEngine(words), confident_min_probability=1.0,
                              agree_context_ms=3000)
    _feed(rec, voiced, 2.8)  # the stream's first word, at its deadline
    assert [w.text for w in rec.update(commit_until_ns=100 * MS).committed] == ["So"]
    for end_s in (3.0, 3.2):  # "he" heard out for 2.9 s at most: agreed, not yet committed
        _feed(rec, voiced, end_s)
        assert rec.update(commit_until_ns=0).committed == ()
    _feed(rec, voiced, 3.7)
    assert [w.text for w in rec.update(commit_until_ns=0).committed] == ["he", "was"]


def test_a_streams_first_words_wait_for_their_deadline(voiced):
    """Nothing is committed early at a stream's start: Whisper reads its first words from the
    audio after them alone (no words before), and two decodes with 2 s of it agreed on "I'd
    like to" for "Unless to" (LibriVox 0890, dev set, D = 10 s), read right from 3 s on. The
    first words are decided at their deadline, from the decode with the most right context;
    after them agreement commits early as before."""
    early = [("I'd", 0.1, 0.3, 0.9), ("like", 0.3, 0.5, 0.9), ("to", 0.5, 0.7, 0.9),
             ("be", 2.9, 3.1, 0.9)]
    late = [("Unless", 0.1, 0.5, 0.9), ("to", 0.5, 0.7, 0.9), ("be", 2.9, 3.1, 0.9),
            ("rather", 3.1, 3.4, 0.9)]
    rec = StreamingRecognizer(engine=_ScriptedEngine(early, early, early, late, late))
    committed = []
    for end_s, due_ms in ((3.0, 0), (3.2, 0), (3.4, 0), (3.6, 800), (3.8, 800)):
        _feed(rec, voiced, end_s)
        committed += rec.update(commit_until_ns=due_ms * MS).committed
    assert [w.text for w in committed] == ["Unless", "to"]


def test_an_early_agreement_needs_two_seconds_heard_after_the_word(voiced):
    """D = 4 s, defaults: at a stream's start two decodes agree on "latest," ("late news.")
    heard out for 1.1-1.3 s; committed there, the forced prefix made Whisper write the rest of
    the espeak-ng news as one run-on sentence of commas. Agreement waits for 2 s of audio
    after the word, and the later decodes' reading is the one committed."""
    early = [("the", 0.1, 0.3, 0.9), ("latest,", 0.3, 0.9, 0.9)]
    late = [("the", 0.1, 0.3, 0.9), ("late", 0.3, 0.6, 0.9), ("news.", 0.6, 0.9, 0.9),
            ("Tonight,", 1.5, 2.0, 0.9)]
    rec = StreamingRecognizer(engine=_ScriptedEngine(early, early, late, late))
    committed = []
    for end_s, due_ms in ((2.0, 300), (2.2, 0), (2.9, 0), (3.1, 0)):  # "the": at its deadline
        _feed(rec, voiced, end_s)
        committed += rec.update(commit_until_ns=due_ms * MS).committed
    assert [w.text for w in committed] == ["the", "late", "news."]


def test_a_due_word_is_taken_from_the_last_hypothesis_without_a_new_decode(voiced):
    """No new audio for a decode, but a deadline passed: the last hypothesis decides."""
    rec = StreamingRecognizer(engine=_ScriptedEngine(LATE), confident_min_probability=1.0,
                              min_update_ms=200)
    _feed(rec, voiced, 1.8)
    assert rec.update(commit_until_ns=0).committed == ()
    _feed(rec, voiced, 1.9)  # 100 ms: no decode
    hyp = rec.update(commit_until_ns=1000 * MS)
    assert rec.n_decodes == 1
    assert [w.text for w in hyp.committed] == ["an", "ill-disposed"]


@pytest.mark.parametrize("seed", range(4))
def test_committed_text_never_changes_under_any_deadlines(voiced, seed):
    """Hypotheses that keep changing and deadlines at random: committed words only ever add
    up (nothing committed is re-stated or retracted), in time order, and the tentative tail
    always lies after them."""
    rng = random.Random(seed)
    scripts = []
    for _ in range(12):
        t, script = 0.1, []
        for i in range(10):
            dur = rng.uniform(0.15, 0.4)
            script.append((rng.choice([f"w{i}", f"v{i}"]), t, t + dur, rng.uniform(0.05, 1)))
            t += dur + rng.choice([0.02, 0.05, 0.4])
        scripts.append(script)
    rec = StreamingRecognizer(engine=_ScriptedEngine(*scripts), confident_min_probability=1.0)
    committed: list[Word] = []
    for i in range(12):
        _feed(rec, voiced, 1.0 + 0.3 * i)
        hyp = rec.update(commit_until_ns=rng.choice([0, int((0.3 * i + rng.random()) * 1e9)]))
        committed += hyp.committed
        assert rec.state.committed == committed
        if committed:
            assert all(w.end_ns > committed[-1].end_ns for w in hyp.tentative)
    committed += rec.finish().committed
    assert all(a.end_ns <= b.start_ns for a, b in zip(committed, committed[1:], strict=False))
    assert len(committed) >= 5


# ---- the tagger decides at the tick's fetch, not before -------------------------------------


def test_punctuation_is_decided_at_the_deadline_not_before():
    from subd.models.punct import PunctTagger

    stream = PunctStream(PunctTagger.load())
    words = [Word(w, i * 300 * MS, (i * 300 + 250) * MS) for i, w in
             enumerate("we walked all the way back to the house".split())]
    upd = stream.update(words[:6], words[6:], 2500 * MS, decide_until_ns=900 * MS)
    # five words of right context, but only the first three are due by 0.9 s
    assert [t.word.text for t in upd.final] == ["we", "walked", "all"]
    assert all(not t.final for t in upd.provisional)
    upd = stream.update([], words[6:], 2500 * MS, decide_until_ns=0)
    assert upd.final == ()
    upd = stream.update(words[6:], [], 2500 * MS, decide_until_ns=10_000 * MS)
    assert [t.word.text for t in upd.final] == words_text(words[3:])


def words_text(words: list[Word]) -> list[str]:
    return [w.text for w in words]


# ---- the pipeline: deadlines from the tick clock --------------------------------------------


class DeadlineRecognizer:
    """Hears a fixed script; commits exactly what the pipeline says is due (and the rest at
    the end). Records, per committed word, how much audio it had heard when it committed."""

    def __init__(self, n_words: int = 12) -> None:
        self.words = [Word(f"w{i}", (200 + 400 * i) * MS, (500 + 400 * i) * MS)
                      for i in range(n_words)]
        self.audio_end_ns = 0
        self.n = 0
        self.context_ns: list[int] = []
        self.spans: list[bool] = []  # per update: on Whisper's full input
        self.plans: list[tuple] = []  # per update: (audio heard, commit until, full input)

    def accept(self, chunk: AudioChunk) -> None:
        self.audio_end_ns = (chunk.start_sample + chunk.n_samples) * 1_000_000_000 // 16000

    def update(self, commit_until_ns: int | None = None, full_span: bool = False) -> Hypothesis:
        self.spans.append(full_span)
        self.plans.append((self.audio_end_ns, commit_until_ns, full_span))
        heard = [w for w in self.words[self.n:] if w.end_ns <= self.audio_end_ns]
        due = [w for w in heard if commit_until_ns is not None and w.end_ns <= commit_until_ns]
        self.n += len(due)
        self.context_ns += [self.audio_end_ns - w.end_ns for w in due]
        return Hypothesis(tuple(due), tuple(heard[len(due):]), self.audio_end_ns)

    def finish(self) -> Hypothesis:
        rest = tuple(self.words[self.n:])
        self.n = len(self.words)
        return Hypothesis(rest, (), self.audio_end_ns)


def _run_pipeline(latency_ms: int, seconds: float, n_words: int, rec_cost, tag_ms: int = 5,
                  tagger=None, recognizer: str = "DeadlineRecognizer", **settings):
    """DeadlineRecognizer's script through the pipeline on a fake clock where an update lasts
    ``rec_cost(request)`` and a tag pass ``tag_ms``: (sink, recogniser, counters).
    ``tagger``: the tag stage's host (a pass-through by default); ``settings``: more
    TickSettings."""

    async def main():
        clock = FakeClock(start_ns=T0_NS)
        history = AudioHistory(SAMPLE_RATE_HZ * 40)
        spec = FactorySpec(f"tests.test_deadline:{recognizer}", {"n_words": n_words})
        host = RecogniserHost(spec, history.capacity, history=history)
        rec = InlineWorker("recognise", host, clock, rec_cost)
        tag = InlineWorker("tag", tagger or TagHost(None), clock, lambda r: tag_ms * MS)
        sink = ListSink()
        pipeline = Pipeline(
            clock=clock, settings=TickSettings(latency_ms=latency_ms, drain_timeout_s=60,
                                               **settings),
            source=FileSource(np.zeros(int(seconds * SAMPLE_RATE_HZ), np.float32)),
            recogniser=rec, tagger=tag, history=history, sinks=[sink])
        task = asyncio.ensure_future(pipeline.run())
        await clock.run_until_done(task, limit_ns=T0_NS + int((seconds + 60) * 1e9))
        return sink, host.recognizer, pipeline.counters

    return asyncio.run(main())


class SeenByTagger(TagHost):
    """The pass-through tagger, noting what each tag pass was given: the tick, the audio the
    recogniser had heard and the tentative words after the committed ones (right context)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.seen: list[tuple] = []

    def handle(self, request):
        self.seen.append((request.k, request.audio_end_ns,
                          tuple(w.text for w in request.tentative)))
        return super().handle(request)


class ShortReadingRecognizer(DeadlineRecognizer):
    """Every third hypothesis accounts for less of the audio than the one before it (a decode
    that stopped short, its tail dropped): its settled end moves back."""

    def __init__(self, n_words: int = 12) -> None:
        super().__init__(n_words)
        self.settled_ns: list[int] = []

    def update(self, commit_until_ns: int | None = None, full_span: bool = False) -> Hypothesis:
        hyp = super().update(commit_until_ns, full_span)
        if len(self.plans) % 3 == 0 and hyp.committed:
            hyp = Hypothesis(hyp.committed, (), hyp.committed[-1].end_ns + 50 * MS)
        self.settled_ns.append(hyp.audio_end_ns)
        return hyp


def test_the_tagger_reads_the_pause_after_the_last_word_from_the_latest_hypothesis():
    """Where the latest hypothesis accounts for less audio than an earlier one, the speech
    after its last word is no pause: the tagger is given that hypothesis's settled end, not
    the furthest any hypothesis reached (a full stop went after "gave them" where the decode
    that had read "warning that" came before)."""
    seen = SeenByTagger()
    _, recognizer, _ = _run_pipeline(2000, 8.0, 15, lambda r: 150 * MS, tagger=seen,
                                     recognizer="ShortReadingRecognizer")
    ends = [end for _, end, _ in seen.seen]
    assert any(b < a for a, b in zip(ends, ends[1:], strict=False))  # it moved back
    assert set(ends) <= {*recognizer.settled_ns, 0, recognizer.audio_end_ns}  # (the end)


def _tick_of(grid: TickGrid, end_ns: int) -> int:
    """The tick that publishes a word ending at ``end_ns``: the first whose audio reaches it."""
    k = max(0, end_ns * 30 // 1_000_000_000 - 2)
    while grid.audio_end_ns(k) < end_ns:
        k += 1
    return k


@pytest.mark.parametrize("latency_ms,tag_ms", [(500, 5), (1000, 5), (2000, 5), (10_000, 5),
                                               (1000, 100)])
def test_the_pipeline_decides_each_word_at_its_deadline(latency_ms, tag_ms):
    """Every word is published at the tick that holds its end (none late), and it was decided
    with the right context that D allows: D - A less the next update (two update costs, or
    the cadence and one cost), a margin and one tick. A tag stage slower than 2 ticks
    (degraded ticks: words go out untagged) changes none of that."""
    seconds = 4.0 + 2.5 * latency_ms / 1000
    rec_cost_ms = 150
    sink, recognizer, counters = _run_pipeline(latency_ms, seconds, int((seconds - 1) / 0.4),
                                               lambda r: rec_cost_ms * MS, tag_ms)
    assert (counters.degraded_ticks > 0) == (tag_ms > 2 * 34)
    grid = TickGrid.create("30", T0_NS, latency_ms, 150)
    shown = [(tw.word, s.k) for s in sink.states for tw in s.committed]
    assert [w.text for w, _ in shown] == [w.text for w in recognizer.words]
    assert [k for _, k in shown] == [_tick_of(grid, w.end_ns) for w, _ in shown]
    allowed_ms = latency_ms - 150 - max(2 * rec_cost_ms, 200 + rec_cost_ms) - 30 - 34
    assert len(recognizer.context_ns) >= 5  # decided by updates, not at the end of the stream
    assert min(recognizer.context_ns) >= allowed_ms * MS


def test_a_planned_update_cost_makes_the_captions_depend_on_the_audio_alone():
    """[recognizer] update_cost_ms = N: updates go out on the audio's own clock (one per
    cadence), are planned as lasting N ms, and their results are shown no sooner than planned.
    A fast device (60 ms an update) and a slow one that still keeps up (380 ms, every fourth
    update 490 ms, against N = 500 and a 520 ms cadence) decide every word from the same update,
    with the same audio heard and the same span, give the tagger the same right context and
    publish the same state at every tick: committed words, tentative tail, cues. Planned on
    measured costs (the default), the fast device spends its speed on right context, and the
    plans differ."""
    calls = iter(range(10**6))
    costs = {"fast": lambda r: 60 * MS,
             "slow": lambda r: (490 if isinstance(r, UpdateRequest) and next(calls) % 4 == 3
                                else 380) * MS}
    grid = TickGrid.create("30", T0_NS, 2000, 150)
    planned, states, tagged = {}, {}, {}
    for name, cost in costs.items():
        tagger = SeenByTagger()
        sink, recognizer, counters = _run_pipeline(2000, 9.0, 20, cost, tagger=tagger,
                                                   min_update_ms=520, update_cost_ms=500,
                                                   encoder_span="auto")
        tagged[name] = tagger.seen
        shown = [(tw.word, s.k) for s in sink.states for tw in s.committed]
        assert [w.text for w, _ in shown] == [w.text for w in recognizer.words]
        assert [k for _, k in shown] == [_tick_of(grid, w.end_ns) for w, _ in shown]
        assert counters.updates_skipped == 0
        planned[name] = recognizer.plans
        states[name] = [(s.k, [tw.text for tw in s.committed], s.tentative, s.cues)
                        for s in sink.states]
    assert len(planned["fast"]) >= 15 and planned["fast"] == planned["slow"]
    assert sum(bool(tentative) for _, _, tentative, _ in states["fast"]) > 100
    assert states["fast"] == states["slow"]
    # the tagger is given the same right context at every pass
    assert len(tagged["fast"]) >= 10 and tagged["fast"] == tagged["slow"]
    # every update's audio ends on the cadence: 520 ms, 1040 ms, ...
    assert [end for end, _, _ in planned["fast"]] == [
        (i + 1) * 520 * MS for i in range(len(planned["fast"]))]
    assert all(full for _, _, full in planned["fast"])  # "auto": the full input
    measured = [_run_pipeline(2000, 9.0, 20, cost, min_update_ms=520)[1].plans
                for cost in costs.values()]
    assert measured[0] != measured[1]


def test_a_recogniser_behind_its_planned_schedule_skips_ahead_and_counts_it():
    """Updates that take far longer than planned (1.5 s against a 520 ms cadence) do not queue
    without end: the schedule skips to the audio heard, the skip is counted, and every word
    is still committed."""
    sink, recognizer, counters = _run_pipeline(2000, 9.0, 20, lambda r: 1500 * MS,
                                               min_update_ms=520, update_cost_ms=500)
    assert counters.updates_skipped > 0
    assert [tw.word.text for s in sink.states for tw in s.committed] == \
        [w.text for w in recognizer.words]
    ends = [end for end, _, _ in recognizer.plans]
    assert all(end % (520 * MS) == 0 for end in ends) and len(ends) < 9000 // 520


def test_a_planned_cost_longer_than_the_cadence_is_the_cadence():
    """An update planned to last 1.2 s cannot run every 520 ms: the updates go out every 1.2 s
    of audio, none is skipped, and at D = 4 s (room for a cadence and a cost after a word)
    every word is shown at its tick."""
    sink, recognizer, counters = _run_pipeline(4000, 9.0, 20, lambda r: 60 * MS,
                                               min_update_ms=520, update_cost_ms=1200)
    assert counters.updates_skipped == 0
    assert [end for end, _, _ in recognizer.plans] == [(i + 1) * 1200 * MS for i in range(7)]
    grid = TickGrid.create("30", T0_NS, 4000, 150)
    shown = [(tw.word, s.k) for s in sink.states for tw in s.committed]
    assert [w.text for w, _ in shown] == [w.text for w in recognizer.words]
    assert [k for _, k in shown] == [_tick_of(grid, w.end_ns) for w, _ in shown]


@pytest.mark.parametrize("latency_ms,full_ms,want_full", [
    (2000, 400, True),  # ~1 s of right context left on the full input: full
    (1000, 400, False),  # the full input would leave 0.1 s: the cut span's 0.5 s is better
    # a fast device: the full input would leave 0.56 s, the cut span 0.5 s; short of 0.75 s
    # the cut span (dev WER at D = 1 s: 8.3 % full, 6.9 % cut at 60 / 30 ms an update)
    (1000, 60, False),
    (500, 400, False),
])
def test_the_encoder_span_follows_the_right_context_the_deadline_leaves(
        latency_ms, full_ms, want_full):
    """[recognizer] encoder_span = "auto": an update runs over Whisper's whole input when the
    due words still get 0.75 s of right context, and every word is still published at its
    tick."""
    cost_ms = {True: full_ms, False: 120}
    sink, recognizer, _ = _run_pipeline(
        latency_ms, 8.0, 15, lambda r: cost_ms[getattr(r, "full_span", False)] * MS,
        encoder_span="auto")
    steady = recognizer.spans[3:]  # after the first costs are measured
    assert steady and all(s == want_full for s in steady)
    grid = TickGrid.create("30", T0_NS, latency_ms, 150)
    shown = [(tw.word, s.k) for s in sink.states for tw in s.committed]
    assert [w.text for w, _ in shown] == [w.text for w in recognizer.words]
    assert [k for _, k in shown] == [_tick_of(grid, w.end_ns) for w, _ in shown]


@pytest.mark.parametrize("span", ["cut", "full"])
def test_a_fixed_encoder_span_is_kept(span):
    from subd.pipeline.deadline import UpdatePlanner

    planner = UpdatePlanner(span)
    planner.started = True  # past a channel's first words (the test below)
    grid = TickGrid.create("30", T0_NS, 2000, 150)
    plans = [planner.plan(grid, T0_NS + i * 200 * MS) for i in range(5)]
    assert all(p.full_span == (span == "full") for p in plans)
    with pytest.raises(ValueError, match="encoder span"):
        UpdatePlanner("half")


@pytest.mark.parametrize("latency_ms,start_full", [
    (2000, True),  # the full input leaves the first words ~1.2 s of right context
    (1000, False),  # it would leave them ~0.2 s: the cut span
])
def test_a_channels_first_words_are_read_on_the_full_input_where_that_pays(latency_ms,
                                                                             start_full):
    """encoder_span = "cut" (the default): until the channel has committed a word, its updates
    run over Whisper's whole input where that leaves the due words 0.75 s of right context
    (those words have no words before them: the cut span's short window read them worse);
    from the update after its first commit on, the cut span. Every word is still published
    at its tick."""
    cost_ms = {True: 300, False: 120}
    sink, recognizer, _ = _run_pipeline(
        latency_ms, 8.0, 15, lambda r: cost_ms[getattr(r, "full_span", False)] * MS)
    first = recognizer.words[0].end_ns
    n_start = 1 + next(i for i, (_, until, _) in enumerate(recognizer.plans)
                       if until is not None and until >= first)  # up to the first commit
    assert recognizer.spans[:n_start] == [start_full] * n_start
    assert len(recognizer.spans) > n_start and not any(recognizer.spans[n_start:])
    grid = TickGrid.create("30", T0_NS, latency_ms, 150)
    shown = [(tw.word, s.k) for s in sink.states for tw in s.committed]
    assert [w.text for w, _ in shown] == [w.text for w in recognizer.words]
    assert [k for _, k in shown] == [_tick_of(grid, w.end_ns) for w, _ in shown]


def test_marks_the_recogniser_wrote_with_right_context_are_kept_at_the_deadline():
    """trust_recogniser_after_words: Whisper's mark and case on a word it decoded words after
    are kept as they are; a word at the very end of its decode (no word after it: where
    Whisper ends every window with a full stop) is left to the tagger."""
    from subd.models.punct import PunctTagger
    from subd.punct.stream import PunctConfig

    stream = PunctStream(PunctTagger.load(), PunctConfig(trust_recogniser_after_words=2))
    texts = "And so, my fellow Americans, ask not what your country can do for you".split()
    words = [Word(w, i * 300 * MS, (i * 300 + 250) * MS) for i, w in enumerate(texts)]
    upd = stream.update(words[:6], words[6:], 4000 * MS, decide_until_ns=1800 * MS)
    assert [t.text + t.punct for t in upd.final] == ["And", "so,", "my", "fellow",
                                                      "Americans,", "ask"]


def test_trusted_case_agrees_with_the_marks_decided_before_it():
    """Whisper's case is kept with its mark, except where the marks decided before the word
    say otherwise: a stream's first word starts a sentence (Whisper read "printing" from its
    first second of audio alone), and a capital Whisper wrote only after its own full stop,
    which the tagger set aside (the word ended its decode), is the tagger's to decide
    ("antecedents, Nor"). Names keep their capitals."""
    from subd.models.punct import PunctTagger
    from subd.punct.stream import PunctConfig

    tagger = PunctTagger.load()

    def shown(text: str, n_first: int) -> list[str]:
        """The first n_first words commit alone (the last of them ends its decode), then the
        rest, each decided at its deadline."""
        stream = PunctStream(tagger, PunctConfig(trust_recogniser_after_words=2))
        words = [Word(w, i * 300 * MS, (i * 300 + 250) * MS) for i, w in enumerate(text.split())]
        first = stream.update(words[:n_first], [], 1000 * MS, decide_until_ns=900 * MS)
        rest = stream.update(words[n_first:n_first + 4], words[n_first + 4:], 4000 * MS,
                             decide_until_ns=2100 * MS)
        return [t.text + t.punct for t in (*first.final, *rest.final)]

    assert shown("printing in the only sense with which we are at", 3)[:3] == [
        "Printing", "in", "the"]
    assert shown("of my antecedents. Nor of the circumstances which led me", 3)[2:4] == [
        "antecedents", "nor"]
    assert shown("of the cart. It befell in the month of May", 3)[2:4] == ["cart", "it"]
    assert shown("and then Mr. John Dashwood had then leisure to consider", 3)[2:5] == [
        "Mr.", "John", "Dashwood"]  # the title's own period too, as the recogniser wrote it


def test_a_word_cut_at_its_deadline_is_completed_not_repeated(voiced):
    """D short: "ill" (the start of "ill-disposed", heard out by its aligned end) is due and
    committed; the next decode spells the whole word: only its rest is new, joined to it."""
    cut = [("an", 0.2, 0.4, 0.9), ("ill", 0.4, 0.6, 0.9)]
    whole = [("an", 0.2, 0.4, 0.9), ("ill-disposed", 0.45, 1.0, 0.9), ("young", 1.0, 1.3, 0.9)]
    rec = StreamingRecognizer(engine=_ScriptedEngine(cut, whole), confident_min_probability=1.0)
    _feed(rec, voiced, 0.8)
    assert [w.text for w in rec.update(commit_until_ns=700 * MS).committed] == ["an", "ill"]
    _feed(rec, voiced, 1.5)
    hyp = rec.update(commit_until_ns=1500 * MS)
    assert [(w.text, w.joined) for w in hyp.committed] == [("-disposed", True),
                                                           ("young", False)]


def test_a_looped_phrase_timed_past_the_audio_is_not_speech():
    """Whisper on a cut window can loop the last phrase, every copy at the audio end, or stack
    a copy of no duration before the real words; neither reaches the hypothesis. Real
    repeated words ("five, five") have their own durations and stay."""
    from subd.recognise.readings import stacked_tail_cut

    def words(*spec):
        return [Word(t, int(a * 1000) * MS, int(b * 1000) * MS) for t, a, b in spec]

    looped = words(("Ten", 8.0, 8.2), ("of", 8.2, 8.4), ("clubs.", 8.4, 8.6), ("Ten", 8.6, 8.6),
                   ("of", 8.6, 8.6), ("clubs.", 8.6, 8.6))
    assert [w.text for w in stacked_tail_cut(looped, 8_600 * MS)] == ["Ten", "of", "clubs."]
    stacked = words(("Seven", 12.02, 12.62), ("of", 12.62, 12.62), ("clubs.", 12.62, 12.62),
                    ("Seven", 12.62, 12.90), ("of", 12.90, 13.22), ("clubs.", 13.22, 13.38))
    assert [w.text for w in stacked_tail_cut(stacked, 13_600 * MS)] == ["Seven", "of", "clubs."]
    real = words(("Five,", 1.0, 1.4), ("five.", 1.6, 2.0), ("Eight", 2.5, 2.9))
    assert stacked_tail_cut(real, 3_000 * MS) == real
    assert stacked_tail_cut(real, 2_930 * MS) == real  # one word at the very end: kept
    squeezed = words(("no,", 3.16, 3.72), ("we", 3.72, 3.72), ("will", 3.72, 3.98))
    assert stacked_tail_cut(squeezed, 5_000 * MS) == squeezed  # one short word DTW squeezed
    # a decode that restated the transcript from the window's start (libri-2412 at D = 2 s),
    # every word at one instant but one given 80 ms: that one is a copy too, not "design," again
    restated = words(("and", 3.2, 3.2), ("that", 3.2, 3.2), ("however", 3.2, 3.2),
                     ("my", 3.2, 3.2), ("design,", 3.2, 3.28), ("and", 3.28, 3.28),
                     ("that", 3.28, 3.28), ("however", 3.28, 3.28))
    assert [w.text for w in stacked_tail_cut(restated, 5_600 * MS)] == ["and"]


def _w(text, a, b):
    return Word(text, int(a * 1000) * MS, int(b * 1000) * MS)


def test_a_stalled_window_starts_at_the_committed_word_it_would_cut():
    """After a stall the window moves to 200 ms before the commit point; inside the committed
    "will" (9.52-9.78 s) the decode from there read "go back" without "not". It starts at
    that word's start instead; between words, or before the committed ones, where it was."""
    from subd.recognise.readings import word_start_at

    def sample(ms):
        return ms * SAMPLE_RATE_HZ // 1000

    committed = [_w("we", 9.3, 9.52), _w("will", 9.52, 9.78)]
    assert word_start_at(committed, sample(9_580)) == sample(9_520)
    between = [_w("we", 9.3, 9.5), _w("will", 9.6, 9.78)]
    assert word_start_at(between, sample(9_550)) == sample(9_550)
    assert word_start_at(committed, sample(9_000)) == sample(9_000)
    assert word_start_at([], sample(9_580)) == sample(9_580)


def test_a_phrase_said_again_is_kept_and_one_restated_is_not():
    """The committed tail again at the start of a hypothesis decoded after the committed words
    (a forced prefix): the speaker saying it again (a chant: on fresh audio as long as the
    first time) stays; Whisper re-stating its context (squeezed against the commit point, or
    overlapping it) goes."""
    from subd.recognise.readings import after_commit_point

    said = [_w("we", 7.92, 8.06), _w("will", 8.06, 8.3), _w("not", 8.3, 8.52),
            _w("go", 8.52, 8.78), _w("back,", 8.78, 9.22)]
    again = [_w("we", 9.36, 9.5), _w("will", 9.5, 9.76), _w("not", 9.76, 9.96),
             _w("go", 9.96, 10.22), _w("back,", 10.22, 10.66), _w("thank", 11.4, 11.6)]
    kept = after_commit_point(again, said, said[-1].end_ns, forced=True, deadline=True)
    assert [w.text for w in kept] == ["we", "will", "not", "go", "back,", "thank"]
    # without a forced prefix Whisper re-reads committed audio: the text decides, as before
    kept = after_commit_point(again, said, said[-1].end_ns, forced=False, deadline=True)
    assert [w.text for w in kept] == ["thank"]
    restated = [_w("go", 9.2, 9.25), _w("back,", 9.25, 9.3), _w("thank", 9.4, 9.6)]
    # a forced prefix's last word, a mark decoded after it: the word comes back whole
    straddling = [_w("back.", 8.7, 10.0), _w("thank", 10.1, 10.3)]
    for copy in (restated, straddling):
        for forced in (True, False):
            kept = after_commit_point(copy, said, said[-1].end_ns, forced, deadline=True)
            assert [w.text for w in kept] == ["thank"]


def test_a_word_restated_on_a_sliver_of_new_audio_is_not_said_again():
    """DTW gave a word squeezed between two others 20 ms ("so am I": "I" committed on 20 ms). The
    next decode, forced to continue "so am I", began "I fellow" with that "I" ending 20 ms after
    the committed one: 0.6 of 20 ms passed for "as long as the first time" and the captions read
    "so am I I fellow". A word said again lies on at least 100 ms of new audio; a real repeat
    of a short word ("no, no") does."""
    from subd.recognise.readings import after_commit_point

    said = [_w("so", 21.92, 22.24), _w("am", 22.24, 22.36), _w("I", 22.6, 22.62)]
    restated = [_w("I", 22.52, 22.64), _w("fellow", 22.64, 22.9)]
    kept = after_commit_point(restated, said, said[-1].end_ns, forced=True, deadline=True)
    assert [w.text for w in kept] == ["fellow"]
    no = [_w("no,", 1.0, 1.3)]
    again = [_w("no,", 1.45, 1.75), _w("we", 1.8, 2.0)]
    kept = after_commit_point(again, no, no[-1].end_ns, forced=True, deadline=True)
    assert [w.text for w in kept] == ["no,", "we"]


def test_a_false_start_after_the_forced_prefix_is_not_committed():
    """Forced to continue "and fields" (committed to 15.14 s), a decode of LibriVox 3436 at
    D = 1 s began "beside" on 40 ms of new audio, "Field," (0.24) on 100 ms, then began again:
    "beside" on its own 340 ms, "Westminster." Both false-start words were due and committed
    ("fields beside Field, beside Westminster"). A word said twice by the speaker lies on audio
    of its own the first time, and stays."""
    from subd.recognise.readings import after_commit_point

    said = [_w("and", 14.6, 14.78), _w("fields", 14.78, 15.14)]
    decoded = [Word("beside", 15_080 * MS, 15_180 * MS, 0.69),
               Word("Field,", 15_180 * MS, 15_280 * MS, 0.24),
               Word("beside", 15_280 * MS, 15_620 * MS, 0.78),
               Word("Westminster.", 15_620 * MS, 15_980 * MS, 0.69)]
    kept = after_commit_point(decoded, said, said[-1].end_ns, forced=True, deadline=True)
    assert [w.text for w in kept] == ["beside", "Westminster."]
    assert kept[0].start_ns == 15_280 * MS
    # the same words, the first "beside" said on 300 ms of its own: a speaker's repeat
    repeat = [Word("beside", 15_140 * MS, 15_440 * MS, 0.69), *decoded[1:]]
    kept = after_commit_point(repeat, said, said[-1].end_ns, forced=True, deadline=True)
    assert [w.text for w in kept] == ["beside", "Field,", "beside", "Westminster."]
    # a sure word between the two is speech: nothing is cut
    sure = [decoded[0], replace(decoded[1], probability=0.9), *decoded[2:]]
    kept = after_commit_point(sure, said, said[-1].end_ns, forced=True, deadline=True)
    assert len(kept) == 4


def test_a_word_of_no_duration_at_the_commit_point_is_committed(voiced):
    """DTW can give a short word no duration where the word before it ends ("no, we": "we" at
    the instant "no," ends); committed in one update with it, it is a new word, not a repeat."""
    rec = StreamingRecognizer(engine=_ScriptedEngine(
        [("no,", 0.3, 0.9, 0.9), ("we", 0.9, 0.9, 0.9), ("will", 0.9, 1.2, 0.9)]))
    _feed(rec, voiced, 1.6)
    hyp = rec.update(commit_until_ns=1_300 * MS)
    assert [w.text for w in hyp.committed] == ["no,", "we", "will"]


def test_words_written_over_silence_are_not_committed(voiced):
    """Whisper can write a clip's last words again over the silence after them ("in this
    regard, in this regard": the dev set at D = 1 s), timed there by DTW; they are not speech,
    so not committed at their deadline. A word over speech stays, one of no duration too, and
    so does a word at the audio end, whose silence is not heard out yet."""
    audio = np.concatenate([voiced, np.zeros(2 * SAMPLE_RATE_HZ, np.float32)])  # speech to 4.8 s
    said = [("in", 3.6, 3.9, 0.9), ("this", 3.9, 3.9, 0.9), ("regard,", 3.9, 4.7, 0.9)]

    def update(*copy):
        rec = StreamingRecognizer(engine=_ScriptedEngine(said + list(copy)))
        _feed(rec, audio, 6.8)
        hyp = rec.update(commit_until_ns=6_800 * MS)
        return [w.text for w in hyp.committed], [w.text for w in hyp.tentative]

    assert update(("in", 5.6, 5.6, 0.9), ("regard,", 5.6, 6.1, 0.9)) == (
        ["in", "this", "regard,"], [])
    assert update(("in", 6.0, 6.6, 0.9)) == (["in", "this", "regard,"], [])
    assert update(("in", 6.5, 6.8, 0.9)) == (["in", "this", "regard,"], ["in"])  # not heard out
    assert update(("so", 4.7, 4.9, 0.9))[0] == ["in", "this", "regard,", "so"]  # 100 ms into it


def test_a_word_over_silence_left_for_the_end_of_the_stream_is_not_committed(voiced):
    """A word written at the audio end is not judged until the audio after it is heard; the
    stream's last decode may leave it out, and what it left out is committed at the end of
    the stream: the word is judged there ("You can call me Abby. Abby." once, in real time),
    and taken only where Whisper was sure of it ("the main objective. That.")."""
    audio = np.concatenate([voiced, np.zeros(5 * SAMPLE_RATE_HZ // 2, np.float32)])  # speech: 4.8 s
    said = [("in", 3.6, 3.9, 0.9), ("this", 3.9, 3.9, 0.9), ("regard,", 3.9, 4.7, 0.9)]
    for copy, kept in ((("Abby.", 6.6, 6.75, 0.9), []), (("so", 4.7, 4.9, 0.9), ["so"]),
                       (("That", 4.7, 4.9, 0.15), [])):  # a guess Whisper was unsure of
        rec = StreamingRecognizer(engine=_ScriptedEngine(said + [copy], said))
        _feed(rec, audio, 6.8)
        hyp = rec.update(commit_until_ns=4_700 * MS)
        assert [w.text for w in hyp.tentative] == [copy[0]]  # at the audio end: not judged yet
        _feed(rec, audio, 6.8 + 0.5)
        assert [w.text for w in rec.finish().committed] == kept


def test_copies_of_the_last_words_are_no_word_the_final_decode_left_out(voiced):
    """An earlier decode looped the stream's last word over that word's own audio ("the main
    objective. That objective. That objective.", base at D = 2 s, read with probability
    0.85-0.96 on speech); the final decode, on Whisper's full input, read it once. The copies
    are not committed at the end of the stream; another word it left out still is."""
    audio = np.concatenate([voiced, np.zeros(5 * SAMPLE_RATE_HZ // 2, np.float32)])  # speech: 4.8 s
    said = [("in", 3.6, 3.9, 0.9), ("this", 3.9, 3.9, 0.9), ("regard,", 3.9, 4.7, 0.9)]
    for copy, kept in (([("regard.", 4.7, 4.9, 0.9)], []),
                       ([("regard,", 4.7, 4.8, 0.9), ("regard.", 4.8, 4.9, 0.9)], []),
                       ([("this", 4.7, 4.75, 0.9), ("regard.", 4.75, 4.9, 0.9)], []),
                       ([("regard,", 4.7, 4.8, 0.9), ("so", 4.8, 4.9, 0.9)], ["so"])):
        rec = StreamingRecognizer(engine=_ScriptedEngine(said + copy, said))
        _feed(rec, audio, 6.8)
        rec.update(commit_until_ns=4_700 * MS)
        _feed(rec, audio, 6.8 + 0.5)
        assert [w.text for w in rec.finish().committed] == kept, copy


def test_the_final_decode_writes_no_word_on_the_silence_at_the_very_end(voiced):
    """At the end of a stream the audio after every word is known: a word the final decode
    writes within the VAD's margin of the end is judged too ("themselves the.": "The" with
    probability 0.00 on a clip's last 40 ms of silence, D = 0.5 s). A word over the speech
    the stream ends on stays."""
    said = [("in", 3.6, 3.9, 0.9), ("this", 3.9, 3.9, 0.9), ("regard,", 3.9, 4.7, 0.9)]
    for tail_s, last, kept in ((0.5, ("The", 5.25, 5.25, 0.0), []),
                               (0.0, ("so", 4.72, 4.8, 0.9), ["so"])):
        audio = np.concatenate([voiced, np.zeros(int(tail_s * SAMPLE_RATE_HZ), np.float32)])
        rec = StreamingRecognizer(engine=_ScriptedEngine(said, said + [last]))
        _feed(rec, audio, 4.8 + tail_s)
        words = list(rec.update(commit_until_ns=4_700 * MS).committed)
        words += rec.finish().committed
        assert [w.text for w in words] == ["in", "this", "regard,", *kept], last


def _spans_chosen(latency_ms: int, n: int, step_ms: int, cost_ms,
                  wait_ms: int = 0) -> list[bool]:
    """The span the daemon's planner chooses for each of ``n`` updates ``step_ms`` apart;
    update i costs ``cost_ms(i, full)`` (None: it decoded nothing, so nothing is recorded), of
    which ``wait_ms`` waited behind other channels."""
    from subd.pipeline.deadline import UpdatePlanner

    planner = UpdatePlanner("auto")
    grid = TickGrid.create("30", T0_NS, latency_ms, 150)
    chosen = []
    for i in range(n):
        plan = planner.plan(grid, T0_NS + i * step_ms * MS)
        chosen.append(plan.full_span)
        cost = cost_ms(i, plan.full_span)
        if cost is not None:
            planner.record(plan, cost * MS, (cost - wait_ms) * MS)
    return chosen


def test_only_a_channel_that_waits_behind_others_takes_the_full_input_short_of_its_context():
    """D = 1.5 s, round trips of 360 ms on the full input and 330 ms on the cut span: the full
    input leaves the due words 0.60 s, the cut span 0.66 s. A channel alone on its recogniser
    (no wait) takes the cut span; one that waits 300 ms behind other channels' updates (a
    loaded GPU, where moving between the spans with the wait made every channel slower) keeps
    the full input, as it costs the words at most 0.15 s."""
    def cost_ms(i: int, full: bool) -> int:
        return 360 if full else 330

    alone = _spans_chosen(1500, 30, 400, cost_ms)
    waiting = _spans_chosen(1500, 30, 400, cost_ms, wait_ms=300)
    assert not any(alone[5:]) and all(waiting[5:])


def test_the_encoder_span_does_not_flap_when_the_cost_wavers():
    """Near the threshold (D = 2 s, the full input's cost moving 0.45-0.58 s with the load) the
    planner stays on the full input; it leaves it when the cost really grows."""
    from subd.pipeline.deadline import UpdatePlan, UpdatePlanner

    def cost_ms(i: int, full: bool) -> int:
        return ((450 if (i + 1) % 3 else 580) if i < 40 else 900) if full else 130

    chosen = _spans_chosen(2000, 60, 500, cost_ms)
    assert all(chosen[2:40])  # after the two first measurements
    assert not any(chosen[45:])
    assert isinstance(UpdatePlanner("auto").plan(TickGrid.create("30", T0_NS, 2000, 150), T0_NS),
                      UpdatePlan)


class _Talker(_ScriptedEngine):
    """A speaker who never stops: a word every 0.5 s of whatever window it is given; records
    the window lengths it was asked to decode."""

    def __init__(self):
        super().__init__([])
        self.window_s: list[float] = []

    def transcribe_window(self, audio, prompt=None, policy=None, prefix=(), **_):
        n_s = len(audio) / SAMPLE_RATE_HZ
        self.window_s.append(n_s)
        self.scripts = ([(f"w{i}", i * 0.5, i * 0.5 + 0.4, 0.9) for i in range(int(n_s * 2))],)
        self.n_calls = 0
        return super().transcribe_window(audio, prompt, policy, prefix)


@pytest.mark.parametrize("full_span", [False, True])
def test_on_the_full_input_the_window_keeps_more_of_what_was_said(speech_clips, full_span):
    """Whisper's full input costs the same whatever the window holds, so after a full-input
    update the window keeps ``full_span_trim_after_ms`` of committed audio (the sentence the
    due words belong to), after a cut-span update only ``trim_after_ms`` (the cut encoder's
    cost grows with the window)."""
    clip = load_audio(speech_clips[0].path)
    audio = np.tile(clip, int(24 * SAMPLE_RATE_HZ / len(clip)) + 1)[: 24 * SAMPLE_RATE_HZ]
    engine = _Talker()
    rec = StreamingRecognizer(engine=engine, confident_min_probability=1.0, vad=False,
                              trim_after_ms=4000, full_span_trim_after_ms=12000)
    for step in range(2, 48):
        _feed(rec, audio, step * 0.5)
        rec.update(commit_until_ns=max(0, (step * 500 - 1000)) * MS, full_span=full_span)
    longest = max(engine.window_s)
    if full_span:
        assert 12 < longest <= 14.5
    else:
        assert 4 < longest <= 6.5


class _StopsEarly(_ScriptedEngine):
    """A decode that ends its transcript 3 s into whatever window it is given (Whisper closing
    the transcript at the forced prefix's sentence end, or early, with speech still after)."""

    def __init__(self):
        super().__init__([])
        self.n_decodes = 0

    def transcribe_window(self, audio, prompt=None, policy=None, prefix=(), **_):
        self.scripts = ([(f"d{self.n_decodes}w{i}", i * 0.5, i * 0.5 + 0.4, 0.9)
                         for i in range(6)],)  # each decode's own words: no two agree
        self.n_calls, self.n_decodes = 0, self.n_decodes + 1
        return _ScriptedEngine.transcribe_window(self, audio, prompt, policy, prefix)


def test_speech_a_decode_leaves_out_is_decoded_from_the_commit_point(speech_clips):
    """Whisper ends a transcript early while speech goes on after it: the window moves to the
    commit point at once (as offline Whisper seeks to where its transcript stopped), so the
    next decode starts at the speech left out instead of stopping at the same place again."""
    clip = load_audio(speech_clips[0].path)
    audio = np.tile(clip, int(12 * SAMPLE_RATE_HZ / len(clip)) + 1)[: 12 * SAMPLE_RATE_HZ]
    rec = StreamingRecognizer(engine=_StopsEarly(), confident_min_probability=1.0)
    committed = []
    for step in range(2, 24):
        _feed(rec, audio, step * 0.5)
        hyp = rec.update(commit_until_ns=max(0, step * 500 - 1000) * MS, full_span=True)
        committed += hyp.committed
    assert committed and committed[-1].end_ns > 8_000 * MS  # past the first window's 3 s
    starts = [w.start_ns for w in committed]
    assert starts == sorted(starts)


class _GreedyStops(_ScriptedEngine):
    """Greedy decodes transcribe the first 2 s of a stream and then nothing more (Whisper
    closing its transcript on far-field speech); a decode allowed to fall back to higher
    temperatures transcribes the window's speech."""

    def __init__(self):
        super().__init__([])
        self.fallbacks = []  # per decode: could it fall back?

    def transcribe_window(self, audio, prompt=None, policy=None, prefix=(), **_):
        fallback = policy is not None and len(policy.temperatures) > 1
        self.fallbacks.append(fallback)
        first = len(self.fallbacks) == 1
        span_s = len(audio) / SAMPLE_RATE_HZ
        words = [(f"w{len(self.fallbacks)}x{i}", i * 0.5, i * 0.5 + 0.4, 0.9)
                 for i in range(int(span_s / 0.5)) if first or fallback]
        self.scripts, self.n_calls = (words[:4] if first else words,), 0
        return _ScriptedEngine.transcribe_window(self, audio, prompt, policy, prefix)


def test_after_a_decode_that_left_out_speech_the_next_may_fall_back(speech_clips):
    """A greedy decode stops short with speech heard out after the commit point: the next
    decode, from the commit point, may fall back to higher temperatures (as offline Whisper
    does with a transcript that fails its checks), and the speech it finds is committed. Only
    that one decode: greedy again after it."""
    clip = load_audio(speech_clips[0].path)
    audio = np.tile(clip, int(12 * SAMPLE_RATE_HZ / len(clip)) + 1)[: 12 * SAMPLE_RATE_HZ]
    engine = _GreedyStops()
    rec = StreamingRecognizer(engine=engine, confident_min_probability=1.0)
    committed = []
    for step in range(4, 24):
        _feed(rec, audio, step * 0.5)
        committed += rec.update(commit_until_ns=max(0, step * 500 - 1000) * MS,
                                full_span=True).committed
    assert engine.fallbacks[0] is False  # greedy while nothing went wrong
    first = engine.fallbacks.index(True)
    assert engine.fallbacks[first + 1] is False  # and again after the decode that fell back
    assert any(w.text.startswith(f"w{first + 1}x") for w in committed)
    assert committed[-1].end_ns > 6_000 * MS


def test_a_span_probe_that_decoded_nothing_is_made_again():
    """A stream that starts in silence: the first updates decode nothing and cost nothing, so
    they measure neither kind. Each kind is probed until an update of it is measured, and a
    fast device (40 / 30 ms an update) then runs on the full input at D = 2 s."""
    # speech from the 11th update on: only decoded updates are recorded
    chosen = _spans_chosen(2000, 40, 200, lambda i, full: None if i < 10 else 40 if full else 30)
    assert all(chosen[:11])  # the full input is probed until it is measured
    assert chosen[11] is False  # then the cut span, once
    assert all(chosen[12:])


def test_a_phrase_said_again_after_a_pause_is_kept():
    """DTW swallows the pause after a phrase into its last word: "he recalled the words, the
    words of Shelley's fragment" (LibriTTS 1089, held-out set, D = 4 s) committed "the
    words," over 2.16-3.08 s, "words," taking 0.58 s of it, and the next decode, forced to
    continue after it, began "The words of" at 3.22 s: 0.48 s of new audio, under 0.6 of the
    0.92 s "the first time" and the captions read "recalled the words. of Shelley's". The
    first time is measured up to its last word's start plus the shorter last word."""
    from subd.recognise.readings import after_commit_point

    said = [_w("he", 1.60, 1.86), _w("recalled", 1.86, 2.16), _w("the", 2.16, 2.50),
            _w("words,", 2.50, 3.08)]
    again = [_w("The", 3.22, 3.44), _w("words", 3.44, 3.70), _w("of", 3.70, 4.02),
             _w("Shelley's", 4.02, 4.52)]
    kept = after_commit_point(again, said, said[-1].end_ns, forced=True, deadline=True)
    assert [w.text for w in kept] == ["The", "words", "of", "Shelley's"]


def test_when_audio_was_live_does_not_jump_when_d_changes():
    """The planned schedule dates an update by when its audio was live (``_live_ns``), read off
    the tick grid. A configuration reload that changes D switches grids at a later tick: audio
    of the ticks before the switch is dated on the grid they are due on, so its live time does
    not move by the change of D (it moved by 1 s here, planning those updates' words a second
    early)."""
    clock = FakeClock(start_ns=T0_NS + 3_000 * MS)
    pipeline = Pipeline(clock=clock, settings=TickSettings(latency_ms=2000, max_latency_ms=4000),
                        source=FileSource(np.zeros(SAMPLE_RATE_HZ, np.float32)),
                        recogniser=None, tagger=None, history=AudioHistory(SAMPLE_RATE_HZ * 40))
    pipeline.grid = TickGrid.create("30", T0_NS, 2000, 150)
    pipeline._ring_latency_ns = 4000 * MS
    samples = [SAMPLE_RATE_HZ * s // 2 for s in range(1, 13)]  # 0.5 .. 6 s of audio
    before = [pipeline._live_ns(s) for s in samples]
    switch_k = pipeline.set_latency(3000)
    assert 0 < pipeline.grid.tick_of_sample(samples[0]) < switch_k \
        < pipeline.grid.tick_of_sample(samples[-1])
    assert [pipeline._live_ns(s) for s in samples] == before
    assert before[1] - before[0] == 500 * MS  # and live time runs with the audio
