"""The events log: JSON lines other tools read (a contract, see issue 3).

First line::

  {"type":"start","t0_ns":…,"fps":"30/1","latency_ms":…,"lookahead_ms":…}

then one line per tick::

  {"type":"tick","k":…,"due_ns":…,"sent_ns":…,"fallback":bool,
   "committed":[{"w":"word","start_ms":…,"end_ms":…}],"tentative":"…"}

``committed`` holds the words newly committed at this tick (display text, times on the audio
timeline); ``*_ns`` are monotonic. At the tick the publisher only appends a reference to a
deque; formatting and writing happen half a tick later, off the critical moment.

The log is appended to: a channel that restarts (or a daemon restarted by systemd) adds a new
start line and its ticks after the earlier runs, which stay. Past ``rotate_bytes`` the file is
renamed to ``<stem>.<NNNN><suffix>`` and a new one begins with the current run's start line, so
every file reads on its own. :func:`read_events` reads the last run of a file. A log that cannot
be written (disk full, its folder gone or read-only) is logged and counted, the ticks go on, and
one that could not be opened is tried again once a second.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import time
from pathlib import Path
from typing import IO

from subd.errors import UserError
from subd.sinks import worth_logging
from subd.types import CaptionState

NS_PER_MS = 1_000_000
log = logging.getLogger(__name__)


def word_display(tw) -> str:
    return f"{tw.text}{tw.punct}"


def tick_record(state: CaptionState, sent_ns: int) -> dict:
    return {
        "type": "tick",
        "k": state.k,
        "due_ns": state.due_ns,
        "sent_ns": sent_ns,
        "fallback": state.fallback,
        "committed": [
            {
                "w": word_display(tw),
                "start_ms": tw.word.start_ns // NS_PER_MS,
                "end_ms": tw.word.end_ns // NS_PER_MS,
            } | ({"joined": True} if tw.word.joined else {})  # the rest of the word before
            for tw in state.committed
        ],
        "tentative": state.tentative,
    }


ROTATE_BYTES = 64 << 20
REOPEN_S = 1.0  # a log that could not be opened is tried again this often


class EventsLog:
    def __init__(self, path: str | Path, flush_delay_ns: int = 15_000_000,
                 rotate_bytes: int = ROTATE_BYTES) -> None:
        self.path = Path(path)
        self.rotate_bytes = rotate_bytes  # 0: never
        self.n_write_errors = 0
        self._opened_at = 0.0
        self._closed = False
        self._file: IO[str] | None = self._open()
        self._pending: collections.deque[tuple[CaptionState, int]] = collections.deque()
        self._flush_delay_s = flush_delay_ns / 1e9
        self._handle: asyncio.TimerHandle | None = None
        self._start: dict | None = None
        self.lines_written = 0
        self.n_rotations = 0

    def _open(self) -> IO[str] | None:
        """The log, appended to; None where it cannot be opened now (logged, counted): the
        ticks go on without it, and a flush tries again at most once a second."""
        self._opened_at = time.monotonic()
        try:
            return open(self.path, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115
        except OSError as exc:
            self._failed(exc)
            return None

    def _failed(self, exc: OSError) -> None:
        self.n_write_errors += 1
        if worth_logging(self.n_write_errors):
            log.error("events log %s: cannot write (%s); %d failures so far", self.path,
                      exc.strerror or exc, self.n_write_errors)

    def write_start(self, t0_ns: int, fps: str, latency_ms: int, lookahead_ms: int) -> None:
        self._start = {"type": "start", "t0_ns": t0_ns, "fps": fps, "latency_ms": latency_ms,
                       "lookahead_ms": lookahead_ms}
        self._write(self._start)
        self.flush()

    def _rotated_name(self, n: int) -> Path:
        return self.path.with_name(f"{self.path.stem}.{n:04d}{self.path.suffix}")

    def _maybe_rotate(self) -> None:
        if not self.rotate_bytes or self._file is None or \
                self._file.tell() < self.rotate_bytes:
            return
        self._file.close()
        self._file = None  # a failed rename leaves no closed file to write to
        n = 1
        while self._rotated_name(n).exists():
            n += 1
        os.replace(self.path, self._rotated_name(n))
        self._file = self._open()
        self.n_rotations += 1
        if self._start is not None:  # each file reads on its own
            self._write(self._start)

    def record(self, state: CaptionState, sent_ns: int) -> None:
        """Called at the tick: O(1), no formatting, no I/O."""
        self._pending.append((state, sent_ns))
        if self._handle is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
            self._handle = loop.call_later(self._flush_delay_s, self.flush)

    def _write(self, record: dict) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")))
        self._file.write("\n")
        self.lines_written += 1

    def flush(self) -> None:
        self._handle = None
        if self._file is None and not self._closed and \
                time.monotonic() - self._opened_at >= REOPEN_S:
            self._file = self._open()
            if self._file is not None and self._start is not None:  # reads on its own
                self._write(self._start)
        try:
            while self._pending:
                state, sent_ns = self._pending.popleft()
                self._write(tick_record(state, sent_ns))
            if self._file is not None:
                self._file.flush()
                self._maybe_rotate()
        except OSError as exc:  # disk full: the ticks go on, the log says so once in a while
            self._failed(exc)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self.flush()
        self._closed = True  # a flush after this (a late tick) opens nothing again
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass  # what could not be written was reported by flush()
            self._file = None


def read_events(path: str | Path) -> tuple[dict, list[dict]]:
    """(start record, tick records) of the last run in an events log."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    if not records or records[0].get("type") != "start":
        raise UserError(f"{path}: not a subd events log (no start line)")
    last = max(i for i, r in enumerate(records) if r.get("type") == "start")
    return records[last], [r for r in records[last + 1:] if r.get("type") == "tick"]
