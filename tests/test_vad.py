"""Voice-activity detection: silence and noise are never speech; real speech is found."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from subd.recognise.vad import FRAME_SAMPLES, VoiceActivityDetector, regions_from_mask
from subd.sources.decode import load_audio

SR = 16_000
LIBRIVOX = sorted(Path("/usr/share/pocketsphinx/test/data/librivox").glob("*.wav"))
needs_librivox = pytest.mark.skipif(not LIBRIVOX, reason="pocketsphinx-testdata not installed")
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="no espeak-ng")


@pytest.fixture(scope="module")
def espeak_speech(tmp_path_factory) -> np.ndarray:
    """A spoken sentence, 16 kHz mono, with espeak's leading/trailing silence trimmed."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("no espeak-ng")
    path = tmp_path_factory.mktemp("espeak") / "sentence.wav"
    text = "The quick brown fox jumps over the lazy dog. Subtitles appear on time, every time."
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    audio = load_audio(path)
    loud = np.flatnonzero(np.abs(audio) > 0.01)
    return audio[loud[0] : loud[-1] + 1]


@pytest.mark.parametrize("aggressiveness", [0, 1, 2, 3])
def test_one_minute_of_digital_silence_is_not_speech(aggressiveness):
    vad = VoiceActivityDetector(aggressiveness)
    silence = np.zeros(60 * SR, dtype=np.float32)
    assert not vad.speech_mask(silence).any()
    assert vad.speech_regions(silence) == []
    assert vad.speech_ratio(silence) == 0.0


@pytest.mark.parametrize("aggressiveness", [0, 1, 2, 3])
def test_one_minute_of_white_noise_is_not_speech(aggressiveness):
    # webrtcvad alone calls 100 % of these frames speech; the flatness test must reject them.
    noise = np.random.default_rng(0).normal(0, 0.1, 60 * SR).astype(np.float32)
    vad = VoiceActivityDetector(aggressiveness)
    assert vad.speech_mask(noise).mean() < 0.01
    assert vad.speech_regions(noise) == []
    assert vad.speech_ratio(noise) == 0.0


@pytest.mark.parametrize("sigma", [0.003, 0.3])
def test_quiet_and_loud_white_noise_is_not_speech(sigma):
    noise = np.random.default_rng(1).normal(0, sigma, 20 * SR).clip(-1, 1).astype(np.float32)
    assert VoiceActivityDetector(3).speech_regions(noise) == []


@needs_librivox
@pytest.mark.parametrize("path", LIBRIVOX, ids=lambda p: p.stem[-4:])
def test_audiobook_speech_is_detected(path):
    audio = load_audio(path)
    assert VoiceActivityDetector(3).speech_ratio(audio) > 0.8


@needs_librivox
def test_speech_in_white_noise_at_10_db_snr_is_still_detected():
    audio = load_audio(LIBRIVOX[0])
    noise_rms = np.sqrt(np.mean(audio**2) / 10)
    noisy = audio + np.random.default_rng(2).normal(0, noise_rms, audio.shape).astype(np.float32)
    assert VoiceActivityDetector(3).speech_ratio(noisy) > 0.6


@needs_espeak
def test_regions_find_speech_between_silence_and_noise(espeak_speech):
    rng = np.random.default_rng(3)
    speech = espeak_speech
    parts = [
        np.zeros(2 * SR, np.float32),
        speech,
        rng.normal(0, 0.05, 3 * SR).astype(np.float32),
        speech,
        np.zeros(SR, np.float32),
    ]
    audio = np.concatenate(parts)
    starts = np.cumsum([0] + [len(p) for p in parts])
    truth = [(starts[1], starts[2]), (starts[3], starts[4])]
    pad = round(0.09 * SR)

    regions = VoiceActivityDetector(3).speech_regions(audio, pad_ms=90)

    assert regions, "no speech found"
    # every region lies on a spoken sentence (within the padding and one frame)
    for lo, hi in regions:
        assert any(
            s - pad - FRAME_SAMPLES <= lo and hi <= e + pad + FRAME_SAMPLES for s, e in truth
        )
    # each sentence is mostly covered
    for s, e in truth:
        covered = sum(max(0, min(hi, e) - max(lo, s)) for lo, hi in regions)
        assert covered / (e - s) > 0.8


@needs_espeak
def test_mask_has_one_entry_per_30ms_frame_and_is_repeatable(espeak_speech):
    vad = VoiceActivityDetector(2)
    audio = espeak_speech[: 10 * FRAME_SAMPLES + 123]
    mask = vad.speech_mask(audio)
    assert mask.dtype == bool and mask.shape == (11,)
    np.testing.assert_array_equal(mask, vad.speech_mask(audio))


def test_regions_from_mask_joins_short_gaps_and_drops_blips():
    mask = np.zeros(100, dtype=bool)
    mask[10:20] = True  # 300 ms
    mask[25:35] = True  # gap of 150 ms: joined with the run before
    mask[60:62] = True  # a 60 ms blip: dropped
    regions = regions_from_mask(mask, n_samples=100 * FRAME_SAMPLES, pad_ms=0)
    assert regions == [(10 * FRAME_SAMPLES, 35 * FRAME_SAMPLES)]


def test_regions_from_mask_pads_within_the_audio():
    mask = np.ones(20, dtype=bool)
    n_samples = 20 * FRAME_SAMPLES - 100
    assert regions_from_mask(mask, n_samples=n_samples, pad_ms=200) == [(0, n_samples)]


def test_empty_audio():
    vad = VoiceActivityDetector()
    empty = np.zeros(0, dtype=np.float32)
    assert vad.speech_mask(empty).shape == (0,)
    assert vad.speech_regions(empty) == [] and vad.speech_ratio(empty) == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"aggressiveness": 4},
        {"aggressiveness": -1},
        {"max_flatness": 0.0},
        {"energy_floor_dbfs": 10.0},
        {"min_voiced_run_ms": -1},
    ],
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        VoiceActivityDetector(**kwargs)


def test_bad_audio_is_refused():
    vad = VoiceActivityDetector()
    with pytest.raises(ValueError, match="1-D"):
        vad.speech_mask(np.zeros((2, 480), np.float32))
    with pytest.raises(ValueError, match="min_silence_ms"):
        vad.speech_regions(np.zeros(480, np.float32), min_silence_ms=-5)
