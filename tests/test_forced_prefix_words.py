"""The word a forced prefix ends inside (subd.models.alignment.words_from_path).

A decode forced to continue the committed words may write a mark straight after the last of
them: "... nor of the circumstances" + ",". The tokenizer groups the mark with that word, so the
decode's first new "word" was "circumstances," again. DTW timed it from 100 ms before the
committed end, and the stream committed it a second time ("the circumstances circumstances,
which": libri-2412 at D = 1 s on its own stream). A word the decode only adds letters to ("ill"
+ "-disposed") is still returned: the recogniser keeps the rest of it (_rest_of_cut_word)."""

from __future__ import annotations

import numpy as np

from subd.models.alignment import words_from_path


def _words(engine, text: str, known_text: str) -> list[str]:
    tok = engine.tokenizer
    tokens = tok.encode(text)
    known = len(tok.encode(known_text))
    assert tokens[:known] == tok.encode(known_text)
    n = len(tokens) + 1  # and end-of-text: one DTW step each
    path = np.arange(n)
    timings = words_from_path(tok, tokens, known, np.full(len(tokens), np.nan), path, path * 3)
    return [w.text.strip() for w in timings]


def test_a_mark_after_the_prefixs_last_word_is_not_that_word_again(engine):
    assert _words(engine, " of the circumstances, which led", " of the circumstances") == [
        "which", "led"]
    assert _words(engine, " to be ill-disposed. Had he", " to be ill-disposed") == ["Had", "he"]


def test_new_words_after_the_prefix_and_a_word_it_ends_inside_are_kept(engine):
    assert _words(engine, " of the circumstances which led", " of the circumstances") == [
        "which", "led"]
    tok = engine.tokenizer
    ill = tok.encode(" to be ill")
    full = tok.encode(" to be ill-disposed young")
    assert full[:len(ill)] == ill  # the tokenizer splits "ill-disposed" after "ill"
    assert _words(engine, " to be ill-disposed young", " to be ill") == ["ill-disposed", "young"]
