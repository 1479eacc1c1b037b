"""Scoring of streamed punctuation against a punctuated reference (no recogniser needed)."""

from __future__ import annotations

import numpy as np

from subd.bench.punct_e2e import SpokenSession, session_reference
from subd.scoring.punct import cached_hypotheses, reference_words, score
from subd.types import AudioChunk, Hypothesis, Word


def test_reference_words_and_titles() -> None:
    got = reference_words("Mr. Smith came: he sat down; well-known, isn't it?")
    assert got == [("mr", ""), ("smith", ""), ("came", ","), ("he", ""), ("sat", ""),
                   ("down", ","), ("well", ""), ("known", ","), ("isn't", ""), ("it", "?")]


def test_false_break_at_a_chunk_edge_is_counted() -> None:
    ref = reference_words("I went to the market and then we walked home.")
    hyp = [(w, "", False) for w, _ in ref]
    hyp[6] = ("then", ".", True)  # "and then. we walked"
    hyp[-1] = ("home", ".", True)
    s = score(hyp, ref)
    assert s.chunk_edges == 2 and s.chunk_edge_breaks == 1
    assert s.f1("sentence") == (0.5, 1.0, 2 / 3)


def test_chunk_edge_breaks_are_split_by_what_the_reference_has_there() -> None:
    # "and then. | we" breaks a phrase the reference keeps whole (the acceptance count);
    # "home. | she said" breaks at a clause mark, a lesser error
    ref = reference_words("I went to the market and then we walked home, she said.")
    hyp = [(w, "", False) for w, _ in ref]
    hyp[6] = ("then", ".", True)
    hyp[9] = ("home", ".", True)
    hyp[3] = ("the", ".", False)  # not at a chunk edge: a false end, but no edge break
    s = score(hyp, ref)
    assert s.chunk_edges == 2 and s.chunk_edge_breaks == 2
    assert s.edge_breaks_inside_phrase == 1 and s.edge_breaks_at_clause == 1
    other = score([(w, "", True) for w, _ in ref], ref)  # no false break at all
    s.add_scores(other)
    assert s.edge_breaks_inside_phrase == 1 and s.edge_breaks_at_clause == 1
    assert s.chunk_edges == 2 + len(ref)


def test_a_dash_between_words_is_a_clause_mark() -> None:
    got = reference_words("than he was:\u2014he might -- or not \u2014 a well-known man")
    assert got == [("than", ""), ("he", ""), ("was", ","), ("he", ""), ("might", ","),
                   ("or", ""), ("not", ","), ("a", ""), ("well", ""), ("known", ""),
                   ("man", "")]


class _CountingRecogniser:
    """Stand-in recogniser: one word per chunk it was fed."""

    runs = 0

    def __init__(self) -> None:
        _CountingRecogniser.runs += 1
        self.words: list[Word] = []

    def accept(self, chunk: AudioChunk) -> None:
        t = chunk.start_sample * 62_500
        self.words.append(Word(f"w{len(self.words)}.", t, t + 100_000_000, 0.5))

    def update(self) -> Hypothesis:
        return Hypothesis(tuple(self.words[:-1]), tuple(self.words[-1:]), 0)

    def finish(self) -> Hypothesis:
        return Hypothesis(tuple(self.words), (), 1)


def test_streamed_hypotheses_are_cached_by_audio(tmp_path) -> None:
    audio = np.linspace(-0.5, 0.5, 40_000, dtype=np.float32)
    _CountingRecogniser.runs = 0
    first = cached_hypotheses(audio, _CountingRecogniser, tmp_path)
    again = cached_hypotheses(audio, _CountingRecogniser, tmp_path)
    assert _CountingRecogniser.runs == 1 and again == first and len(first) == 6
    assert first[-1].committed[-1] == Word("w4.", 32_000 * 62_500, 32_000 * 62_500 + 10**8, 0.5)
    cached_hypotheses(audio[::-1].copy(), _CountingRecogniser, tmp_path)  # other audio
    assert _CountingRecogniser.runs == 2
    for f in tmp_path.iterdir():  # an unreadable cache entry is recomputed, not an error
        f.write_text("{not json")
    assert cached_hypotheses(audio, _CountingRecogniser, tmp_path) == first
    assert _CountingRecogniser.runs == 3
    cached_hypotheses(audio, _CountingRecogniser, None)  # no cache: always run
    assert _CountingRecogniser.runs == 4


