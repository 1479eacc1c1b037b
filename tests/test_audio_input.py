"""Audio input: every file/stream a user may point subd at comes out as 16 kHz mono float32,
and every bad one is refused with a one-line AudioInputError naming the file."""

from __future__ import annotations

import io
import logging
import shutil
import subprocess
import tracemalloc
import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from subd.errors import AudioInputError, UserError
from subd.sources.decode import (
    InputStats,
    PcmSpec,
    iter_audio_blocks,
    iter_pcm_blocks,
    load_audio,
    total_duration_s,
)

SR = 16_000
needs_ffmpeg = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg not installed")


def sine(rate_hz: int, seconds: float, freq_hz: float = 440.0, amp: float = 0.5) -> np.ndarray:
    t = np.arange(round(rate_hz * seconds)) / rate_hz
    return amp * np.sin(2 * np.pi * freq_hz * t)


def dominant_hz(x: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / SR)[np.argmax(spectrum)])


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def assert_one_line_error(exc: pytest.ExceptionInfo, path: Path | str | None = None) -> str:
    msg = str(exc.value)
    assert msg and "\n" not in msg and "Traceback" not in msg
    if path is not None:
        assert str(path) in msg
    return msg


def no_ffmpeg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(empty))


def make_with_ffmpeg(src: Path, dst: Path) -> Path:
    subprocess.run(
        ["ffmpeg", "-nostdin", "-loglevel", "error", "-y", "-i", str(src), str(dst)], check=True
    )
    return dst


# ---- good files --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate_hz", "subtype", "channels"),
    [
        (16_000, "PCM_16", 1),
        (8_000, "PCM_16", 1),
        (48_000, "PCM_16", 2),
        (44_100, "PCM_24", 1),
        (22_050, "PCM_32", 2),
        (48_000, "FLOAT", 1),
        (32_000, "DOUBLE", 1),
    ],
)
def test_wav_any_rate_depth_channels_becomes_16k_mono(tmp_path, rate_hz, subtype, channels):
    x = sine(rate_hz, 2.0)
    data = np.stack([x] * channels, axis=1) if channels > 1 else x
    path = tmp_path / f"tone_{rate_hz}_{subtype}_{channels}.wav"
    sf.write(path, data, rate_hz, subtype=subtype)

    out = load_audio(path)

    assert out.dtype == np.float32 and out.ndim == 1
    assert abs(out.shape[0] - 2 * SR) <= 4
    assert abs(dominant_hz(out) - 440.0) < 1.0
    assert rms(out) == pytest.approx(0.5 / np.sqrt(2), rel=0.02)
    assert total_duration_s(path) == pytest.approx(2.0)


def test_8bit_wav_written_with_wave_module(tmp_path):
    x = sine(11_025, 1.0, amp=0.8)
    path = tmp_path / "u8.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(11_025)
        w.writeframes(np.round(x * 127 + 128).astype(np.uint8).tobytes())

    out = load_audio(path)

    assert abs(out.shape[0] - SR) <= 4
    assert abs(dominant_hz(out) - 440.0) < 2.0
    assert rms(out) == pytest.approx(0.8 / np.sqrt(2), rel=0.03)


def test_stereo_is_averaged_to_mono(tmp_path):
    left = sine(SR, 1.0, 440.0, amp=0.6)
    right = np.zeros_like(left)
    path = tmp_path / "left_only.wav"
    sf.write(path, np.stack([left, right], axis=1), SR, subtype="FLOAT")

    out = load_audio(path)

    np.testing.assert_allclose(out, left / 2, atol=1e-6)


@pytest.mark.parametrize(
    ("suffix", "fmt", "subtype"), [("flac", "FLAC", "PCM_16"), ("ogg", "OGG", "VORBIS")]
)
def test_flac_and_ogg(tmp_path, suffix, fmt, subtype):
    path = tmp_path / f"tone.{suffix}"
    sf.write(path, sine(44_100, 1.5), 44_100, format=fmt, subtype=subtype)

    out = load_audio(path)

    assert abs(out.shape[0] - round(1.5 * SR)) <= 4
    assert abs(dominant_hz(out) - 440.0) < 1.0
    assert rms(out) == pytest.approx(0.5 / np.sqrt(2), rel=0.05)


