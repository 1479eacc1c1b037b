"""Live SRT (through pysrt) and WebVTT files: every committed cue is durable once written, at a
cost per cue that does not grow with the file.

The cues come laid out in each tick's state (the pipeline lays them out once, for every
sink); only closed, committed cues are written, and tentative text never reaches a file. Each
committed cue is appended as one block with one ``write`` to a file opened ``O_APPEND``, then
``fdatasync``'ed: a cue costs the same at cue 10 and at cue 100 000 (``subd bench livefile``),
and only cues not yet durable are held in memory. A crash can at worst leave the last block
half-written (power loss, a disk filling mid-write); such a torn tail is cut off when the file
is next opened, so the file read back holds every cue committed before the last successful
write, and nothing else. A failed write is cut back to the last whole cue at once.

Writes run on a worker thread (``publish`` only queues). A failed write (disk full, read-only
file system, a folder that cannot be made) is logged and counted; the cues wait in memory (up
to ``max_pending`` of them, beyond that the oldest are dropped and counted as lost) and the
write is retried, and the daemon keeps running. Files rotate by size and by audio time (both on
by default: 64 MiB, one day): the finished file is renamed to ``<stem>.<NNNN><ext>``. A file
left by an earlier run is repaired and rotated away the same way. All paths are confined to the
configured directory.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import pysrt

from subd.errors import ConfigError
from subd.sinks import worth_logging
from subd.tasks import cancel_and_wait, start_task
from subd.types import CaptionState, Cue
from subd.validate import check_range, from_mapping

log = logging.getLogger(__name__)
NS_PER_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class FileSinkConfig:
    directory: str = "captions"  # every export path is confined to this directory
    filename: str = ""  # relative to directory; "" = live.srt / live.vtt
    rotate_bytes: int = 64 << 20  # start a new file beyond this size; 0 = never
    rotate_s: int = 86_400  # start a new file every this many seconds of audio; 0 = never
    fsync: bool = True
    retry_ms: int = 1000  # after a failed write
    max_pending: int = 100_000  # cues held while writes fail (disk full); beyond: dropped
    section: str = "sinks.files"

    def __post_init__(self) -> None:
        s = self.section
        check_range(s, "rotate_bytes", self.rotate_bytes, 0, 1 << 40)
        check_range(s, "rotate_s", self.rotate_s, 0, 10 * 365 * 86400)
        check_range(s, "retry_ms", self.retry_ms, 10, 600_000)
        check_range(s, "max_pending", self.max_pending, 1, 10_000_000)
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


def _write_block(fd: int, data: bytes) -> int:
    """One ``write`` of one cue block (the seam tests use to fill the disk)."""
    return os.write(fd, data)


def _fsync_dir(directory: Path) -> None:
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def whole_cues_end(data: bytes, header: bytes) -> int:
    """Length of the longest prefix of ``data`` made of the header and whole cue blocks.

    A block ends with a blank line and holds none inside (cue text lines are never empty), so
    whatever follows the last blank line is a torn block. A file that does not start with the
    header (torn inside it) keeps nothing."""
    if not data.startswith(header):
        return 0
    end = data.rfind(b"\n\n", len(header) - 2 if header else 0)
    return max(end + 2, len(header)) if end >= 0 else len(header)


def repair_tail(path: Path, header: bytes = b"") -> int:
    """Cut a torn last block off ``path`` (see :func:`whole_cues_end`); returns the bytes cut."""
    data = path.read_bytes()
    keep = whole_cues_end(data, header) if data else 0
    if keep < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
    return len(data) - keep


class CueFileSink:
    """Shared machinery; subclasses define the format (header and cue block)."""

    name: ClassVar[str] = "files"
    extension: ClassVar[str] = ""
    header: ClassVar[bytes] = b""

    def __init__(self, config: FileSinkConfig | None = None) -> None:
        self.config = config or FileSinkConfig()
        filename = self.config.filename or f"live{self.extension}"
        self.path = confined_path(self.config.directory, filename, self.config.section)
        self._open: Cue | None = None  # the latest tick's open cue (committed words)
        # committed cues not durable yet: appended here, taken by the writer thread
        self._pending: collections.deque[Cue] = collections.deque()
        self._lock = threading.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._next_rotation = 1
        self._prepared = False  # folder made, an earlier run's file adopted (writer thread)
        # the current file (writer thread only)
        self._fd: int | None = None
        self._file_bytes = 0  # its length up to the last whole cue
        self._file_n = 0  # cues in it
        self._file_start_ns: int | None = None  # audio time of its first cue
        self.n_committed = 0  # cues handed to the writer
        self.n_durable = 0  # cues fsync'ed in place
        self.n_write_errors = 0
        self.n_lost = 0  # cues dropped while writes kept failing (beyond max_pending)
        self.n_repaired_bytes = 0  # torn tail cut off a file found at start
        self.on_durable: Callable[[int], None] | None = None  # for drivers/tests

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> CueFileSink:
        section = f"sinks.{cls.name}"
        return cls(from_mapping(FileSinkConfig, section, data, section=section))

    def format_cue(self, n: int, cue: Cue) -> bytes:
        raise NotImplementedError

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"subd-{self.name}")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._prepare)
        except OSError as exc:  # the folder cannot be made yet: the channel runs on, the
            self._failed(exc)   # cues wait and the writer tries again
        self._task = start_task(self._writer(), f"{self.name}-writer")

    def publish(self, state: CaptionState) -> None:
        self._commit([c for c in state.cues if c.committed])
        self._open = next((c for c in state.cues if not c.committed), None)

    async def close(self) -> None:
        if self._open is not None:  # the stream was cut short: its committed words stay
            self._commit([replace(self._open, committed=True)])
            self._open = None
        await cancel_and_wait(self._task)
        if self._executor is not None:
            loop = asyncio.get_running_loop()
            for _ in range(3):  # last chance for cues still in memory
                try:
                    await loop.run_in_executor(self._executor, self._write_pending)
                    break
                except OSError as exc:
                    self._failed(exc)
            await loop.run_in_executor(self._executor, self._close_file)
            self._executor.shutdown(wait=True)
        lost = len(self._pending) + self.n_lost
        if lost:
            log.error("%s: %d committed cues could not be written to %s", self.name, lost,
                      self.path)

    # -- committing (event loop) ---------------------------------------------------------

    def _commit(self, cues: list[Cue]) -> None:
        if not cues:
            return
        with self._lock:
            for cue in cues:
                if len(self._pending) >= self.config.max_pending:
                    self._pending.popleft()  # writes have failed for this long: memory bound
                    self.n_lost += 1
                self._pending.append(cue)
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
        if worth_logging(self.n_write_errors):
            kind = "disk full" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
            log.error("%s: cannot write %s (%s); %d failures so far, %d cues waiting, "
                      "will retry", self.name, self.path, kind, self.n_write_errors,
                      len(self._pending))

    def _write_pending(self) -> None:
        if not self._prepared:
            self._prepare()
        while True:
            with self._lock:
                if not self._pending:
                    return
                cue = self._pending[0]
            self._append(cue)
            with self._lock:
                if self._pending and self._pending[0] is cue:
                    self._pending.popleft()
                else:
                    self.n_lost -= 1  # dropped for memory while it was being written
            self.n_durable += 1
            if self.on_durable is not None:
                self.on_durable(self.n_durable)

    def _append(self, cue: Cue) -> None:
        """One cue: rotate if it is due, one write, fdatasync. A failed write is cut back to
        the last whole cue, so the file stays valid while the disk is full."""
        if self._fd is None:
            self._open_file()
        block = self.format_cue(self._file_n + 1, cue)
        cfg = self.config
        if self._file_n and (
                cfg.rotate_bytes and self._file_bytes + len(block) > cfg.rotate_bytes
                or cfg.rotate_s and cue.start_ns - self._file_start_ns >= cfg.rotate_s * 10**9):
            self._rotate()
            block = self.format_cue(1, cue)
        try:
            if _write_block(self._fd, block) != len(block):
                raise OSError(errno.ENOSPC, "short write (disk full?)")
            if cfg.fsync:
                os.fdatasync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, self._file_bytes)
            except OSError:
                pass  # cut off when the file is next opened
            raise
        self._file_bytes += len(block)
        self._file_n += 1
        if self._file_start_ns is None:
            self._file_start_ns = cue.start_ns

    def _open_file(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
                     | os.O_NOFOLLOW, 0o644)
        size = os.fstat(fd).st_size
        if size == 0 and self.header:
            try:
                if os.write(fd, self.header) != len(self.header):
                    raise OSError(errno.ENOSPC, "short write (disk full?)")
            except OSError:
                os.ftruncate(fd, 0)
                os.close(fd)
                raise
            size = len(self.header)
        if self.config.fsync:
            os.fsync(fd)
            _fsync_dir(self.path.parent)
        self._fd, self._file_bytes, self._file_n, self._file_start_ns = fd, size, 0, None

    def _close_file(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _rotated_name(self, n: int) -> Path:
        return self.path.with_name(f"{self.path.stem}.{n:04d}{self.path.suffix}")

    def _rotate(self) -> None:
        self._close_file()
        while self._rotated_name(self._next_rotation).exists():
            self._next_rotation += 1
        os.replace(self.path, self._rotated_name(self._next_rotation))
        self._next_rotation += 1
        if self.config.fsync:
            _fsync_dir(self.path.parent)
        self._open_file()

    def _prepare(self) -> None:
        """The folder made, and a file left by an earlier run adopted: once, before the first
        write (at start, or by the writer once the folder can be made)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._adopt_existing()
        self._prepared = True

    def _adopt_existing(self) -> None:
        """A file left by an earlier run is repaired (a torn tail cut off) and kept: rotated
        away before the first write."""
        pattern = re.compile(rf"^{re.escape(self.path.stem)}\.(\d+){re.escape(self.path.suffix)}$")
        numbers = [int(m.group(1)) for p in self.path.parent.iterdir()
                   if (m := pattern.match(p.name))]
        self._next_rotation = max(numbers, default=0) + 1
        if self.path.is_symlink():
            raise ConfigError(f"[{self.config.section}] {self.path} is a symlink: refusing")
        if self.path.exists() and self.path.stat().st_size > 0:
            self.n_repaired_bytes = repair_tail(self.path, self.header)
            if self.n_repaired_bytes:
                log.warning("%s: cut a torn last cue (%d bytes) off %s", self.name,
                            self.n_repaired_bytes, self.path)
            if self.path.stat().st_size <= len(self.header):
                self.path.unlink()  # nothing in it worth keeping
                return
            self._open_file()
            self._rotate()


def cue_span_ms(cue: Cue) -> tuple[int, int]:
    """A cue's start and end in whole ms of the audio timeline (at least 1 ms long)."""
    start_ms = max(0, cue.start_ns) // NS_PER_MS
    return start_ms, max(max(0, cue.end_ns) // NS_PER_MS, start_ms + 1)


class SRTSink(CueFileSink):
    name = "srt"
    extension = ".srt"

    def format_cue(self, n: int, cue: Cue) -> bytes:
        start_ms, end_ms = cue_span_ms(cue)
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
        start_ms, end_ms = cue_span_ms(cue)
        esc = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
        text = "\n".join(line.translate(esc) for line in cue.lines)
        return f"{n}\n{vtt_time(start_ms)} --> {vtt_time(end_ms)}\n{text}\n\n".encode()