def test_streams_pool_into_one_score() -> None:
    ref = reference_words("Hello there. How are you?")
    good = score([("hello", "", False), ("there", ".", False), ("how", "", False),
                  ("are", "", False), ("you", "?", False)], ref)
    bad = score([("hello", ".", True), ("there", "", False), ("how", "", False),
                 ("are", "", False), ("you", ".", False)], ref)
    good.add_scores(bad)
    assert good.tp["sentence"] == 3 and good.fp["sentence"] == 1 and good.fn["sentence"] == 1
    assert good.chunk_edge_breaks == 1


def test_a_spoken_paragraph_ends_a_sentence() -> None:
    session = SpokenSession("en-us", 150, (("a/1", "She paused, and added:"),
                                           ("b/2", "Is it late? No.")), np.zeros(1, np.float32))
    ref = session_reference(session)
    assert ref[3] == ("added", ".")  # the next paragraph is unrelated text
    assert ref[-1] == ("no", ".") and ref[-2] == ("late", "?")


def test_librivox_reference_ends_a_sentence_where_the_audio_skips_text() -> None:
    from subd.bench.punct_e2e import LIBRIVOX_CLIPS, librivox_reference

    ref = librivox_reference()
    assert len(ref) == len(reference_words(" ".join(t for _, t, _ in LIBRIVOX_CLIPS)))
    marks = dict(ref)  # each of these words occurs once in the clips
    assert marks["them"] == "."  # the book's own sentence end
    assert marks["man"] == ","  # clip 0890 goes on with the same sentence
    assert marks["cold"] == "" and marks["hearted"] == ""
    # clips 0900-0910 are missing: "... ill-disposed" is followed by another sentence's start
    assert ref[[w for w, _ in ref].index("had", 10)] == ("had", "")
    assert [m for w, m in ref if w == "disposed"] == ["", "."]  # "ill-disposed young man"
    assert ref[-1] == ("himself", ".")  # the last clip; unrelated speech follows
    assert marks["woman"] == ","


def test_replayed_hypotheses_mark_edges_of_each_commit() -> None:
    from subd.scoring.punct import replay
    from subd.types import Hypothesis, Word

    class Echo:  # a tagger stream that keeps the recogniser's marks
        def __init__(self) -> None:
            self.pending: list[Word] = []

        def update_from(self, hyp):
            from types import SimpleNamespace

            out = [SimpleNamespace(word=w, text=w.text.rstrip(".,"), punct=w.text[-1]
                                   if w.text[-1] in ".," else "") for w in hyp.committed]
            return SimpleNamespace(final=out)

        def flush(self, end_ns):
            from types import SimpleNamespace

            return SimpleNamespace(final=[])

    ms = 1_000_000
    words = [Word(t, i * 300 * ms, i * 300 * ms + 250 * ms)
             for i, t in enumerate("and then. we walked home.".split())]
    hyps = [Hypothesis(tuple(words[:2]), (), words[1].end_ns),
            Hypothesis(tuple(words[2:]), (), words[-1].end_ns)]
    own, tagged = replay(hyps, Echo())
    assert own == [("and", "", False), ("then", ".", True), ("we", "", False),
                   ("walked", "", False), ("home", ".", True)]
    assert tagged == own
    s = score(own, reference_words("And then we walked home."))
    assert s.chunk_edges == 2 and s.chunk_edge_breaks == 1