def test_nan_and_inf_samples_are_replaced_counted_and_reported_once(tmp_path, caplog):
    x = sine(SR, 1.0).astype(np.float32)
    bad = [10, 500, 501, 9000]
    x[bad] = [np.nan, np.inf, -np.inf, np.nan]
    path = tmp_path / "nan.wav"
    sf.write(path, x, SR, subtype="FLOAT")
    stats = InputStats()

    with caplog.at_level(logging.WARNING, logger="subd.sources.decode"):
        out = load_audio(path, stats=stats)

    assert np.isfinite(out).all()
    assert (out[bad] == 0).all()
    np.testing.assert_allclose(np.delete(out, bad), np.delete(x, bad), atol=1e-7)
    assert stats.n_nonfinite == 4
    warnings = [r for r in caplog.records if "NaN" in r.getMessage()]
    assert len(warnings) == 1 and "4" in warnings[0].getMessage()


def test_all_nan_file_is_rejected(tmp_path):
    path = tmp_path / "allnan.wav"
    sf.write(path, np.full(1600, np.nan, dtype=np.float32), SR, subtype="FLOAT")
    with pytest.raises(AudioInputError) as exc:
        load_audio(path)
    assert "NaN" in assert_one_line_error(exc, path)


def test_float_samples_beyond_full_scale_are_clipped(tmp_path):
    path = tmp_path / "hot.wav"
    sf.write(path, sine(48_000, 1.0, amp=3.0).astype(np.float32), 48_000, subtype="FLOAT")
    stats = InputStats()
    out = load_audio(path, stats=stats)
    assert out.max() <= 1.0 and out.min() >= -1.0
    assert out.max() > 0.99 and stats.n_clipped > 0


def test_blocks_have_fixed_size_and_match_whole_file(tmp_path):
    path = tmp_path / "tone.wav"
    sf.write(path, sine(44_100, 1.1), 44_100)
    blocks = list(iter_audio_blocks(path, block_samples=4000))
    assert all(b.shape == (4000,) for b in blocks[:-1]) and 0 < blocks[-1].shape[0] <= 4000
    np.testing.assert_allclose(np.concatenate(blocks), load_audio(path), atol=1e-5)


