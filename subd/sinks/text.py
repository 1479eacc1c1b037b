"""Sink ``text``: each committed cue as plain text, as it is committed (``subd stream`` prints
to stdout unless ``--quiet``; ``[sinks] enabled = ["text"]`` under ``subd run`` writes to the
daemon's stdout, the journal under systemd).

One cue per block: its audio times as WebVTT writes them, then its lines as laid out, the
second and later lines indented under the first::

    00:00:01.240 --> 00:00:03.980  He was not an ill-disposed
                                   young man.

``publish`` only queues: a writer thread writes, so a terminal or pipe that does not read can
never hold the tick clock. A reader that goes away (``subd stream x.wav | head``) ends the
printing with one warning; the other outputs go on. While the stream is stalled the queue holds
at most ``max_pending`` cues; more are dropped, counted and logged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TextIO

from subd.errors import ConfigError
from subd.sinks import worth_logging
from subd.sinks.files import cue_span_ms, vtt_time
from subd.types import CaptionState, Cue
from subd.validate import check_range, from_mapping

log = logging.getLogger(__name__)
CLOSE_WAIT_S = 5.0  # at close, for a writer blocked by a reader that does not read


def format_cue(cue: Cue) -> str:
    """The block printed for ``cue`` (empty for a cue without text)."""
    lines = [line for line in cue.lines if line.strip()]
    if not lines:
        return ""
    start_ms, end_ms = cue_span_ms(cue)
    head = f"{vtt_time(start_ms)} --> {vtt_time(end_ms)}  "
    return head + ("\n" + " " * len(head)).join(lines) + "\n"


@dataclass(frozen=True)
class TextSinkConfig:
    max_pending: int = 10_000  # cues held while the stream is not read; beyond: dropped

    def __post_init__(self) -> None:
        if isinstance(self.max_pending, bool) or not isinstance(self.max_pending, int):
            raise ConfigError(f"[sinks.text] max_pending = {self.max_pending!r}: must be an "
                              "integer")
        check_range("sinks.text", "max_pending", self.max_pending, 1, 10_000_000)


class TextSink:
    name: ClassVar[str] = "text"

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> TextSink:
        """``[sinks.text]``: ``max_pending`` (stdout is the stream)."""
        return cls(max_pending=from_mapping(TextSinkConfig, "sinks.text", data).max_pending)

    def __init__(self, stream: TextIO | None = None, max_pending: int = 10_000) -> None:
        self.stream = stream  # None: sys.stdout as it is at start
        self.max_pending = TextSinkConfig(max_pending).max_pending
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._open: Cue | None = None  # the latest tick's open cue (committed words)
        self._closed_by_reader = False
        self.n_printed = 0
        self.n_dropped = 0  # not queued: the stream stalled past max_pending (event loop)
        self.n_failed = 0  # queued, not printed: the stream failed or its reader went (writer)

    async def start(self) -> None:
        if self.stream is None:
            self.stream = sys.stdout
        self._thread = threading.Thread(target=self._write_all, name="subd-text", daemon=True)
        self._thread.start()

    def publish(self, state: CaptionState) -> None:
        for cue in state.cues:
            if cue.committed:
                self._put(format_cue(cue))
        self._open = next((c for c in state.cues if not c.committed), None)

    async def close(self) -> None:
        if self._open is not None:  # the stream was cut short: its committed words stay
            self._put(format_cue(self._open))
            self._open = None
        if self._thread is not None:
            self._queue.put(None)
            # polled, not joined in an executor thread: a reader that never reads holds the
            # writer for ever, and asyncio.run waits for its executor's threads at exit
            for _ in range(int(CLOSE_WAIT_S / 0.02)):
                if not self._thread.is_alive():
                    break
                await asyncio.sleep(0.02)
            else:
                log.warning("text: the printed captions are not read; %d cues left",
                            self._queue.qsize())
            self._thread = None
        if self.n_dropped + self.n_failed:
            log.error("text: %d committed cues were not printed", self.n_dropped + self.n_failed)

    def _put(self, text: str) -> None:
        if not text:
            return
        if self._queue.qsize() >= self.max_pending:
            self.n_dropped += 1
            if worth_logging(self.n_dropped):
                log.warning("text: output not read, %d cues dropped so far", self.n_dropped)
            return
        self._queue.put(text)

    def _write_all(self) -> None:
        """The writer thread: until close's sentinel."""
        while (text := self._queue.get()) is not None:
            if self._closed_by_reader:
                self.n_failed += 1
                continue
            try:
                self.stream.write(text)
                self.stream.flush()
                self.n_printed += 1
            except BrokenPipeError:
                self._reader_gone()
            except (OSError, ValueError) as exc:  # ValueError: the stream was closed
                self.n_failed += 1
                log.warning("text: cannot print a cue (%s)", exc)

    def _reader_gone(self) -> None:
        self._closed_by_reader = True
        self.n_failed += 1
        log.warning("text: the reader of the printed captions has gone; the other outputs go "
                    "on")
        try:  # and no second error when Python flushes the stream at exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass
