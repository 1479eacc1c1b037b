"""Logging: one line per event, journald-friendly, repeated errors rate-limited with a count.

Under systemd (``JOURNAL_STREAM`` or ``INVOCATION_ID`` set) the journal stamps each line itself,
so we write no timestamp and prefix the syslog priority (``<3>``) that journald reads as the
level. Elsewhere each line starts with an ISO timestamp. Either way an event is exactly one
line: newlines in messages are escaped and an exception is summarised on the same line.

Identical warnings/errors (same logger, level and text) pass once per ``interval_s``; the
repeats are counted and reported as ``… (repeated 57 times)`` on the next line that passes, or
by :meth:`RepeatFilter.flush` (call it periodically and at shutdown) once the errors stop.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TextIO

# logging level -> syslog priority, as sd-daemon(3) prefixes.
_SYSLOG_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}
_SUMMARY_ATTR = "subd_repeat_summary"


def under_journald(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return bool(env.get("JOURNAL_STREAM") or env.get("INVOCATION_ID"))


def _syslog_priority(levelno: int) -> int:
    for level in sorted(_SYSLOG_PRIORITY, reverse=True):
        if levelno >= level:
            return _SYSLOG_PRIORITY[level]
    return 7


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


class OneLineFormatter(logging.Formatter):
    """``[<prio>|timestamp] LEVEL logger: message[: ExcType: text (file:line in func)]``."""

    def __init__(self, journald: bool) -> None:
        super().__init__()
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        message = _one_line(record.getMessage())
        if record.exc_info and record.exc_info[1] is not None:
            message += ": " + _exception_summary(record.exc_info[1])
        body = f"{record.levelname} {record.name}: {message}"
        if self.journald:
            return f"<{_syslog_priority(record.levelno)}>{body}"
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
        return f"{stamp}.{int(record.msecs):03d} {body}"


def _exception_summary(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {_one_line(str(exc))}"
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        text += f" ({os.path.basename(last.filename)}:{last.lineno} in {last.name})"
    return text


class _Repeat:
    __slots__ = ("shown_s", "suppressed", "record")

    def __init__(self, shown_s: float, record: logging.LogRecord) -> None:
        self.shown_s = shown_s
        self.suppressed = 0
        self.record = record


class RepeatFilter(logging.Filter):
    """Lets an identical warning/error through once per ``interval_s``, counting the rest."""

    def __init__(
        self,
        interval_s: float = 10.0,
        min_level: int = logging.WARNING,
        max_keys: int = 1024,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.min_level = min_level
        self.max_keys = max_keys  # bounded memory when an attacker varies the text
        self._clock_s = clock_s
        self._seen: OrderedDict[tuple[str, int, str], _Repeat] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.min_level or getattr(record, _SUMMARY_ATTR, False):
            return True
        key = (record.name, record.levelno, record.getMessage())
        now = self._clock_s()
        seen = self._seen.get(key)
        if seen is not None and now - seen.shown_s < self.interval_s:
            seen.suppressed += 1
            seen.record = record
            return False
        if seen is not None and seen.suppressed:
            # Show this occurrence and say how many identical ones were held back before it.
            record.msg = f"{record.getMessage()} (repeated {seen.suppressed} times)"
            record.args = None
        self._seen[key] = _Repeat(now, record)
        self._seen.move_to_end(key)
        while len(self._seen) > self.max_keys:
            _, dropped = self._seen.popitem(last=False)
            if dropped.suppressed:
                self._emit_summary(dropped)
        return True

    def flush(self) -> int:
        """Report the count of every error whose window has closed; returns lines emitted."""
        now = self._clock_s()
        done = [k for k, s in self._seen.items() if now - s.shown_s >= self.interval_s]
        emitted = 0
        for key in done:
            seen = self._seen.pop(key)
            if seen.suppressed:
                self._emit_summary(seen)
                emitted += 1
        return emitted

    def flush_all(self) -> int:
        """Report every pending count now (at shutdown)."""
        pending = [s for s in self._seen.values() if s.suppressed]
        self._seen.clear()
        for seen in pending:
            self._emit_summary(seen)
        return len(pending)

    def _emit_summary(self, seen: _Repeat) -> None:
        last = seen.record
        summary = logging.LogRecord(
            last.name, last.levelno, last.pathname, last.lineno,
            "%s (repeated %d times)", (last.getMessage(), seen.suppressed), None,
        )
        setattr(summary, _SUMMARY_ATTR, True)
        logging.getLogger(last.name).handle(summary)


def setup_logging(
    level: int = logging.INFO,
    stream: TextIO | None = None,
    env: Mapping[str, str] | None = None,
    repeat_interval_s: float = 10.0,
    clock_s: Callable[[], float] = time.monotonic,
) -> RepeatFilter:
    """Configure the root logger for the daemon; returns the filter to ``flush`` periodically.

    Replaces handlers set earlier (``subd.cli`` sets a basic one) so each event is written once.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(OneLineFormatter(journald=under_journald(env)))
    repeat = RepeatFilter(interval_s=repeat_interval_s, clock_s=clock_s)
    handler.addFilter(repeat)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # aiohttp's access log would write a line per request: under abuse that is a flood.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return repeat
