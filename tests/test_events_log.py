"""The events log is appended to across runs and rotated by size; every file reads on its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from subd.sinks import events_log
from subd.sinks.events_log import EventsLog, read_events
from subd.types import CaptionState


def run(path: Path, t0_ns: int, n_ticks: int, **kwargs) -> EventsLog:
    log = EventsLog(path, **kwargs)
    log.write_start(t0_ns, "30/1", 2000, 150)
    for k in range(n_ticks):
        log.record(CaptionState(k=k, due_ns=t0_ns + k, audio_end_ns=0, tentative="x" * 20),
                   t0_ns + k)  # no event loop: written at once
    log.close()
    return log


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_restarted_channel_appends_and_the_earlier_run_stays(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    run(path, 1_000, 5)
    run(path, 9_000, 3)  # the channel restarted: its old ticks are not truncated away
    recs = records(path)
    assert [r["type"] for r in recs] == ["start"] + ["tick"] * 5 + ["start"] + ["tick"] * 3
    start, ticks = read_events(path)  # the last run
    assert start["t0_ns"] == 9_000 and [t["k"] for t in ticks] == [0, 1, 2]


def test_rotation_by_size_keeps_every_tick_in_files_that_read_on_their_own(
        tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = run(path, 1_000, 400, rotate_bytes=4096)
    rotated = sorted(tmp_path.glob("events.0*.jsonl"))
    assert len(rotated) >= 3 and log.n_rotations == len(rotated)
    ks = []
    for p in [*rotated, path]:
        start, ticks = read_events(p)
        assert start["t0_ns"] == 1_000
        ks += [t["k"] for t in ticks]
        if p != path:
            assert p.stat().st_size < 4096 + 200  # one flush past the bound at most
    assert ks == list(range(400))


def test_a_log_that_cannot_be_opened_lets_the_ticks_go_on_and_is_opened_when_it_can(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # before: a UserError out of the channel's start, which the supervisor restarted for ever
    monkeypatch.setattr(events_log, "REOPEN_S", 0.0)
    (tmp_path / "logs").write_text("a file where the folder should be")
    path = tmp_path / "logs" / "events.jsonl"
    log = EventsLog(path)
    log.write_start(1_000, "30/1", 2000, 150)
    for k in range(3):
        log.record(CaptionState(k=k, due_ns=k, audio_end_ns=0), k)
    assert log.n_write_errors >= 1 and "cannot write" in caplog.text
    (tmp_path / "logs").unlink()
    (tmp_path / "logs").mkdir()
    for k in range(3, 6):
        log.record(CaptionState(k=k, due_ns=k, audio_end_ns=0), k)
    log.close()
    start, ticks = read_events(path)  # the file reads on its own: the start line comes first
    assert start["t0_ns"] == 1_000 and [t["k"] for t in ticks] == [3, 4, 5]
