"""Audio sources: a file paced at real time (or ``--speed X``, with ``--jitter-ms``), raw PCM on
stdin, and the queue that a microphone (``subd.sources.mic``) and HTTP push
(``subd.sources.push``) feed.

Every source yields contiguous 16 kHz mono float32 :class:`AudioChunk`s and says, at ``start``,
the monotonic time of its sample 0 (``t0_ns``). Files carry no clock of their own (``live`` is
False: the nominal rate is exact); the others are live and their drift is estimated.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import threading
import time
from collections.abc import AsyncIterator
from fractions import Fraction
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from subd.clock import Clock
from subd.errors import AudioInputError
from subd.types import SAMPLE_RATE_HZ, AudioChunk

NS_PER_S = 1_000_000_000
log = logging.getLogger("subd.sources")


def pcm_to_float(raw: bytes, fmt: str) -> np.ndarray:
    if fmt == "s16le":
        return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    if fmt == "f32le":
        out = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        if not np.all(np.isfinite(out)):
            raise AudioInputError("PCM input contains NaN or infinite samples")
        return out
    raise AudioInputError(f"unknown PCM format {fmt!r} (use s16le or f32le)")


class FileSource:
    """A file delivered in ``chunk_ms`` chunks at ``speed``× real time; each chunk arrives up
    to ``jitter_ms`` late (random, order kept). ``speed=None`` delivers as fast as the pipeline
    takes it (held back only by the recogniser)."""

    live = False
    pullable = True

    def __init__(self, audio: np.ndarray, *, speed: Fraction | None = Fraction(1),
                 jitter_ms: int = 0, chunk_ms: int = 20, loops: int = 1, seed: int = 0,
                 name: str = "file") -> None:
        if audio.ndim != 1 or audio.shape[0] == 0:
            raise AudioInputError(f"{name}: no audio")
        self.audio = audio
        self.speed = speed
        self.jitter_ns = int(jitter_ms) * 1_000_000
        self.chunk_samples = max(1, SAMPLE_RATE_HZ * int(chunk_ms) // 1000)
        self.loops = max(1, int(loops))
        self._rng = random.Random(seed)
        self.name = name
        self.t0_ns = 0
        self._clock: Clock | None = None

    @classmethod
    def from_path(cls, path: str | Path, **kwargs: Any) -> FileSource:
        from subd.sources.decode import load_audio  # libsndfile, else ffmpeg: any format

        return cls(load_audio(path), name=str(path), **kwargs)

    @property
    def total_samples(self) -> int:
        return self.audio.shape[0] * self.loops

    async def start(self, clock: Clock) -> int:
        self._clock = clock
        self.t0_ns = clock.now_ns()
        return self.t0_ns

    def release_ns(self, end_sample: int) -> int:
        """Nominal arrival of the chunk ending at ``end_sample`` (before jitter)."""
        assert self.speed is not None
        num = end_sample * NS_PER_S * self.speed.denominator
        return self.t0_ns + num // (SAMPLE_RATE_HZ * self.speed.numerator)

    async def chunks(self) -> AsyncIterator[AudioChunk]:
        assert self._clock is not None, "start() first"
        n = self.audio.shape[0]
        last_ns = 0
        for loop in range(self.loops):
            for a in range(0, n, self.chunk_samples):
                b = min(n, a + self.chunk_samples)
                start = loop * n + a
                if self.speed is not None:
                    jitter = self._rng.randint(0, self.jitter_ns) if self.jitter_ns else 0
                    last_ns = max(last_ns, self.release_ns(start + b - a) + jitter)
                    await self._clock.sleep_until(last_ns, precise=False)
                else:
                    await asyncio.sleep(0)
                yield AudioChunk(start_sample=start, samples=self.audio[a:b])


class _PipeReader:
    """Reads a blocking stream on a daemon thread, a few reads ahead: a read that waits for a
    writer gone quiet never holds up a stop, nor the interpreter's exit (an executor's thread
    would be joined at exit, waiting for a byte that may never come)."""

    _STOP = object()

    def __init__(self, stream: Any, n_bytes: int, name: str, depth: int = 8) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()  # bounded by _room: depth + 1
        self._room = threading.Semaphore(depth)
        self._stream, self._n_bytes, self._name = stream, n_bytes, name
        threading.Thread(target=self._run, name=f"{name}-reader", daemon=True).start()

    def _run(self) -> None:
        while True:
            self._room.acquire()
            try:
                raw = self._stream.read(self._n_bytes)
                while raw is None:  # a non-blocking stream with nothing yet
                    time.sleep(0.005)
                    raw = self._stream.read(self._n_bytes)
            except (OSError, ValueError) as exc:
                raw = AudioInputError(f"{self._name}: read failed: {exc}")
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, raw)
            except RuntimeError:  # the loop is closed: nobody reads any more
                return
            if not isinstance(raw, bytes) or not raw:
                return

    def stop(self) -> None:
        self._queue.put_nowait(self._STOP)

    async def read(self) -> bytes:
        """The next read's bytes; b"" at the end of the stream or once stopped."""
        item = await self._queue.get()
        if item is self._STOP:
            self._queue.put_nowait(item)  # every later read ends too
            return b""
        self._room.release()
        if isinstance(item, AudioInputError):
            raise item
        return item


