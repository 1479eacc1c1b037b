"""A phrase said several times in a row: every copy reaches the viewer (issue 16: 0 dropped spans).

espeak-ng says "we will not go back" four times (once, then three times after "say it
again"). `subd transcribe` writes all four. `subd stream` committed three until 2026-12-02:
the fourth copy, decoded right after the third was committed, has the text of the committed
tail, and the recogniser dropped it as Whisper re-stating its context. A copy said again
starts after the commit point and lies on audio about as long as the first time, and is now
kept (subd.recognise.readings._said_again); a short word DTW gave no duration ("no, we") is
no longer taken for a looped copy either.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

TEXT = ("I told them no, no, no, no. We will not go back. Say it again: we will not go back, "
        "we will not go back, we will not go back. Thank you.")


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    exe = shutil.which("espeak-ng")
    if exe is None:
        pytest.skip("espeak-ng is not installed")
    path = tmp_path_factory.mktemp("repeat") / "repeat.wav"
    subprocess.run([exe, "-v", "en-us", "-s", "150", "-w", str(path), TEXT], check=True)
    return path


def _copies(text: str) -> int:
    return " ".join(text.lower().replace(",", " ").replace(".", " ").split()).count(
        "we will not go back")


def test_offline_transcription_hears_every_copy(clip, tmp_path):
    out = tmp_path / "off.srt"
    subprocess.run([sys.executable, "-m", "subd.cli", "transcribe", str(clip), "-o", str(out)],
                   check=True, capture_output=True, timeout=300)
    assert _copies(out.read_text()) == 4


def test_streamed_captions_keep_every_copy_of_a_repeated_phrase(clip, tmp_path):
    events = tmp_path / "ev.jsonl"
    subprocess.run([sys.executable, "-m", "subd.cli", "stream", str(clip), "--events",
                    str(events)], check=True, capture_output=True, timeout=300)
    words = [w["w"] for line in events.read_text().splitlines()
             if (e := json.loads(line)).get("type") == "tick" for w in e.get("committed", [])]
    assert _copies(" ".join(words)) == 4


def _streamed_on_the_fake_clock(wav, text: str, latency_ms: int) -> str:
    """The text ``subd bench quality --pace cpu --update-ms 450,140`` shows for ``wav`` (its
    reference ``text``) at D = ``latency_ms``: the daemon's scheduler and update planner on the
    fake clock, each update as long as one core of this project's machine takes."""
    import argparse

    import numpy as np

    from subd.bench import quality
    from subd.bench.quality_sets import SpeechSet, reference_words
    from subd.sources.decode import load_audio

    ref = reference_words(text)
    sset = SpeechSet("s", np.concatenate([load_audio(wav), np.zeros(12_000, np.float32)]),
                     [w for w, _ in ref], [m for _, m in ref])
    parser = argparse.ArgumentParser()
    quality.register(parser.add_subparsers())
    args = parser.parse_args(["quality", "--pace", "cpu", "--update-ms", "450,140"])
    return quality.stream_run(sset, latency_ms, args).text


@pytest.mark.parametrize("latency_ms", [1000, 2000])
def test_words_said_again_reach_the_captions_at_every_deadline(latency_ms, tmp_path):
    """Issue 16's own example, "try again, fail again, fail better": live captions dropped
    "fail again" at D = 1 s and "Fail" at D = 2 s (on the fake clock: the same decisions
    every run)."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        pytest.skip("espeak-ng is not installed")
    text = "Try again, fail again, fail better. Ever tried, ever failed. No matter."
    path = tmp_path / "again.wav"
    subprocess.run([exe, "-v", "en-us", "-s", "150", "-w", str(path), text], check=True)
    shown = " ".join(_streamed_on_the_fake_clock(path, text, latency_ms).lower().replace(
        ",", " ").replace(".", " ").split())
    assert "try again fail again fail better" in shown


# Known, not fixed (2026-12-04): the real-time test above lost a copy twice in ~10 runs on a
# loaded machine. Reproduced on the fake clock with each update lasting a random 0.4-1.5 s
# (seeded): 3 of 60 runs (ranges 0.1-2.0 s and 0.4-1.5 s) lost words of a copy, e.g. seed 304:
# "we will not go back, we back, we will not will not go back". A cut window's decode wrote two
# copies and the alignment squeezed the middle one to no duration ("we will not go" at one
# instant, "back," 80 ms); stacked_tail_cut drops such a run as a Whisper loop and kept its
# first word and the "back," after it. Telling real repeated speech squeezed by the alignment
# from a loop needs more than the timings: keeping a squeezed run whose next word does not
# start the phrase again fixed seed 304 and wrote a fifth copy at seeds 223, 224 and 307 (the
# alignment squeezes Whisper's looped copies the same way). Not kept.
# 2026-12-07: seed 304 keeps every copy since (four copies here and in CI); seeds 224 ("we will
# go back") and 1 (a copy lost) do not, seeds 2, 223 and 307 do: still under some timings.
# Seed 224 since (2026-12-07, 23:20): two decodes forced with the whole stream's committed text
# ("... we will not go back, we will") read nothing, the stall moved the window to 200 ms before
# the commit point, inside the committed "will", and the decode from there read "go back"
# without "not". After a stall the window now starts at the start of the committed word it would
# cut (subd.recognise.readings.word_start_at): "will not go back". Seed 1 loses its last copy either
# way (after the stall Whisper skips it: "thank" at probability 0.00 over it).
_STILL_LOST = pytest.mark.xfail(strict=False, reason="a copy squeezed by the alignment is cut "
                                "as a loop under some update timings")


@pytest.mark.parametrize("seed", [304, 224, pytest.param(1, marks=_STILL_LOST)])
def test_every_copy_survives_update_costs_that_vary(clip, seed, monkeypatch):
    import random

    from subd.bench import quality
    from subd.workers.hosts import FinishRequest, UpdateRequest

    rng = random.Random(seed)

    def cost_ns(self, request, cpu_ns):
        if isinstance(request, UpdateRequest | FinishRequest):
            return rng.randint(400, 1500) * 1_000_000
        return cpu_ns

    monkeypatch.setattr(quality.CpuTimed, "cost_ns", cost_ns)
    assert _copies(_streamed_on_the_fake_clock(clip, TEXT, 2000)) == 4
