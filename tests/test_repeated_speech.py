"""A phrase said several times in a row: every copy reaches the viewer (issue 16: 0 dropped spans).

espeak-ng says "we will not go back" four times (once, then three times after "say it
again"). `subd transcribe` writes all four. `subd stream` committed three (2026-12-02): the
copies at 3.7, 6.5 and 9.4 s, none in the 1.6 s of speech between 7.8 and 9.4 s. On the fake
clock (one core's costs, 450 / 140 ms) it is the same at D = 2 s (full input), with the forced
committed prefix and without it; at D = 1 s (cut span) all four are kept. The decode at 8.9 s
read the missing copy as tentative; the decodes after it, with both copies heard, read one
"We will not go back." and the alignment put it on the later copy. At D = 2 s it drops a copy on
the cut span too, and with the window trimmed after 6 s of committed audio (not 15) it drops
two: Whisper reads two identical phrases as one when both are still undecided in its window,
which D = 1 s never lets happen. Chants, refrains and repeated slogans are real live speech:
xfail until every copy is kept.
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


@pytest.mark.xfail(strict=False, reason=(
    "issue 16: the streamed path drops one copy of a phrase repeated back to back (3 of 4 "
    "committed; cause not traced)"))
def test_streamed_captions_keep_every_copy_of_a_repeated_phrase(clip, tmp_path):
    events = tmp_path / "ev.jsonl"
    subprocess.run([sys.executable, "-m", "subd.cli", "stream", str(clip), "--events",
                    str(events)], check=True, capture_output=True, timeout=300)
    words = [w["w"] for line in events.read_text().splitlines()
             if (e := json.loads(line)).get("type") == "tick" for w in e.get("committed", [])]
    assert _copies(" ".join(words)) == 4
