"""Audio files in, 16 kHz mono float32 out.

WAV/FLAC/OGG/AIFF/... are read with libsndfile (soundfile) at any rate, channel count and sample
format (8/16/24/32-bit integer, float, double), averaged to mono and resampled with a streaming
soxr resampler (quality "HQ"). Other formats (MP3, M4A/AAC, Opus in WebM, video files, ...) are
decoded by an ``ffmpeg`` subprocess when one is on PATH (MP3 falls back to libsndfile without it).
Files are read block by block, so memory stays bounded whatever their length.

Non-finite samples are replaced by 0 and counted (one warning with the total); a file in which
every sample is non-finite is rejected; samples are clipped to [-1, 1] (see
:mod:`subd.sources.pcm`).

Every failure raises :class:`~subd.errors.AudioInputError` with a one-line message that names the
file and says what is wrong; no soundfile or ffmpeg traceback reaches the user.
"""

from __future__ import annotations

import importlib.resources
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from subd.errors import AudioInputError
from subd.sources.pcm import (
    DEFAULT_BLOCK_SAMPLES,
    Conditioner,
    InputStats,
    PcmSpec,
    check_block_samples,
    iter_pcm_blocks,
    max_output_samples,
    one_line,
)
from subd.types import SAMPLE_RATE_HZ

__all__ = [
    "DEFAULT_BLOCK_SAMPLES",
    "InputStats",
    "PcmSpec",
    "find_ffmpeg",
    "iter_audio_blocks",
    "iter_pcm_blocks",
    "load_audio",
    "total_duration_s",
]

# Leading bytes of the containers libsndfile reads itself; a file that starts with one of these
# and still fails to open is damaged, and ffmpeg would not do better.
_SNDFILE_MAGIC = {
    b"RIFF": "WAV",
    b"RIFX": "WAV",
    b"RF64": "WAV (RF64)",
    b"BW64": "WAV (BW64)",
    b"riff": "W64",
    b"FORM": "AIFF",
    b"fLaC": "FLAC",
    b"OggS": "OGG",
    b"caff": "CAF",
    b".snd": "AU",
}
_SNDFILE_EXTENSIONS = {
    ".wav": "WAV",
    ".wave": "WAV",
    ".rf64": "WAV (RF64)",
    ".w64": "W64",
    ".flac": "FLAC",
    ".ogg": "OGG",
    ".oga": "OGG",
    ".opus": "OGG",
    ".aif": "AIFF",
    ".aiff": "AIFF",
    ".aifc": "AIFF",
    ".caf": "CAF",
    ".au": "AU",
}
# libsndfile decodes these, but ffmpeg handles them better (gapless trimming, odd headers).
_PREFER_FFMPEG = {"MP3"}
_HEAD_BYTES = 512


@dataclass(frozen=True, slots=True)
class _Plan:
    """How one file will be decoded, decided once by :func:`_plan`."""

    path: Path
    backend: str  # "sndfile" or "ffmpeg"
    rate_hz: int = SAMPLE_RATE_HZ
    channels: int = 1
    n_frames: int | None = None  # frames in the file, where the container says
    ffmpeg: str | None = None


DEMO_CLIP = ("data", "demo.wav")  # the bundled clip, in the subd package


def demo_clip_path() -> Path:
    ref = importlib.resources.files("subd").joinpath(*DEMO_CLIP)
    if not ref.is_file():
        raise AudioInputError("the bundled demo clip subd/data/demo.wav is missing")
    return Path(str(ref))


def find_ffmpeg() -> str | None:
    """Path of the ffmpeg executable, or None when it is not installed."""
    return shutil.which("ffmpeg")


def load_audio(
    path: str | os.PathLike[str],
    *,
    max_seconds: float | None = None,
    stats: InputStats | None = None,
) -> np.ndarray:
    """Decode a whole file to float32 [n_samples] mono at 16 kHz, clipped to [-1, 1].

    ``max_seconds`` keeps only the first that many seconds (the rest is not decoded).
    """
    blocks = list(iter_audio_blocks(path, max_seconds=max_seconds, stats=stats))
    return np.concatenate(blocks) if blocks else np.zeros(0, np.float32)


