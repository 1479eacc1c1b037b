"""The shipped punctuation tagger: inputs users give it and sentences it must get right."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from subd.errors import ModelError
from subd.models.punct import (
    CASES,
    PUNCTS,
    PunctTagger,
    RecogniserMark,
    recogniser_mark,
    render,
    tag_words,
)
from subd.models.punct.features import Featuriser
from subd.models.punct.tagger import PACKAGE_DIR
from subd.models.punct.text import apply_case, label_text, normalise_word
from subd.types import Word

MS = 1_000_000


@pytest.fixture(scope="module")
def tagger() -> PunctTagger:
    return PunctTagger.load()


def _speak(text: str, long_pause_after: set[int], gap_ms: int = 40) -> list[Word]:
    """Words 250 ms long, ``gap_ms`` apart, 700 ms of silence after the given indices."""
    out, t = [], 0
    for i, w in enumerate(text.split()):
        out.append(Word(w, t * MS, (t + 250) * MS))
        t += 250 + (700 if i in long_pause_after else gap_ms)
    return out


def _text(tagger: PunctTagger, text: str, long_pause_after: set[int]) -> str:
    return render(tag_words(tagger, _speak(text, long_pause_after)))


def test_empty_input_gives_no_tags(tagger: PunctTagger) -> None:
    assert tagger.tag([], []) == []
    assert tag_words(tagger, []) == []


def test_one_word_is_a_sentence(tagger: PunctTagger) -> None:
    [tag] = tagger.tag(["hello"], [800.0])
    assert tag.case == "cap"
    assert tag.punct in {".", "!"}


def test_ten_thousand_words(tagger: PunctTagger) -> None:
    unit = "where are you going i am going home".split()
    words = unit * 1250
    pauses = [900.0 if i % 8 in (3, 7) else 30.0 for i in range(len(words))]
    tags = tagger.tag(words, pauses, right_context_complete=False)
    assert len(tags) == 10_000
    assert all(t.punct in PUNCTS and t.case in CASES and 0.0 <= t.break_after <= 1.0
               for t in tags)
    # The same two sentences, 1250 times: punctuated the same way across window boundaries
    # (the last two, whose right context the stream cut, may be left open).
    shown = {" ".join(f"{t.case}{t.punct}" for t in tags[i : i + 8])
             for i in range(0, 10_000 - 8, 8)}
    assert shown == {"cap lower lower lower? cap lower lower lower."}


def test_digits_stay_digits(tagger: PunctTagger) -> None:
    out = _text(tagger, "i bought 3 apples for 25 cents in 1999", {8})
    assert out.startswith("I bought 3 apples for 25 cents in 1999")


def test_apostrophes_are_kept_and_i_is_capital(tagger: PunctTagger) -> None:
    out = _text(tagger, "i don't know what i'm doing", {5})
    assert out == "I don't know what I'm doing."


def test_non_ascii_letters(tagger: PunctTagger) -> None:
    words = ["élodie", "a", "mangé", "une", "crêpe", "à", "zürich", "東京"]
    tags = tagger.tag(words, [30.0] * 7 + [900.0])
    assert len(tags) == len(words)
    assert apply_case("élodie", "cap") == "Élodie"
    assert tags[0].case == "cap"
    assert tags[-1].punct in {".", "!"}


def test_unseen_words_are_tagged(tagger: PunctTagger) -> None:
    feat = Featuriser(tagger.featuriser.vocab)
    for w in ("flibbertigibbetxq", "zyxwvut"):
        assert feat.word_static(w)[0] > len(feat.vocab.words)  # an OOV bucket
    out = _text(tagger, "the zyxwvut was flibbertigibbetxq", {3})
    assert out == "The zyxwvut was flibbertigibbetxq."


def test_recogniser_punctuation_and_case_are_replaced(tagger: PunctTagger) -> None:
    words = _speak("Where are you. Going I am going, home", {3})
    assert render(tag_words(tagger, words)) == "Where are you going? I am going home."


@pytest.mark.parametrize(
    ("text", "pauses", "expected"),
    [
        ("where are you going i am going home", {3},
         "Where are you going? I am going home."),
        ("what time is it it is late", {3}, "What time is it? It is late."),
        # Harvard list 3, held out of training.
        ("the small pup gnawed a hole in the sock the fish twisted and turned on the bent hook",
         {8}, "The small pup gnawed a hole in the sock. The fish twisted and turned on the bent "
              "hook."),
    ],
)
def test_restores_marks_and_capitals(tagger: PunctTagger, text: str, pauses: set[int],
                                     expected: str) -> None:
    assert _text(tagger, text, pauses) == expected


def test_chunk_edge_gets_no_period_once_context_arrives(tagger: PunctTagger) -> None:
    words = "i went to the market and then we walked home together".split()
    pauses = [40.0] * len(words)
    edge = words.index("then")
    partial = tagger.tag(words[: edge + 1], pauses[: edge + 1], right_context_complete=False)
    full = tagger.tag(words, pauses, right_context_complete=True)
    assert partial[edge].punct not in {".", "?", "!"}  # withheld context: no guess of an end
    assert full[edge].punct == ""
    assert full[edge + 1].case == "lower"
    assert full[-1].punct == "."


def _marked(tagger: PunctTagger, spelled: str, edge_after: set[int],
            long_pause_after: set[int]) -> str:
    """Tag words as the recogniser spelled them ("safe?"), its marks given as evidence; words
    in ``edge_after`` ended its decoded window (nothing decoded after them)."""
    words = _speak(spelled, long_pause_after)
    marks = [recogniser_mark(w.text, 0 if i in edge_after else 3) for i, w in enumerate(words)]
    tags = tagger.tag([w.text for w in words], [700.0 if i in long_pause_after else 40.0
                                                for i in range(len(words))], recogniser=marks)
    plain = [normalise_word(w.text) for w in words]
    return " ".join(f"{w}{t.punct}" for w, t in zip(plain, tags, strict=True))


def test_recogniser_question_mark_is_kept(tagger: PunctTagger) -> None:
    # Only intonation says it is a question: the recogniser heard it, the words do not say so.
    spelled = "You are going home? I thought you would stay."
    assert _marked(tagger, spelled, set(), {3}) == "you are going home? i thought you would stay."


def test_recogniser_period_at_a_window_edge_is_not_trusted(tagger: PunctTagger) -> None:
    # "then." ended the recogniser's window while speech went on without a pause.
    spelled = "I went to the market and then. We walked home together."
    assert _marked(tagger, spelled, {6}, set()) == (
        "i went to the market and then we walked home together.")


def test_recogniser_marks_unknown_is_plain_text(tagger: PunctTagger) -> None:
    words = "where are you going i am going home".split()
    pauses = [40.0, 40.0, 40.0, 700.0, 40.0, 40.0, 40.0, 700.0]
    plain = tagger.tag(words, pauses)
    assert tagger.tag(words, pauses, recogniser=[None] * len(words)) == plain
    with pytest.raises(ValueError, match="recogniser marks"):
        tagger.tag(words, pauses, recogniser=[RecogniserMark(".", "cap")])


def test_labels_from_text() -> None:
    got = [(w.word, w.punct, w.case) for w in label_text('"Yes, Mr. Darcy," said she. NASA?')]
    assert got == [("yes", ",", "cap"), ("mr", "", "cap"), ("darcy", ",", "cap"),
                   ("said", "", "lower"), ("she", ".", "lower"), ("nasa", "?", "upper")]
    assert normalise_word("Don\u2019t,") == "don't"
    assert normalise_word("--") == ""


def test_tampered_weights_are_refused(tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(PACKAGE_DIR, model, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    data = bytearray((model / "weights.pt").read_bytes())
    data[-100] ^= 0xFF
    (model / "weights.pt").write_bytes(bytes(data))
    with pytest.raises(ModelError, match="SHA-256") as err:
        PunctTagger.load(model)
    assert "\n" not in str(err.value)


def test_missing_model_is_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="missing file") as err:
        PunctTagger.load(tmp_path)
    assert "\n" not in str(err.value)


def test_channels_share_one_loaded_tagger_each_with_its_own_stream() -> None:
    """The tag process serves every channel: loading the CRF for each one that joined took
    40-48 ms there, under the others' tag passes. It is loaded once; each channel's state is
    its own stream, and one channel's words do not reach another's."""
    from subd.types import Word
    from subd.workers.hosts import make_punct_stream

    a, b = make_punct_stream(), make_punct_stream()
    assert a is not b and a.tagger.crf is b.tagger.crf
    words = [Word(w, i * 400_000_000, i * 400_000_000 + 300_000_000)
             for i, w in enumerate("hello there how are you".split())]
    tagged = a.update(words, [], words[-1].end_ns + 2_000_000_000).final + a.flush().final
    alone = make_punct_stream()
    assert b.flush().final == alone.flush().final == ()  # b heard nothing
    assert [t.word.text for t in tagged] == [w.text for w in words]
