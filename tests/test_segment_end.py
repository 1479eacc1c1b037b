"""A stream's last words: Whisper may close its segment and end the decode with speech after it.

Offline, Whisper's next window reads on from that segment's end. A stream's last decode has no
next update: dev's LibriTTS 5895 ends "... over his shoulders an esclavine of leather", and its
last decodes read "over his shoulders and" and stopped (``<|6.16|><|6.16|>``, then the end);
the alignment stretched "and" over the words left out (7.28-7.84 s), so nothing seemed left to
decode, and D = 4 s dropped "an esclavine of leather". Now a word the alignment runs past its
segment's end moves back before it (``models.alignment.within_segments``, as Whisper prefers
its segment's end timestamp), and the stream's end decodes on from the committed words while
speech is left after them (``StreamingRecognizer.finish``).
"""

from __future__ import annotations

import argparse

import pytest

from subd.models.alignment import WordTiming, within_segments

TS = 50363  # tiny.en's <|0.00|>


def _word(text: str, start: float, end: float) -> WordTiming:
    return WordTiming(" " + text, (1,), start, end, 0.9)


def test_a_word_the_alignment_ran_past_its_segment_end_moves_back_before_it():
    words = [_word("shoulders", 5.40, 5.76), _word("and", 7.28, 7.84)]
    tokens = (TS, 1, 1, TS + 308, TS + 308)  # "shoulders and<|6.16|><|6.16|>"
    moved = within_segments(words, tokens, TS)
    assert moved[0] == words[0]
    assert (moved[1].start_s, moved[1].end_s) == (pytest.approx(5.76), pytest.approx(6.16))
    # within half a second of the timestamp (DTW is finer than Whisper's timestamps), or a
    # segment Whisper did not close (the decode ended inside it): as aligned
    assert within_segments([_word("and", 6.0, 6.6)], (TS, 1, TS + 308), TS)[0].end_s == 6.6
    assert within_segments(words, (TS, 1, 1), TS) == words
    # the words of a forced prefix are not returned: the returned words time the last tokens
    two = [_word("his", 4.9, 5.1), _word("shoulders", 5.4, 7.9)]
    out = within_segments(two, (TS, 1, 1, 1, TS + 100, TS + 150, 1, 1, TS + 300), TS)
    assert out[0].end_s == 5.1 and out[1].end_s == pytest.approx(6.0)


def test_a_streams_last_words_after_a_closed_segment_are_not_lost():
    """The clip at D = 4 s on the fake clock, each update as long as on one core of the
    project's machine: its last words reach the captions."""
    from subd.bench import quality
    from subd.bench.quality_sets import build_set

    sset = build_set("one", ("speech/libritts-5895-34622-000026-000002",))
    parser = argparse.ArgumentParser()
    quality.register(parser.add_subparsers())
    args = parser.parse_args(["quality", "--pace", "cpu", "--update-ms", "450,140"])
    run = quality.stream_run(sset.clips[0], 4000, args)
    assert run.dropped == []
    assert run.text.lower().rstrip(".").endswith("of leather")
