"""Shared fixtures: the packaged engine (loaded once), real speech clips with transcripts."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from subd.scoring.wer import normalise, word_errors  # noqa: F401 - re-exported for the tests

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
    from subd.bench.realtime import librivox_clips as table
    from subd.errors import UserError

    try:
        return [Clip(path.stem, path, text) for path, text in table()]
    except UserError:  # pocketsphinx-testdata is not installed
        return []


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
