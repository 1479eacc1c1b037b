"""Shared fixtures: the packaged engine (loaded once), real speech clips with transcripts."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from subd.wer import normalise, word_errors  # noqa: F401 - re-exported for the tests

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
