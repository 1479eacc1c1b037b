"""The events log: JSON lines other tools read (a contract, see issue 3).

First line::

  {"type":"start","t0_ns":…,"fps":"30/1","latency_ms":…,"lookahead_ms":…}

then one line per tick::

  {"type":"tick","k":…,"due_ns":…,"sent_ns":…,"fallback":bool,
   "committed":[{"w":"word","start_ms":…,"end_ms":…}],"tentative":"…"}

``committed`` holds the words newly committed at this tick (display text, times on the audio
timeline); ``*_ns`` are monotonic. At the tick the publisher only appends a reference to a
deque; formatting and writing happen half a tick later, off the critical moment.
"""

from __future__ import annotations

import asyncio
import collections
import json
from pathlib import Path
from typing import IO

from subd.errors import UserError
from subd.types import CaptionState

NS_PER_MS = 1_000_000


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
            }
            for tw in state.committed
        ],
        "tentative": state.tentative,
    }


class EventsLog:
    def __init__(self, path: str | Path, flush_delay_ns: int = 15_000_000) -> None:
        self.path = Path(path)
        try:
            self._file: IO[str] | None = open(self.path, "w", encoding="utf-8",  # noqa: SIM115
                                              buffering=1 << 16)
        except OSError as exc:
            raise UserError(f"cannot write events log {self.path}: {exc.strerror}") from None
        self._pending: collections.deque[tuple[CaptionState, int]] = collections.deque()
        self._flush_delay_s = flush_delay_ns / 1e9
        self._handle: asyncio.TimerHandle | None = None
        self.lines_written = 0

    def write_start(self, t0_ns: int, fps: str, latency_ms: int, lookahead_ms: int) -> None:
        self._write({"type": "start", "t0_ns": t0_ns, "fps": fps, "latency_ms": latency_ms,
                     "lookahead_ms": lookahead_ms})
        self.flush()

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
        while self._pending:
            state, sent_ns = self._pending.popleft()
            self._write(tick_record(state, sent_ns))
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None


def read_events(path: str | Path) -> tuple[dict, list[dict]]:
    """(start record, tick records) of an events log."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    if not records or records[0].get("type") != "start":
        raise UserError(f"{path}: not a subd events log (no start line)")
    return records[0], [r for r in records[1:] if r.get("type") == "tick"]
