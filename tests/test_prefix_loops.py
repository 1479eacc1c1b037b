"""A forced prefix Whisper continues by copying it: the decode is redone without the prefix.

The committed words inside the window are forced as the start of each decode. Where they were
misread, Whisper may continue them by saying them again: LibriVox 0890's start at D = 1 s with
a fast recogniser committed "I'll let's do it." for "Unless to be", and every later decode
forced with it read "I'll let's do it." again over "rather cold-hearted and rather selfish",
which the stream committed as new words twice over.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from subd.models.alignment import WordTiming
from subd.recognise.loops import restates_prefix, transcribe_unlooped
from subd.types import Word


def _words(text: str) -> list[WordTiming]:
    return [WordTiming(" " + w, (1,), i * 0.3, i * 0.3 + 0.25, 0.9)
            for i, w in enumerate(text.split())]


def test_new_words_that_say_the_prefix_again_restate_it():
    assert restates_prefix(_words("I'll let's do it."), "I'll let's do it.")
    assert restates_prefix(_words("let's do it, and"), "Well. I'll let's do it.")
    assert restates_prefix(_words("Do it. Now"), "I'll let's DO IT now")  # case, marks aside
    # two words of it again is a phrase, not a copy; and words of their own are new
    assert not restates_prefix(_words("of the house"), "the top of the")
    assert not restates_prefix(_words("rather cold-hearted and"), "I'll let's do it.")
    assert not restates_prefix(_words("do it"), "I'll let's do it.")  # fewer words than needed


@dataclass
class _Result:
    words: tuple
    prefix_used: bool


class _Engine:
    """transcribe_window's calls recorded; forced with a prefix it copies it."""

    def __init__(self) -> None:
        self.calls = []

    def transcribe_window(self, window, prompt, policy, **kwargs):
        self.calls.append((prompt, kwargs))
        prefix = [t for t in kwargs.get("prefix", ()) if t < 1000]
        if prefix:  # the prefix's words again
            return _Result(tuple(_words(" ".join(f"w{t}" for t in prefix))), True)
        return _Result(tuple(_words("w7 w8 w9")), False)


def test_a_decode_that_restates_its_prefix_is_redone_without_it_keeping_the_prompt():
    engine = _Engine()
    said = [Word(f"w{t}", 0, 1, 0.3) for t in (1, 2, 3)]  # words Whisper was unsure of
    result = transcribe_unlooped(engine, None, [5], None, said, prefix=(1000, 1, 2, 3),
                                 retry_without_prefix=lambda: True)
    assert [w.text.strip() for w in result.words] == ["w7", "w8", "w9"]
    assert not result.prefix_used
    (first_prompt, first), (again_prompt, again) = engine.calls
    assert first["prefix"] == (1000, 1, 2, 3) and again["prefix"] == ()
    assert again_prompt == first_prompt == [5] and again["retry_without_prefix"] is None


def test_a_stream_does_not_commit_a_misread_prefix_again_and_again():
    """LibriVox 0890 at D = 1 s on the fake clock, updates as fast as a 2x faster CPU's (200 ms
    on the full input): before, the stream read "I'll let's do it. I'll let's do it. I'll let
    it is to be all disposed."."""
    import pytest

    from subd.bench import quality
    from subd.bench.quality_sets import build_set

    try:
        sset = build_set("one", ("librivox/0890",))
    except Exception as exc:  # noqa: BLE001 - pocketsphinx-testdata is not installed
        pytest.skip(f"LibriVox clips: {exc}")
    parser = argparse.ArgumentParser()
    quality.register(parser.add_subparsers())
    args = parser.parse_args(["quality", "--pace", "cpu", "--update-ms", "200,70"])
    run = quality.stream_run(sset.clips[0], 1000, args)
    words = [_plain for _plain in run.text.lower().replace(".", " ").split()]
    trigrams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
    assert len(trigrams) == len(set(trigrams)), run.text
    assert "selfish" in words, run.text