def test_max_seconds_keeps_only_the_start(tmp_path):
    path = tmp_path / "tone.wav"
    sf.write(path, sine(48_000, 3.0), 48_000)
    assert load_audio(path, max_seconds=0.5).shape == (SR // 2,)


def test_two_hour_file_streams_with_bounded_memory(tmp_path):
    path = tmp_path / "two_hours_silence.wav"
    n_frames = 2 * 3600 * 8_000
    zeros = np.zeros(8_000 * 600, dtype=np.int16)
    with sf.SoundFile(path, "w", samplerate=8_000, channels=1, subtype="PCM_16") as f:
        for _ in range(n_frames // zeros.shape[0]):
            f.write(zeros)
    file_bytes = path.stat().st_size
    assert file_bytes > 115_000_000
    assert total_duration_s(path) == pytest.approx(7200.0)

    n_samples = 0
    peak_abs = 0.0
    tracemalloc.start()
    try:
        for block in iter_audio_blocks(path):
            n_samples += block.shape[0]
            peak_abs = max(peak_abs, float(np.abs(block).max()))
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert n_samples == 2 * 3600 * SR
    assert peak_abs == 0.0
    # 30 s blocks are 1.9 MB; decoding the whole file at once would take 460 MB (float32).
    assert peak_bytes < 20_000_000, f"peak {peak_bytes} bytes for a {file_bytes}-byte file"


# ---- ffmpeg ------------------------------------------------------------------------------


@needs_ffmpeg
def test_mp3_goes_through_ffmpeg(tmp_path):
    wav = tmp_path / "tone.wav"
    sf.write(wav, sine(44_100, 2.0), 44_100)
    mp3 = make_with_ffmpeg(wav, tmp_path / "tone.mp3")

    out = load_audio(mp3)

    assert abs(out.shape[0] - 2 * SR) < SR // 20
    assert abs(dominant_hz(out) - 440.0) < 1.0
    assert rms(out) == pytest.approx(0.5 / np.sqrt(2), rel=0.05)
    assert total_duration_s(mp3) == pytest.approx(2.0, abs=0.1)


@needs_ffmpeg
def test_m4a_needs_ffmpeg_and_says_so_without_it(tmp_path, monkeypatch):
    wav = tmp_path / "tone.wav"
    sf.write(wav, sine(44_100, 1.0), 44_100)
    m4a = make_with_ffmpeg(wav, tmp_path / "tone.m4a")
    assert abs(dominant_hz(load_audio(m4a)) - 440.0) < 1.0

    no_ffmpeg(monkeypatch, tmp_path)
    with pytest.raises(AudioInputError) as exc:
        load_audio(m4a)
    assert "ffmpeg" in assert_one_line_error(exc, m4a)


@needs_ffmpeg
def test_mp3_still_decodes_without_ffmpeg(tmp_path, monkeypatch):
    wav = tmp_path / "tone.wav"
    sf.write(wav, sine(44_100, 1.0), 44_100)
    mp3 = make_with_ffmpeg(wav, tmp_path / "tone.mp3")
    no_ffmpeg(monkeypatch, tmp_path)
    out = load_audio(mp3)
    assert abs(dominant_hz(out) - 440.0) < 1.0


@needs_ffmpeg
def test_stopping_early_ends_the_ffmpeg_process(tmp_path):
    wav = tmp_path / "long.wav"
    sf.write(wav, sine(16_000, 20.0), 16_000)
    mp3 = make_with_ffmpeg(wav, tmp_path / "long.mp3")
    blocks = iter_audio_blocks(mp3, block_samples=1600)
    assert next(blocks).shape == (1600,)
    blocks.close()  # must kill ffmpeg and close its pipe (a leak would warn -> error here)
    assert load_audio(mp3, max_seconds=1.0).shape == (SR,)


@needs_ffmpeg
def test_undecodable_binary_is_one_line_error_from_ffmpeg(tmp_path):
    path = tmp_path / "noise.bin"
    path.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(AudioInputError) as exc:
        load_audio(path)
    assert_one_line_error(exc, path)


# ---- bad files ---------------------------------------------------------------------------


def _good_wav_bytes(tmp_path: Path) -> bytes:
    path = tmp_path / "good.wav"
    sf.write(path, sine(SR, 0.5), SR, subtype="PCM_16")
    return path.read_bytes()


@pytest.mark.parametrize(
    ("name", "make", "expect"),
    [
        ("empty.wav", lambda good: b"", "empty"),
        ("trunc20.wav", lambda good: good[:20], "truncated"),
        ("trunc40.wav", lambda good: good[:40], "truncated"),
        ("header_only.wav", lambda good: good[:44], "no audio"),
        ("text.wav", lambda good: b"this is not audio\nreally it is not\n" * 20, "text"),
        ("trunc.flac", None, "FLAC"),
    ],
)
def test_bad_files_give_one_line_errors(tmp_path, name, make, expect):
    good = _good_wav_bytes(tmp_path)
    path = tmp_path / name
    if make is None:
        flac = tmp_path / "good.flac"
        sf.write(flac, sine(SR, 0.5), SR)
        path.write_bytes(flac.read_bytes()[:30])
    else:
        path.write_bytes(make(good))
    with pytest.raises(AudioInputError) as exc:
        load_audio(path)
    assert expect in assert_one_line_error(exc, path)
    with pytest.raises(AudioInputError):
        iter_audio_blocks(path)  # refused when called, before the first block is asked for


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(AudioInputError) as exc:
        load_audio(tmp_path / "nope.wav")
    assert "no such file" in assert_one_line_error(exc, tmp_path / "nope.wav")
    with pytest.raises(AudioInputError) as exc:
        load_audio(tmp_path)
    assert "directory" in assert_one_line_error(exc, tmp_path)


def test_binary_garbage_named_wav_without_ffmpeg(tmp_path, monkeypatch):
    path = tmp_path / "garbage.wav"
    path.write_bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    no_ffmpeg(monkeypatch, tmp_path)
    with pytest.raises(AudioInputError) as exc:
        load_audio(path)
    assert "not a valid WAV" in assert_one_line_error(exc, path)


def test_bad_parameters_are_user_errors(tmp_path):
    path = tmp_path / "tone.wav"
    sf.write(path, sine(SR, 0.1), SR)
    for kwargs in ({"block_samples": 0}, {"max_seconds": -1.0}, {"max_seconds": float("nan")}):
        with pytest.raises(UserError) as exc:
            list(iter_audio_blocks(path, **kwargs))
        assert_one_line_error(exc)


# ---- raw PCM streams ---------------------------------------------------------------------


class TrickleStream(io.RawIOBase):
    """A pipe that hands out at most ``n`` bytes per read, like a slow stdin."""

    def __init__(self, data: bytes, n: int) -> None:
        self._data = io.BytesIO(data)
        self._n = n

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        return self._data.read(min(self._n, size if size >= 0 else self._n))


def test_stdin_s16le_mono_16k_is_exact():
    ints = np.array([0, 1, -1, 32767, -32768, 1234], dtype="<i2").repeat(100)
    out = np.concatenate(list(iter_pcm_blocks(io.BytesIO(ints.tobytes()), fmt="s16le")))
    np.testing.assert_array_equal(out, ints.astype(np.float32) / 32768)


def test_stdin_f32le_stereo_48k_is_resampled_and_downmixed():
    x = sine(48_000, 1.0).astype("<f4")
    data = np.stack([x, x], axis=1).tobytes()
    out = np.concatenate(
        list(iter_pcm_blocks(io.BytesIO(data), fmt="f32le", rate_hz=48_000, channels=2))
    )
    assert abs(out.shape[0] - SR) <= 4
    assert abs(dominant_hz(out) - 440.0) < 1.0


def test_short_reads_are_stitched_and_trailing_partial_frame_dropped(caplog):
    x = (sine(SR, 0.5) * 32767).astype("<i2")
    data = np.stack([x, -x], axis=1).tobytes() + b"\x01\x02\x03"  # 3 bytes of a 4-byte frame
    stats = InputStats()
    with caplog.at_level(logging.WARNING, logger="subd.sources.decode"):
        out = np.concatenate(
            list(
                iter_pcm_blocks(TrickleStream(data, 7), channels=2, block_samples=1000, stats=stats)
            )
        )
    assert out.shape == (x.shape[0],)
    np.testing.assert_allclose(out, 0.0, atol=1e-4)  # left and right cancel: frames kept aligned
    assert stats.n_dropped_bytes == 3
    assert any("dropped 3" in r.getMessage() for r in caplog.records)


def test_stdin_nan_floats_are_replaced():
    x = np.full(800, 0.25, dtype="<f4")
    x[::100] = np.nan
    stats = InputStats()
    out = np.concatenate(list(iter_pcm_blocks(io.BytesIO(x.tobytes()), fmt="f32le", stats=stats)))
    assert stats.n_nonfinite == 8 and np.isfinite(out).all() and (out[::100] == 0).all()


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"fmt": "s24le"}, "--format"),
        ({"rate_hz": 0}, "--rate"),
        ({"rate_hz": 10_000_000}, "--rate"),
        ({"rate_hz": 16000.5}, "--rate"),
        ({"channels": 0}, "--channels"),
        ({"channels": 1000}, "--channels"),
        ({"block_samples": -5}, "block"),
    ],
)
def test_bad_pcm_parameters(kwargs, option):
    with pytest.raises(AudioInputError) as exc:
        list(iter_pcm_blocks(io.BytesIO(b"\0" * 64), **kwargs))
    assert option in assert_one_line_error(exc)


def test_pcm_spec_parses_command_line_strings():
    assert PcmSpec.parse("F32LE", "48000", "2") == PcmSpec("f32le", 48_000, 2)
    with pytest.raises(AudioInputError) as exc:
        PcmSpec.parse("s16le", "fast", "1")
    assert "--rate" in assert_one_line_error(exc)


def test_empty_or_text_stdin_is_refused():
    with pytest.raises(AudioInputError) as exc:
        list(iter_pcm_blocks(io.BytesIO(b"")))
    assert "<stdin>" in assert_one_line_error(exc)
    with pytest.raises(AudioInputError) as exc:
        list(iter_pcm_blocks(io.StringIO("hello")))
    assert "binary" in assert_one_line_error(exc)
