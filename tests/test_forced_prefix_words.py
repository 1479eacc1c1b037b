"""The word a forced prefix ends inside (subd.models.alignment.words_from_path).

A decode forced to continue the committed words may write a mark straight after the last of
them: "... nor of the circumstances" + ",". The tokenizer groups the mark with that word, so the
decode's first new "word" was "circumstances," again. DTW timed it from 100 ms before the
committed end, and the stream committed it a second time ("the circumstances circumstances,
which": libri-2412 at D = 1 s on its own stream). A word the decode only adds letters to ("ill"
+ "-disposed", "Gint" + "lane") was a cut-off start, committed at its deadline: only the rest is
returned, as a word ``joined`` to the one before it (the whole word had been committed after
it: "Gint Gintlane had the sides", libritts-5895 at D = 2 s; shown apart, it read "letter
press"), unless the rest is one letter, which only re-spells the committed word ("man" + "e":
"ride a man e into the woods", libri-3436 at D = 1 s)."""

from __future__ import annotations

import numpy as np

from subd.models.alignment import words_from_path


def _words(engine, text: str, known_text: str) -> list[str]:
    return [w.text.strip() for w in _timings(engine, text, known_text)]


def _timings(engine, text: str, known_text: str):
    tok = engine.tokenizer
    tokens = tok.encode(text)
    known = len(tok.encode(known_text))
    assert tokens[:known] == tok.encode(known_text)
    n = len(tokens) + 1  # and end-of-text: one DTW step each
    path = np.arange(n)
    return words_from_path(tok, tokens, known, np.full(len(tokens), np.nan), path, path * 3)


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
    assert _words(engine, " to be ill-disposed young", " to be ill") == ["-disposed", "young"]
    assert tok.encode(" Gintlane had")[:2] == tok.encode(" Gint")  # " G" "int" | "lane"
    assert _words(engine, " Gintlane had the", " Gint") == ["lane", "had", "the"]
    assert _words(engine, " It befell in", " It be") == ["fell", "in"]
    # the rest is joined to the committed word; the words after it are words of their own
    assert [w.joined for w in _timings(engine, " Gintlane had the", " Gint")] == [
        True, False, False]
    assert not any(w.joined for w in _timings(engine, " of the circumstances which led",
                                              " of the circumstances"))


def test_the_rest_of_a_continued_word_is_timed_from_its_own_tokens(engine):
    tok = engine.tokenizer
    tokens = tok.encode(" Gintlane had")
    path = np.arange(len(tokens) + 1)  # token j starts at step j: 3 x 20 ms
    timings = words_from_path(tok, tokens, 2, np.full(len(tokens), np.nan), path, path * 3)
    lane = timings[0]
    assert lane.text == "lane" and lane.tokens == tuple(tokens[2:3]) and lane.joined
    assert lane.start_s == 2 * 3 * 0.02  # where "lane" starts, not where " G" did


def test_one_letter_that_re_spells_the_prefixs_last_word_is_no_word(engine):
    assert _words(engine, " ride a mane into the", " ride a man") == ["into", "the"]
    assert _words(engine, " Queen Guineverer called", " Queen Guinevere") == ["called"]
    assert _words(engine, " Queen Guineverer. Then", " Queen Guinevere") == ["Then"]
    # a word's rest of more letters stays a word ("letter" + "press")
    assert _words(engine, " the letterpress is", " the letter") == ["press", "is"]


def test_the_rest_of_a_word_is_shown_and_prompted_as_part_of_it():
    """A committed word and its rest (``Word.joined``) read as one word on screen and in the
    next decode's prompt ("letter" + "press": "letterpress", not "letter press"); after a mark
    the tagger put on the first part, they stay apart."""
    from subd.layout.cues import token_of
    from subd.layout.rules import line_text
    from subd.models.words import prompt_of
    from subd.types import TaggedWord, Word

    ms = 1_000_000
    words = [Word("the", 0, 200 * ms), Word("letter", 200 * ms, 500 * ms),
             Word("press", 500 * ms, 700 * ms, joined=True), Word("is", 700 * ms, 900 * ms)]
    assert prompt_of(words) == " the letterpress is"
    tagged = [TaggedWord(w, w.text, case="cap" if w.joined else "lower") for w in words]
    assert line_text([token_of(t) for t in tagged]) == "the letterpress is"
    tagged[1] = TaggedWord(words[1], "letter", punct=",")
    assert line_text([token_of(t) for t in tagged]) == "the letter, press is"
