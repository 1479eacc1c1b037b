"""Scoring of streamed punctuation against a punctuated reference (no recogniser needed)."""

from __future__ import annotations

import numpy as np

from subd.bench.punct_e2e import SpokenSession, session_reference
from subd.punct_eval import reference_words, score


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
