"""Live SRT (through pysrt) and WebVTT files: every committed cue is durable once written.

Committed words are laid out into pop-on cues (:class:`subd.layout.cues.CueLayout`); tentative text
never reaches a file. Each time cues are committed the whole current file is rewritten to a
temporary file in the same directory, flushed, fsync'ed and renamed over the target (then the
directory is fsync'ed), so a crash at any moment leaves either the previous or the new complete
file: always valid, holding every cue committed before the last successful write.

Writes run on a worker thread (``publish`` only queues). A failed write (disk full, read-only
file system) is logged and counted; the cues stay in memory and the write is retried, and the
daemon keeps running. Files rotate by size or by audio time: the finished file is renamed to
``<stem>.<NNNN><ext>``. All paths are confined to the configured directory.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pysrt

from subd.errors import ConfigError
from subd.layout.cues import CueLayout, LayoutConfig
from subd.tasks import cancel_and_wait
from subd.types import CaptionState, Cue
from subd.validate import check_range, from_mapping

log = logging.getLogger(__name__)
NS_PER_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class FileSinkConfig:
    directory: str = "captions"  # every export path is confined to this directory
    filename: str = ""  # relative to directory; "" = live.srt / live.vtt
    rotate_bytes: int = 0  # start a new file beyond this size; 0 = never
    rotate_s: int = 0  # start a new file every this many seconds of audio; 0 = never
    fsync: bool = True
    retry_ms: int = 1000  # after a failed write
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    section: str = "sinks.files"

    def __post_init__(self) -> None:
        s = self.section
        check_range(s, "rotate_bytes", self.rotate_bytes, 0, 1 << 40)
        check_range(s, "rotate_s", self.rotate_s, 0, 10 * 365 * 86400)
        check_range(s, "retry_ms", self.retry_ms, 10, 600_000)
        if not self.directory:
            raise ConfigError(f"[{s}] directory = '': must name the export directory")
        name = Path(self.filename)
        if self.filename and (name.is_absolute() or ".." in name.parts or not name.name):
            raise ConfigError(
                f"[{s}] filename = {self.filename!r}: must be a relative path inside "
                f"directory, without '..'"
            )


def confined_path(directory: str | os.PathLike[str], filename: str, section: str) -> Path:
    """``directory/filename`` resolved, refusing any escape (``..``, symlinks out)."""
    root = Path(directory).resolve()
    target = (root / filename).resolve()
    if target == root or not target.is_relative_to(root):
        raise ConfigError(
            f"[{section}] filename = {filename!r}: resolves outside directory {str(root)!r}"
        )
    return target


def _atomic_write(path: Path, data: bytes, fsync: bool) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if fsync:
        _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class _Segment:
    """The cues of one output file (before rotation)."""

    __slots__ = ("blocks", "n_bytes", "start_ns", "closed", "n_durable", "rotated")

    def __init__(self, start_ns: int | None) -> None:
        self.blocks: list[bytes] = []
        self.n_bytes = 0
        self.start_ns = start_ns
        self.closed = False
        self.n_durable = 0
        self.rotated = False


class CueFileSink:
    """Shared machinery; subclasses define the format (header and cue block)."""

    name: ClassVar[str] = "files"
    extension: ClassVar[str] = ""
    header: ClassVar[bytes] = b""

    def __init__(self, config: FileSinkConfig | None = None) -> None:
        self.config = config or FileSinkConfig()
        filename = self.config.filename or f"live{self.extension}"
        self.path = confined_path(self.config.directory, filename, self.config.section)
        self._layout = CueLayout(self.config.layout)
        self._segments: list[_Segment] = [_Segment(None)]
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._next_rotation = 1
        self.n_committed = 0  # cues handed to the writer
        self.n_durable = 0  # cues fsync'ed in place
        self.n_write_errors = 0
        self.on_durable: Callable[[int], None] | None = None  # for drivers/tests

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> CueFileSink:
        section = f"sinks.{cls.name}"
        return cls(from_mapping(FileSinkConfig, section, data, section=section))

    def format_cue(self, n: int, cue: Cue) -> bytes:
        raise NotImplementedError

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"subd-{self.name}")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._adopt_existing)
        self._task = asyncio.create_task(self._writer(), name=f"{self.name}-writer")

    def publish(self, state: CaptionState) -> None:
        self._commit(self._layout.push(state.committed, state.audio_end_ns, state.tentative))

    async def close(self) -> None:
        self._commit(self._layout.finish())
        await cancel_and_wait(self._task)
        if self._executor is not None:
            loop = asyncio.get_running_loop()
            for _ in range(3):  # last chance for cues still in memory
                try:
                    await loop.run_in_executor(self._executor, self._write_pending)
                    break
                except OSError as exc:
                    self._failed(exc)
            self._executor.shutdown(wait=True)
        lost = sum(len(s.blocks) - s.n_durable for s in self._segments)
        if lost:
            log.error("%s: %d committed cues could not be written to %s", self.name, lost,
                      self.path)

    # -- committing (event loop) ---------------------------------------------------------

    def _commit(self, cues: list[Cue]) -> None:
        if not cues:
            return
        cfg = self.config
        for cue in cues:
            seg = self._segments[-1]
            if seg.start_ns is None:
                seg.start_ns = cue.start_ns
            block = self.format_cue(len(seg.blocks) + 1, cue)
            too_big = cfg.rotate_bytes and seg.n_bytes + len(block) > cfg.rotate_bytes
            too_old = cfg.rotate_s and cue.start_ns - seg.start_ns >= cfg.rotate_s * 10**9
            if seg.blocks and (too_big or too_old):
                seg.closed = True
                seg = _Segment(cue.start_ns)
                self._segments.append(seg)
                block = self.format_cue(1, cue)
            seg.blocks.append(block)
            seg.n_bytes += len(block)
            self.n_committed += 1
        self._wake.set()

    # -- writing (worker thread) ---------------------------------------------------------

    async def _writer(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await loop.run_in_executor(self._executor, self._write_pending)
            except OSError as exc:
                self._failed(exc)
                await asyncio.sleep(self.config.retry_ms / 1000)
                self._wake.set()

    def _failed(self, exc: OSError) -> None:
        self.n_write_errors += 1
        if self.n_write_errors == 1 or self.n_write_errors % 100 == 0:
            kind = "disk full" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
            log.error("%s: cannot write %s (%s); %d failures so far, will retry", self.name,
                      self.path, kind, self.n_write_errors)

    def _write_pending(self) -> None:
        for seg in list(self._segments):
            n = len(seg.blocks)
            if n > seg.n_durable:
                data = self.header + b"".join(seg.blocks[:n])
                _atomic_write(self.path, data, self.config.fsync)
                self.n_durable += n - seg.n_durable
                seg.n_durable = n
                if self.on_durable is not None:
                    self.on_durable(self.n_durable)
            if seg.closed and not seg.rotated and seg.n_durable == len(seg.blocks):
                self._rotate()
                seg.rotated = True
        self._segments = [s for s in self._segments if not s.rotated] or [_Segment(None)]

    def _rotated_name(self, n: int) -> Path:
        return self.path.with_name(f"{self.path.stem}.{n:04d}{self.path.suffix}")

    def _rotate(self) -> None:
        while self._rotated_name(self._next_rotation).exists():
            self._next_rotation += 1
        os.replace(self.path, self._rotated_name(self._next_rotation))
        self._next_rotation += 1
        if self.config.fsync:
            _fsync_dir(self.path.parent)

    def _adopt_existing(self) -> None:
        """A file left by an earlier run is kept: rotated away before the first write."""
        pattern = re.compile(rf"^{re.escape(self.path.stem)}\.(\d+){re.escape(self.path.suffix)}$")
        numbers = [int(m.group(1)) for p in self.path.parent.iterdir()
                   if (m := pattern.match(p.name))]
        self._next_rotation = max(numbers, default=0) + 1
        if self.path.is_symlink():
            raise ConfigError(f"[{self.config.section}] {self.path} is a symlink: refusing")
        if self.path.exists() and self.path.stat().st_size > 0:
            self._rotate()


def _ms(t_ns: int) -> int:
    return max(0, t_ns) // NS_PER_MS


class SRTSink(CueFileSink):
    name = "srt"
    extension = ".srt"

    def format_cue(self, n: int, cue: Cue) -> bytes:
        start_ms = _ms(cue.start_ns)
        end_ms = max(_ms(cue.end_ns), start_ms + 1)
        text = "\n".join(line.replace("-->", "->") for line in cue.lines)
        item = pysrt.SubRipItem(
            n,
            start=pysrt.SubRipTime.from_ordinal(start_ms),
            end=pysrt.SubRipTime.from_ordinal(end_ms),
            text=text,
        )
        return (str(item) + "\n").encode()


def vtt_time(t_ms: int) -> str:
    h, rem = divmod(t_ms, 3_600_000)
    m, rem = divmod(rem, 60_000)
    s, ms = divmod(rem, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}.{ms:03d}"


class VTTSink(CueFileSink):
    name = "vtt"
    extension = ".vtt"
    header = b"WEBVTT\n\n"

    def format_cue(self, n: int, cue: Cue) -> bytes:
        start_ms = _ms(cue.start_ns)
        end_ms = max(_ms(cue.end_ns), start_ms + 1)
        esc = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
        text = "\n".join(line.translate(esc) for line in cue.lines)
        return f"{n}\n{vtt_time(start_ms)} --> {vtt_time(end_ms)}\n{text}\n\n".encode()