def piped_bytes_waiting(stream: Any) -> int | None:
    """Bytes written into ``stream``'s pipe or socket and not read yet; None for a file, a
    terminal or a stream without a descriptor (only a pipe's content is live)."""
    import fcntl
    import os
    import stat
    import termios

    try:
        fd = stream.fileno()
        if not (stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode)):
            return None
        return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4), "little")
    except (AttributeError, OSError, ValueError):
        return None


class PcmStreamSource:
    """Live raw PCM from a byte stream such as stdin: s16le or f32le, interleaved, at any rate
    and channel count (16 kHz mono by default), conditioned as ``subd transcribe -`` conditions
    it (:class:`subd.sources.pcm.Conditioner`): mixed to mono, resampled to 16 kHz, and a NaN or
    infinite sample replaced by silence and counted (logged when first seen and at the end),
    not an end of the channel."""

    live = True
    pullable = True

    def __init__(self, stream: BinaryIO | None = None, *, fmt: str = "s16le",
                 rate_hz: int = SAMPLE_RATE_HZ, channels: int = 1, chunk_ms: int = 20,
                 name: str = "stdin") -> None:
        from subd.sources.pcm import Conditioner, PcmSpec

        self.spec = PcmSpec(fmt=fmt, rate_hz=rate_hz, channels=channels)
        stream = stream if stream is not None else sys.stdin.buffer
        # unbuffered: a read returns what has come (a live pipe's short reads), and what waits
        # in the pipe is all that waits (piped_bytes_waiting)
        self.stream = getattr(stream, "raw", stream)
        self._buffered = stream  # kept: collected, it would close the raw stream under us
        self.chunk_bytes = max(1, rate_hz * chunk_ms // 1000) * self.spec.frame_bytes
        self.name = name
        self.conditioner = Conditioner(name, rate_hz, channels,
                                       block_samples=max(1, SAMPLE_RATE_HZ * chunk_ms // 1000))
        self._first: np.ndarray | None = None
        self._carry = b""
        self._ended = False
        self._stopped = False
        self._reader: _PipeReader | None = None

    def _condition(self, raw: bytes) -> np.ndarray:
        from subd.sources.pcm import PCM_FORMATS, push_pcm_bytes

        stats = self.conditioner.stats
        seen = stats.n_nonfinite
        dtype = PCM_FORMATS[self.spec.fmt]
        blocks = list(push_pcm_bytes(self.conditioner, raw, len(raw), dtype, self.spec))
        if stats.n_nonfinite and not seen:
            log.warning("%s: NaN or infinite samples, played as silence (counted; the total "
                        "is logged at the end)", self.name)
        return np.concatenate(blocks) if blocks else np.zeros(0, np.float32)

    def end(self) -> None:
        """The channel stops (drain): the stream ends here, even where its writer has gone
        quiet with the pipe still open (the read that waits for it is left to its thread)."""
        if self._reader is not None:
            self._reader.stop()
        self._stopped = True

    async def _read(self) -> np.ndarray | None:
        """The next conditioned samples (maybe none yet: the resampler holds some back);
        None at the end of the stream, after the conditioner's last samples."""
        if self._ended:
            return None
        if self._reader is None:
            self._reader = _PipeReader(self.stream, self.chunk_bytes, self.name)
            if self._stopped:
                self._reader.stop()
        raw = await self._reader.read()
        if not raw:
            self._ended = True
            if self._carry:
                log.warning("%s: dropped %d trailing bytes (an incomplete frame)", self.name,
                            len(self._carry))
            if self.conditioner.stats.n_input_frames == 0:
                return None
            try:
                rest = list(self.conditioner.finish())  # logs what it replaced or clipped
            except AudioInputError as exc:  # every sample was NaN: said, and the stream ends
                log.warning("%s", exc)
                rest = []
            return np.concatenate(rest) if rest else None
        raw = self._carry + raw
        cut = len(raw) - len(raw) % self.spec.frame_bytes
        self._carry = raw[cut:]
        return self._condition(raw[:cut])

    async def start(self, clock: Clock) -> int:
        # what a live producer wrote into the pipe while the daemon started was captured before
        # now: its last frame just now, its first that long before
        asked_ns, waiting = clock.now_ns(), piped_bytes_waiting(self.stream) or 0
        first = await self._read()
        frames = self.conditioner.stats.n_input_frames
        if first is None or frames == 0:
            raise AudioInputError(f"{self.name}: no PCM data")
        self._first = first
        backlog = waiting // self.spec.frame_bytes
        if backlog:
            if backlog * NS_PER_S // self.spec.rate_hz >= 100_000_000:
                log.info("%s: %.1f s of audio waited in the pipe at the start: its captions "
                         "are due D after it was written", self.name,
                         backlog / self.spec.rate_hz)
            return asked_ns - backlog * NS_PER_S // self.spec.rate_hz
        # else the first read arrived when its last frame was captured
        return clock.now_ns() - frames * NS_PER_S // self.spec.rate_hz

    async def chunks(self) -> AsyncIterator[AudioChunk]:
        pos = 0
        block = self._first
        while block is not None:
            if block.shape[0]:
                yield AudioChunk(start_sample=pos, samples=block)
                pos += block.shape[0]
            block = await self._read()


class QueueSource:
    """Live chunks handed over by another thread or handler (microphone, HTTP push)."""

    live = True
    pullable = False

    def __init__(self, name: str, max_chunks: int = 512) -> None:
        self.name = name
        self._queue: asyncio.Queue[np.ndarray | None] = asyncio.Queue(max_chunks)
        self.next_sample = 0
        self.dropped_chunks = 0
        self.ended = False
        self.last_push_ns: int | None = None  # CLOCK_MONOTONIC of the last chunk (health)
        self._first: np.ndarray | None = None

    def push(self, samples: np.ndarray) -> bool:
        """Queue a chunk (event-loop thread). False if the queue is full (chunk dropped)."""
        if self.ended:
            return False
        self.last_push_ns = time.monotonic_ns()
        try:
            self._queue.put_nowait(samples)
        except asyncio.QueueFull:
            self.dropped_chunks += 1
            return False
        return True

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            try:
                self._queue.put_nowait(None)
            except asyncio.QueueFull:
                pass

    async def start(self, clock: Clock) -> int:
        first = await self._queue.get()
        if first is None:
            raise AudioInputError(f"{self.name}: stream ended before any audio")
        self._first = first
        return clock.now_ns() - first.shape[0] * NS_PER_S // SAMPLE_RATE_HZ

    async def chunks(self) -> AsyncIterator[AudioChunk]:
        block = self._first
        while block is not None:
            yield AudioChunk(start_sample=self.next_sample, samples=block)
            self.next_sample += block.shape[0]
            if self.ended and self._queue.empty():
                return
            block = await self._queue.get()
