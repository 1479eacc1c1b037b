"""Raw PCM input (stdin or any binary stream) and the conditioning shared by every audio source.

Every source ends in the same :class:`Conditioner`: non-finite samples are replaced, channels are
averaged to mono, the rate is converted to 16 kHz with a streaming soxr resampler (quality "HQ"),
samples are clipped to [-1, 1] and the result is cut into blocks of a fixed size. Memory stays
bounded by a few blocks whatever the length of the input.

Non-finite samples (NaN, +inf, -inf) are replaced by 0 and counted; one warning with the total is
logged when the source ends. A source in which *every* sample is non-finite is rejected with an
:class:`~subd.errors.AudioInputError` when it ends (a streaming reader cannot know earlier), so a
corrupt float file never passes for silence. Samples beyond [-1, 1] (float files can hold them) are
clipped, counted and reported the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import soxr

from subd.errors import AudioInputError
from subd.types import SAMPLE_RATE_HZ

log = logging.getLogger("subd.sources.decode")

DEFAULT_BLOCK_SAMPLES = SAMPLE_RATE_HZ * 30
PCM_FORMATS = {"s16le": np.dtype("<i2"), "f32le": np.dtype("<f4")}
MIN_RATE_HZ = 1_000
MAX_RATE_HZ = 384_000
MAX_CHANNELS = 64


@dataclass(slots=True)
class InputStats:
    """Counters filled in while a source is read (pass one in to see what was repaired)."""

    n_input_frames: int = 0  # frames (one sample per channel) read from the source
    n_output_samples: int = 0  # 16 kHz mono samples produced
    n_nonfinite: int = 0  # NaN/inf values replaced by 0
    n_clipped: int = 0  # values outside [-1, 1] clipped
    n_dropped_bytes: int = 0  # trailing bytes of an incomplete raw PCM frame


@dataclass(frozen=True, slots=True)
class PcmSpec:
    """How raw PCM bytes are laid out: sample format, rate and interleaved channel count."""

    fmt: str = "s16le"
    rate_hz: int = SAMPLE_RATE_HZ
    channels: int = 1

    def __post_init__(self) -> None:
        if self.fmt not in PCM_FORMATS:
            allowed = ", ".join(PCM_FORMATS)
            raise AudioInputError(f"bad --format {self.fmt!r}: must be one of {allowed}")
        if not _is_int(self.rate_hz) or not MIN_RATE_HZ <= self.rate_hz <= MAX_RATE_HZ:
            raise AudioInputError(
                f"bad --rate {self.rate_hz!r}: must be an integer from {MIN_RATE_HZ} to "
                f"{MAX_RATE_HZ} Hz"
            )
        if not _is_int(self.channels) or not 1 <= self.channels <= MAX_CHANNELS:
            raise AudioInputError(
                f"bad --channels {self.channels!r}: must be an integer from 1 to {MAX_CHANNELS}"
            )

    @classmethod
    def parse(cls, fmt: str, rate_hz: str | int, channels: str | int) -> PcmSpec:
        """Build a spec from command-line strings; any bad value is a one-line AudioInputError."""
        return cls(
            fmt=str(fmt).strip().lower(),
            rate_hz=_parse_int("--rate", rate_hz),
            channels=_parse_int("--channels", channels),
        )

    @property
    def frame_bytes(self) -> int:
        return PCM_FORMATS[self.fmt].itemsize * self.channels


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _parse_int(option: str, value: str | int) -> int:
    if _is_int(value):
        return int(value)
    try:
        return int(str(value).strip())
    except ValueError:
        raise AudioInputError(f"bad {option} {value!r}: must be an integer") from None


def check_block_samples(block_samples: int) -> int:
    if not _is_int(block_samples) or block_samples < 1:
        raise AudioInputError(f"bad block size {block_samples!r}: must be a positive integer")
    return int(block_samples)


def max_output_samples(max_seconds: float | None) -> int | None:
    if max_seconds is None:
        return None
    if isinstance(max_seconds, bool) or not isinstance(max_seconds, int | float):
        raise AudioInputError(f"bad maximum duration {max_seconds!r}: must be a number of seconds")
    if not np.isfinite(max_seconds) or max_seconds <= 0:
        raise AudioInputError(f"bad maximum duration {max_seconds!r}: must be > 0 seconds")
    return max(1, round(max_seconds * SAMPLE_RATE_HZ))


def one_line(text: str) -> str:
    """Collapse a library or subprocess message to one line."""
    return " ".join(str(text).split())


class ToMono16k:
    """Interleaved float32 frames at ``rate_hz`` with ``channels`` -> 16 kHz mono, chunk by
    chunk: the channels averaged, one streaming soxr resampler (quality "HQ") whose filter
    state runs on across chunks. Shared by every raw-PCM input (stdin, files, the microphone,
    HTTP push)."""

    def __init__(self, rate_hz: int, channels: int) -> None:
        self.rate_hz, self.channels = rate_hz, channels
        self._resampler = (
            None
            if rate_hz == SAMPLE_RATE_HZ
            else soxr.ResampleStream(rate_hz, SAMPLE_RATE_HZ, 1, dtype="float32", quality="HQ")
        )

    def __call__(self, frames: np.ndarray, last: bool = False) -> np.ndarray:
        frames = frames.reshape(-1, self.channels)
        mono = frames[:, 0] if self.channels == 1 else frames.mean(axis=1, dtype=np.float32)
        if self._resampler is None:
            return mono
        return self._resampler.resample_chunk(np.ascontiguousarray(mono), last=last)


class Conditioner:
    """Turns frames of any rate/channel count into fixed-size 16 kHz mono float32 blocks.

    Feed it with :meth:`push` (float32 [n_frames, n_channels]) and end with :meth:`finish`; both
    yield the blocks that are complete. All blocks have ``block_samples`` samples except the last.
    """

    def __init__(
        self,
        name: str,
        rate_hz: int,
        channels: int,
        *,
        block_samples: int = DEFAULT_BLOCK_SAMPLES,
        max_samples: int | None = None,
        stats: InputStats | None = None,
    ) -> None:
        self.name = name
        self.channels = channels
        self.block_samples = check_block_samples(block_samples)
        self.max_samples = max_samples
        self.stats = stats if stats is not None else InputStats()
        self._to_mono = ToMono16k(rate_hz, channels)
        self._buf = np.empty(self.block_samples, dtype=np.float32)
        self._fill = 0
        self._n_values = 0  # input values (frames x channels), for the all-non-finite check

    @property
    def done(self) -> bool:
        """True once ``max_samples`` have been produced: the reader can stop."""
        return self.max_samples is not None and self.stats.n_output_samples >= self.max_samples

    def push(self, frames: np.ndarray) -> Iterator[np.ndarray]:
        if frames.shape[0] == 0 or self.done:
            return
        frames = np.asarray(frames, dtype=np.float32).reshape(frames.shape[0], self.channels)
        self.stats.n_input_frames += frames.shape[0]
        self._n_values += frames.size
        # The checks below allocate nothing on the common path (finite, within full scale).
        with np.errstate(invalid="ignore", over="ignore"):  # inf + -inf is the case we look for
            total = frames.sum(dtype=np.float64)
        if not np.isfinite(total):
            finite = np.isfinite(frames)
            frames = np.where(finite, frames, np.float32(0.0))
            self.stats.n_nonfinite += int(frames.size - np.count_nonzero(finite))
        if frames.max() > 1.0 or frames.min() < -1.0:
            self.stats.n_clipped += int(np.count_nonzero((frames > 1.0) | (frames < -1.0)))
            frames = np.clip(frames, -1.0, 1.0)
        yield from self._emit(self._to_mono(frames))

    def finish(self) -> Iterator[np.ndarray]:
        if self._to_mono.rate_hz != SAMPLE_RATE_HZ and not self.done:
            yield from self._emit(self._to_mono(np.zeros(0, np.float32), last=True))
        if self._fill:
            block = self._buf[: self._fill].copy()
            self._fill = 0
            yield block
        self._report()

    def _emit(self, mono: np.ndarray) -> Iterator[np.ndarray]:
        if self.max_samples is not None:
            mono = mono[: max(0, self.max_samples - self.stats.n_output_samples)]
        # Resampling can overshoot full scale by a little: keep the [-1, 1] promise.
        if mono.shape[0] and (mono.max() > 1.0 or mono.min() < -1.0):
            mono = np.clip(mono, -1.0, 1.0)
        self.stats.n_output_samples += mono.shape[0]
        pos = 0
        while pos < mono.shape[0]:
            take = min(self.block_samples - self._fill, mono.shape[0] - pos)
            self._buf[self._fill : self._fill + take] = mono[pos : pos + take]
            self._fill += take
            pos += take
            if self._fill == self.block_samples:
                self._fill = 0
                yield self._buf.copy()

    def _report(self) -> None:
        s = self.stats
        if self._n_values == 0:
            raise AudioInputError(f"{self.name}: contains no audio samples")
        if s.n_nonfinite == self._n_values:
            raise AudioInputError(
                f"{self.name}: all {s.n_nonfinite} samples are NaN or infinite "
                "(corrupt float audio)"
            )
        if s.n_nonfinite:
            log.warning("%s: replaced %d NaN/infinite samples with 0", self.name, s.n_nonfinite)
        if s.n_clipped:
            log.warning("%s: clipped %d samples outside [-1, 1]", self.name, s.n_clipped)


def _read_some(stream: BinaryIO, n_bytes: int, name: str) -> bytes | None:
    """One read; b"" at end of stream, None when a non-blocking stream has nothing yet."""
    try:
        data = stream.read(n_bytes)
    except OSError as exc:
        raise AudioInputError(f"{name}: read failed: {one_line(exc)}") from None
    if isinstance(data, str):
        raise AudioInputError(f"{name}: is a text stream; raw PCM needs a binary stream")
    return data


def iter_pcm_blocks(
    stream: BinaryIO,
    *,
    fmt: str = "s16le",
    rate_hz: int = SAMPLE_RATE_HZ,
    channels: int = 1,
    block_samples: int = DEFAULT_BLOCK_SAMPLES,
    max_seconds: float | None = None,
    name: str = "<stdin>",
    stats: InputStats | None = None,
) -> Iterator[np.ndarray]:
    """Read interleaved raw PCM from ``stream`` and yield 16 kHz mono float32 blocks.

    Short reads (pipes, sockets) are stitched together, so a frame split across reads is kept.
    An incomplete frame at the very end is dropped, counted in ``stats.n_dropped_bytes`` and
    reported in one warning. Use ``sys.stdin.buffer`` for standard input.
    """
    spec = PcmSpec(fmt=fmt, rate_hz=rate_hz, channels=channels)
    dtype = PCM_FORMATS[spec.fmt]
    cond = Conditioner(
        name,
        spec.rate_hz,
        spec.channels,
        block_samples=block_samples,
        max_samples=max_output_samples(max_seconds),
        stats=stats,
    )
    # Read about one output block's worth of input at a time.
    want_frames = max(1, -(-cond.block_samples * spec.rate_hz // SAMPLE_RATE_HZ))
    want_bytes = want_frames * spec.frame_bytes
    pending = bytearray()
    while not cond.done:
        data = _read_some(stream, want_bytes - len(pending), name)
        if data is None:
            time.sleep(0.005)  # non-blocking stream with nothing to read yet
            continue
        if not data:
            break
        pending += data
        if len(pending) < want_bytes:
            continue  # short read: keep collecting until a full read or end of stream
        yield from push_pcm_bytes(cond, pending, want_bytes, dtype, spec)
        pending.clear()
    if not cond.done:
        n_whole = len(pending) // spec.frame_bytes * spec.frame_bytes
        if n_whole:
            yield from push_pcm_bytes(cond, pending, n_whole, dtype, spec)
        n_left = len(pending) - n_whole
        if n_left:
            cond.stats.n_dropped_bytes += n_left
            log.warning(
                "%s: dropped %d trailing bytes (an incomplete %s frame of %d channel(s))",
                name,
                n_left,
                spec.fmt,
                spec.channels,
            )
    yield from cond.finish()


def push_pcm_bytes(
    cond: Conditioner, pending: bytes | bytearray, n_bytes: int, dtype: np.dtype, spec: PcmSpec
) -> Iterator[np.ndarray]:
    """The first ``n_bytes`` of ``pending`` (whole frames of ``spec``) through ``cond``."""
    values = np.frombuffer(bytes(pending[:n_bytes]), dtype=dtype)
    if spec.fmt == "s16le":
        samples = values.astype(np.float32) / np.float32(32768.0)
    else:
        samples = values.astype(np.float32)
    yield from cond.push(samples.reshape(-1, spec.channels))
