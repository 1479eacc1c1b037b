"""One line per event, journald-aware, repeated errors rate-limited with a count."""

from __future__ import annotations

import io
import logging
import re

import pytest

from subd.service.logs import RepeatFilter, setup_logging, under_journald


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def restore_root_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_under_journald_no_timestamp_and_syslog_priority(restore_root_logging):
    stream = io.StringIO()
    setup_logging(stream=stream, env={"JOURNAL_STREAM": "8:12345"})
    logging.getLogger("subd.test").warning("source %s vanished", "mic")
    logging.getLogger("subd.test").info("started")
    assert _lines(stream) == [
        "<4>WARNING subd.test: source mic vanished",
        "<6>INFO subd.test: started",
    ]
    assert under_journald({"INVOCATION_ID": "abc"})
    assert not under_journald({})


def test_outside_journald_lines_carry_a_timestamp(restore_root_logging):
    stream = io.StringIO()
    setup_logging(stream=stream, env={})
    logging.getLogger("subd.test").error("disk full")
    (line,) = _lines(stream)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} ERROR subd.test: disk full", line)


def test_multi_line_messages_and_exceptions_stay_on_one_line(restore_root_logging):
    stream = io.StringIO()
    setup_logging(stream=stream, env={"JOURNAL_STREAM": "1:1"})
    log = logging.getLogger("subd.test")
    log.warning("first\nsecond")
    try:
        {}["missing"]
    except KeyError:
        log.exception("lookup failed")
    lines = _lines(stream)
    assert len(lines) == 2
    assert lines[0] == "<4>WARNING subd.test: first\\nsecond"
    assert lines[1].startswith("<3>ERROR subd.test: lookup failed: KeyError: 'missing' (")
    assert "test_logs.py:" in lines[1]


def test_repeated_errors_are_counted_not_repeated(restore_root_logging):
    stream = io.StringIO()
    clock = FakeClock()
    repeat = setup_logging(stream=stream, env={"JOURNAL_STREAM": "1:1"},
                           repeat_interval_s=10.0, clock_s=clock)
    log = logging.getLogger("subd.server.app")
    for _ in range(58):
        log.error("bad request")
        clock.now_s += 0.01
    log.error("other problem")
    log.info("status line")
    log.info("status line")  # info is never rate-limited
    assert _lines(stream) == [
        "<3>ERROR subd.server.app: bad request",
        "<3>ERROR subd.server.app: other problem",
        "<6>INFO subd.server.app: status line",
        "<6>INFO subd.server.app: status line",
    ]
    clock.now_s += 10.0
    log.error("bad request")
    assert _lines(stream)[-1] == "<3>ERROR subd.server.app: bad request (repeated 57 times)"
    for _ in range(3):
        log.error("bad request")
    clock.now_s += 10.0
    assert repeat.flush() == 1  # the errors stopped: their count still gets out
    assert _lines(stream)[-1] == "<3>ERROR subd.server.app: bad request (repeated 3 times)"
    assert repeat.flush() == 0


def test_flush_all_reports_pending_counts_at_shutdown(restore_root_logging):
    stream = io.StringIO()
    clock = FakeClock()
    repeat = setup_logging(stream=stream, env={"JOURNAL_STREAM": "1:1"}, clock_s=clock)
    for _ in range(5):
        logging.getLogger("subd.x").warning("slow sink")
    assert repeat.flush() == 0  # window still open
    assert repeat.flush_all() == 1
    assert _lines(stream) == ["<4>WARNING subd.x: slow sink",
                              "<4>WARNING subd.x: slow sink (repeated 4 times)"]


def test_varying_messages_cannot_grow_memory_without_bound(restore_root_logging):
    stream = io.StringIO()
    clock = FakeClock()
    setup_logging(stream=stream, env={"JOURNAL_STREAM": "1:1"}, clock_s=clock)
    repeat = RepeatFilter(max_keys=10, clock_s=clock)
    logging.getLogger().handlers[0].filters[:] = [repeat]
    log = logging.getLogger("subd.y")
    log.error("hot")
    log.error("hot")  # suppressed: counted
    for i in range(20):
        log.error("noise %d", i)
    assert len(repeat._seen) == 10
    # The evicted "hot" entry reported its count instead of losing it.
    assert "<3>ERROR subd.y: hot (repeated 1 times)" in _lines(stream)