def iter_audio_blocks(
    source: str | os.PathLike[str],
    *,
    block_samples: int = DEFAULT_BLOCK_SAMPLES,
    max_seconds: float | None = None,
    stats: InputStats | None = None,
) -> Iterator[np.ndarray]:
    """Yield float32 16 kHz mono blocks of ``block_samples`` samples (the last one shorter).

    The file is checked when this is called (missing, empty, not audio, unsupported: one-line
    AudioInputError); decoding errors found later are raised from the iteration.
    """
    block_samples = check_block_samples(block_samples)
    max_samples = max_output_samples(max_seconds)
    plan = _plan(source)
    cond = Conditioner(
        str(plan.path),
        plan.rate_hz,
        plan.channels,
        block_samples=block_samples,
        max_samples=max_samples,
        stats=stats,
    )
    if plan.backend == "ffmpeg":
        return _iter_ffmpeg(plan, cond)
    return _iter_sndfile(plan, cond)


def total_duration_s(source: str | os.PathLike[str]) -> float | None:
    """Duration in seconds where the container (or ffprobe) says; None when it cannot be known."""
    plan = _plan(source)
    if plan.n_frames is not None:
        return plan.n_frames / plan.rate_hz
    ffprobe = shutil.which("ffprobe")
    if ffprobe is None:
        return None
    cmd = [ffprobe, "-v", "error", "-show_entries", "format=duration"]
    cmd += ["-of", "default=noprint_wrappers=1:nokey=1", _ffmpeg_url(plan.path)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        value = float(out.stdout.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return value if np.isfinite(value) and value >= 0 else None


def _plan(source: str | os.PathLike[str]) -> _Plan:
    path = _check_path(source)
    ffmpeg = find_ffmpeg()
    try:
        with sf.SoundFile(path) as f:
            info = (f.format, f.samplerate, f.channels, f.frames)
    except sf.LibsndfileError as exc:
        return _plan_unreadable(path, _sndfile_reason(exc), ffmpeg)
    except (OSError, RuntimeError, ValueError, TypeError) as exc:
        raise AudioInputError(f"{path}: cannot open audio: {one_line(exc)}") from None
    fmt, rate_hz, channels, n_frames = info
    if fmt in _PREFER_FFMPEG and ffmpeg is not None:
        return _Plan(path, "ffmpeg", n_frames=None, ffmpeg=ffmpeg)
    if rate_hz < 1 or channels < 1:
        raise AudioInputError(f"{path}: bad header ({rate_hz} Hz, {channels} channels)")
    if n_frames == 0:
        raise AudioInputError(f"{path}: contains no audio samples (header only)")
    return _Plan(path, "sndfile", rate_hz, channels, n_frames)


def _check_path(source: str | os.PathLike[str]) -> Path:
    if isinstance(source, bytes | bytearray) or not isinstance(source, str | os.PathLike):
        raise AudioInputError(f"not an audio file path: {source!r}")
    path = Path(source)
    if str(source) == "":
        raise AudioInputError("empty audio file name")
    try:
        st = path.stat()
    except FileNotFoundError:
        raise AudioInputError(f"{path}: no such file") from None
    except OSError as exc:
        raise AudioInputError(f"{path}: cannot access: {one_line(exc.strerror or exc)}") from None
    if path.is_dir():
        raise AudioInputError(f"{path}: is a directory, not an audio file")
    if st.st_size == 0 and path.is_file():
        raise AudioInputError(f"{path}: file is empty (0 bytes)")
    if not os.access(path, os.R_OK):
        raise AudioInputError(f"{path}: permission denied")
    return path


def _read_head(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(_HEAD_BYTES)
    except OSError as exc:
        raise AudioInputError(f"{path}: cannot read: {one_line(exc.strerror or exc)}") from None


def _looks_like_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # not just a character cut at the end of the sample
            return False
        text = head[: exc.start].decode("utf-8")
    return bool(text) and all(c.isprintable() or c in "\t\r\n\f" for c in text)


def _sndfile_reason(exc: Exception) -> str:
    msg = one_line(exc)
    # "Error opening '/x.wav': Error in WAV file. No 'data' chunk marker." -> the part after ':'
    if msg.startswith("Error opening") and "': " in msg:
        msg = msg.split("': ", 1)[1]
    return msg.rstrip(".")


def _plan_unreadable(path: Path, reason: str, ffmpeg: str | None) -> _Plan:
    """libsndfile could not open ``path``: say why, or hand it to ffmpeg."""
    head = _read_head(path)
    container = _SNDFILE_MAGIC.get(head[:4])
    if container is not None:
        raise AudioInputError(f"{path}: damaged or truncated {container} file ({reason})")
    if _looks_like_text(head):
        raise AudioInputError(f"{path}: not an audio file (it contains text)")
    expected = _SNDFILE_EXTENSIONS.get(path.suffix.lower())
    if ffmpeg is None:
        if expected is not None:
            raise AudioInputError(
                f"{path}: not a valid {expected} file (unrecognised header: {reason})"
            )
        raise AudioInputError(
            f"{path}: format not supported without ffmpeg "
            f"(install ffmpeg to read {path.suffix or 'such'} files)"
        )
    return _Plan(path, "ffmpeg", ffmpeg=ffmpeg)


def _iter_sndfile(plan: _Plan, cond: Conditioner) -> Iterator[np.ndarray]:
    # Read about one output block's worth of input frames per call.
    n_read = max(1, -(-cond.block_samples * plan.rate_hz // SAMPLE_RATE_HZ))
    try:
        f = sf.SoundFile(plan.path)
    except (sf.LibsndfileError, OSError, RuntimeError) as exc:
        raise AudioInputError(f"{plan.path}: cannot open audio: {one_line(exc)}") from None
    with f:
        while not cond.done:
            try:
                frames = f.read(n_read, dtype="float32", always_2d=True)
            except (sf.LibsndfileError, OSError, RuntimeError, ValueError) as exc:
                raise AudioInputError(
                    f"{plan.path}: decoding failed after {cond.stats.n_input_frames} frames: "
                    f"{one_line(exc)}"
                ) from None
            if frames.shape[0] == 0:
                break
            yield from cond.push(frames)
    yield from cond.finish()


def _ffmpeg_url(path: Path) -> str:
    # "file:" keeps ffmpeg from reading names such as "pipe:x" or "http://..." as protocols.
    return "file:" + str(path.resolve())


def _iter_ffmpeg(plan: _Plan, cond: Conditioner) -> Iterator[np.ndarray]:
    assert plan.ffmpeg is not None
    cmd = [plan.ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error"]
    cmd += ["-i", _ffmpeg_url(plan.path), "-vn", "-map", "0:a:0"]
    cmd += ["-f", "f32le", "-ac", "1", "-ar", str(SAMPLE_RATE_HZ), "-"]
    n_read = cond.block_samples * 4
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err
            )
        except OSError as exc:
            raise AudioInputError(f"{plan.path}: cannot run ffmpeg: {one_line(exc)}") from None
        stopped_early = True
        with proc:
            assert proc.stdout is not None
            try:
                tail = b""
                while not cond.done:
                    data = proc.stdout.read(n_read)
                    if not data:
                        break
                    data = tail + data
                    n_whole = len(data) // 4 * 4
                    tail = data[n_whole:]
                    samples = np.frombuffer(data[:n_whole], dtype="<f4")
                    yield from cond.push(samples.reshape(-1, 1))
                stopped_early = cond.done
            finally:
                if stopped_early:  # consumer stopped, max_seconds reached, or an error
                    proc.kill()
                proc.stdout.close()
                rc = proc.wait()
        if not stopped_early and rc != 0:
            err.seek(0)
            lines = [ln for ln in err.read().decode("utf-8", "replace").splitlines() if ln.strip()]
            why = one_line(lines[-1]) if lines else f"exit status {rc}"
            why = why.removeprefix(_ffmpeg_url(plan.path) + ": ")
            raise AudioInputError(f"{plan.path}: ffmpeg cannot decode it: {why}")
    yield from cond.finish()
