"""The ``text`` sink: committed cues printed as they are committed, never holding the clock."""

from __future__ import annotations

import asyncio
import io
import logging
import threading

import pytest

from subd.errors import ConfigError
from subd.sinks import load_sink_factory
from subd.sinks.text import TextSink, format_cue
from subd.types import CaptionState, Cue

MS = 1_000_000


def _state(k: int, *cues: Cue) -> CaptionState:
    return CaptionState(k=k, due_ns=k * 33 * MS, audio_end_ns=k * 33 * MS, cues=cues)


def _cue(i: int, *lines: str, committed: bool = True) -> Cue:
    return Cue(index=i, start_ns=i * 2000 * MS, end_ns=i * 2000 * MS + 1500 * MS, lines=lines,
               committed=committed)


def test_a_cue_prints_its_times_then_its_lines_under_each_other() -> None:
    cue = Cue(index=1, start_ns=61_240 * MS, end_ns=63_980 * MS,
              lines=("He was not an ill-disposed", "young man."))
    assert format_cue(cue) == ("00:01:01.240 --> 00:01:03.980  He was not an ill-disposed\n"
                               "                               young man.\n")
    assert format_cue(Cue(index=2, start_ns=0, end_ns=MS, lines=("",))) == ""


def test_committed_cues_are_printed_once_and_a_cut_stream_keeps_its_open_cue() -> None:
    out = io.StringIO()

    async def go() -> TextSink:
        sink = TextSink(out)
        await sink.start()
        sink.publish(_state(1, _cue(0, "one", committed=False)))
        sink.publish(_state(2, _cue(0, "one two"), _cue(1, "three", committed=False)))
        sink.publish(_state(3, _cue(1, "three four", committed=False)))
        await sink.close()  # the stream ends here: "three four" was committed audio
        return sink

    sink = asyncio.run(go())
    assert out.getvalue() == format_cue(_cue(0, "one two")) + format_cue(_cue(1, "three four"))
    assert sink.n_printed == 2 and sink.n_dropped == sink.n_failed == 0
    assert load_sink_factory("text") is TextSink  # registered: [sinks] enabled = ["text"]


class _Stalled(io.StringIO):
    """A terminal nobody reads: the first write blocks until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def write(self, text: str) -> int:
        self.release.wait()
        return super().write(text)


def test_a_stream_that_is_not_read_never_holds_publish_and_drops_past_its_bound(caplog) -> None:
    out = _Stalled()

    async def go() -> TextSink:
        sink = TextSink(out, max_pending=3)
        await sink.start()
        for k in range(8):  # each returns with the writer blocked in its first write
            sink.publish(_state(k, _cue(k, f"cue {k}")))
        out.release.set()
        await sink.close()
        return sink

    with caplog.at_level(logging.WARNING, logger="subd.sinks.text"):
        sink = asyncio.run(go())
    printed = out.getvalue().count("-->")
    assert printed == sink.n_printed and sink.n_printed + sink.n_dropped == 8
    assert 3 <= sink.n_printed <= 4 and sink.n_dropped >= 4  # the one in the writer, 3 queued
    assert "output not read" in caplog.text


class _Gone(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_reader_that_goes_away_ends_the_printing_with_one_warning(caplog) -> None:
    async def go() -> TextSink:
        sink = TextSink(_Gone())
        await sink.start()
        for k in range(5):
            sink.publish(_state(k, _cue(k, f"cue {k}")))
        await sink.close()
        return sink

    with caplog.at_level(logging.WARNING, logger="subd.sinks.text"):
        sink = asyncio.run(go())
    assert sink.n_failed == 5 and sink.n_printed == 0
    assert caplog.text.count("reader of the printed captions has gone") == 1


@pytest.mark.parametrize(("table", "needle"), [
    ({"max_pending": 0}, r"\[sinks.text\] max_pending = 0: must be in 1\.\.10000000"),
    ({"max_pending": True}, r"\[sinks.text\] max_pending = True: expected int"),
    ({"max_pending": "10"}, r"\[sinks.text\] max_pending"),
    ({"path": "x.txt"}, r"\[sinks.text\] unknown key 'path' \(known keys: max_pending\)"),
])
def test_a_bad_table_is_one_line(table: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        TextSink.from_mapping(table)
    assert TextSink.from_mapping({"max_pending": 5}).max_pending == 5


def test_a_reader_that_never_reads_does_not_hold_the_close(caplog, monkeypatch) -> None:
    """A terminal that never reads (a pipe nobody drains) blocks the writer in its write for
    ever: close waits a bounded time, says so, and returns (the writer is a daemon thread)."""
    import subd.sinks.text as text

    monkeypatch.setattr(text, "CLOSE_WAIT_S", 0.2)
    out = _Stalled()  # never released

    async def go() -> TextSink:
        sink = TextSink(out)
        await sink.start()
        sink.publish(_state(0, _cue(0, "cue 0")))
        sink.publish(_state(1, _cue(1, "cue 1")))
        await sink.close()
        return sink

    with caplog.at_level(logging.WARNING, logger="subd.sinks.text"):
        sink = asyncio.run(go())
    assert sink.n_printed == 0
    assert "the printed captions are not read" in caplog.text
    out.release.set()  # let the thread end
