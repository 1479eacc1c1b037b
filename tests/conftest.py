"""Shared fixtures: the packaged engine (loaded once), real speech clips with transcripts."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

LIBRIVOX_DIR = Path("/usr/share/pocketsphinx/test/data/librivox")

# Known sentences spoken by espeak-ng (synthetic but exact text).
ESPEAK_SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "We will meet again on Tuesday morning at the library.",
)


@dataclass(frozen=True, slots=True)
class Clip:
    name: str
    path: Path
    transcript: str  # lower case, no punctuation


def librivox_clips() -> list[Clip]:
    table = LIBRIVOX_DIR / "transcription"
    if not table.exists():
        return []
    clips = []
    for line in table.read_text().splitlines():
        m = re.match(r"<s>\s*(.*?)\s*</s>\s*\((.+)\)", line)
        if m:
            clips.append(Clip(m.group(2), LIBRIVOX_DIR / f"{m.group(2)}.wav", m.group(1)))
    return clips


def normalise(text: str) -> list[str]:
    """A small English normaliser for WER: case, punctuation, hyphens, common abbreviations."""
    text = text.lower().replace("-", " ")
    text = re.sub(r"[^a-z0-9' ]+", " ", text)
    subs = {"mr": "mister", "mrs": "missus", "dr": "doctor", "st": "saint"}
    return [subs.get(w, w) for w in text.split()]


def word_errors(ref: list[str], hyp: list[str]) -> int:
    d = np.arange(len(hyp) + 1)
    for i, r in enumerate(ref, 1):
        prev, d = d, np.empty_like(d)
        d[0] = i
        for j, h in enumerate(hyp, 1):
            d[j] = min(prev[j] + 1, d[j - 1] + 1, prev[j - 1] + (r != h))
    return int(d[-1])


@pytest.fixture(scope="session")
def engine():
    from subd.models.engine import WhisperEngine

    return WhisperEngine.load("tiny.en")


@pytest.fixture(scope="session")
def speech_clips() -> list[Clip]:
    clips = librivox_clips()
    if not clips:
        pytest.skip("pocketsphinx-testdata (LibriVox clips) is not installed")
    return clips


@pytest.fixture(scope="session")
def espeak_clips(tmp_path_factory) -> list[Clip]:
    exe = shutil.which("espeak-ng")
    if exe is None:
        pytest.skip("espeak-ng is not installed")
    out = tmp_path_factory.mktemp("espeak")
    clips = []
    for i, sentence in enumerate(ESPEAK_SENTENCES):
        path = out / f"espeak_{i}.wav"
        subprocess.run([exe, "-v", "en-us", "-s", "150", "-w", str(path), sentence], check=True)
        clips.append(Clip(f"espeak_{i}", path, " ".join(normalise(sentence))))
    return clips
