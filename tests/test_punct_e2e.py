"""End to end on real speech: subd's streamed punctuation beats the recogniser's own marks.

One streaming run of the recogniser over LibriVox clips and an espeak-ng news paragraph (issue
4): the CRF tagger, fed the same hypotheses (words, pauses and Whisper's own marks), must find
sentence boundaries better than Whisper's marks do, and must not break sentences at chunk edges
more often than Whisper does. The reference is what the audio says: the book's punctuation,
and a sentence end where the clips skip text (``librivox_reference``).
"""

from __future__ import annotations

import shutil

import pytest

from subd.bench.punct_e2e import LIBRIVOX, run_e2e

pytestmark = pytest.mark.skipif(
    not sorted(LIBRIVOX.glob("*.wav")) or shutil.which("espeak-ng") is None,
    reason="needs pocketsphinx-testdata and espeak-ng",
)


@pytest.fixture(scope="module")
def result():
    return run_e2e()


def _figures(name: str, s) -> str:
    p, r, f = s.f1("sentence")
    return (f"{name}: sentence P {p:.2f} R {r:.2f} F1 {f:.2f}, '?' F1 {s.f1('?')[2]:.2f}, "
            f"',' F1 {s.f1(',')[2]:.2f}, chunk-edge breaks {s.chunk_edge_breaks} of "
            f"{s.chunk_edges} (inside a phrase {s.edge_breaks_inside_phrase}, at a clause mark "
            f"{s.edge_breaks_at_clause})")


def test_sentence_f1_is_no_worse_than_the_recogniser(result) -> None:
    print(_figures("recogniser", result.recogniser))
    print(_figures("subd CRF  ", result.tagger))
    assert result.n_words > 100
    assert result.tagger.f1("sentence")[2] >= result.recogniser.f1("sentence")[2]


def test_sentence_f1_beats_the_recogniser(result) -> None:
    assert result.tagger.f1("sentence")[2] > result.recogniser.f1("sentence")[2]


def test_no_sentence_break_inside_a_phrase_at_a_chunk_edge(result) -> None:
    # the acceptance count: a sentence end on a commit's last word where the reference has no
    # mark at all ("and then. | we walked"); breaks at a reference clause mark are counted
    # apart, and in total subd must not have more than the recogniser
    assert result.tagger.chunk_edges > 20  # the stream really was cut into many commits
    assert result.tagger.edge_breaks_inside_phrase == 0
    assert result.tagger.chunk_edge_breaks <= result.recogniser.chunk_edge_breaks
