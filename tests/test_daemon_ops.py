"""The real daemon as a subprocess: notify protocol, /metrics, push token, SIGHUP reloads (a
new latency, a bad file), and SIGTERM -> exit 0 with the SRT complete.

One daemon (real model, a 3 s LibriVox clip looping) serves the tests of this module in order;
the last one stops it.
"""

from __future__ import annotations

import importlib.util
import signal
import time
from pathlib import Path

import pysrt
import pytest
from daemon_helpers import (
    SHORT_CLIP,
    START_LIMIT_S,
    NotifyListener,
    daemon_config,
    free_port,
    healthz,
    http,
    latency_ns_of,
    read_jsonl,
    same_words_shown,
    start_daemon,
    wait_for,
)
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.skipif(
    not SHORT_CLIP.exists() or importlib.util.find_spec("subd.recognise.streaming") is None,
    reason="needs the LibriVox clips (pocketsphinx-testdata) and the streaming recogniser")

LATENCY_MS = 1000
NEW_LATENCY_MS = 1600


def config_text(out, port: int, latency_ms: int) -> str:
    return daemon_config(
        port, tick={"latency_ms": latency_ms, "max_latency_ms": 4000},
        source={"kind": "file", "path": SHORT_CLIP, "loop": True}, sinks=("srt", "sse"),
        extra=f"""[sinks.srt]
directory = "{out}"
[events]
path = "{out}/events.jsonl"
""")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("daemon")
    out = tmp / "out"
    port = free_port()
    notify = NotifyListener(tmp / "notify.sock")
    proc = start_daemon(tmp, config_text(out, port, LATENCY_MS), port,
                        env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "1000000"})
    proc.out, proc.notify = out, notify
    try:
        wait_for(lambda: healthz(port)[1]["status"] == "ok", START_LIMIT_S, "/healthz ok",
                 proc.proc, proc.log)
        yield proc
    finally:
        proc.stop()
        notify.close()


def ticks(daemon) -> int:
    return healthz(daemon.port)[1]["channels"]["main"]["last_tick"]


def test_notify_messages_arrive_on_the_socket(daemon):
    wait_for(lambda: "WATCHDOG=1" in daemon.notify.assignments(), 10, "a watchdog ping")
    got = daemon.notify.assignments()
    assert got.index("READY=1") < got.index("WATCHDOG=1")
    assert any(a.startswith("STATUS=") and "channels" in a for a in got), got


def test_worker_processes_cannot_notify_on_the_daemons_behalf(daemon):
    if not Path(f"/proc/{daemon.proc.pid}/task/{daemon.proc.pid}/children").exists():
        pytest.skip("no /proc children list on this kernel")
    # stage processes are forked from multiprocessing's fork server, a child of the daemon
    # (started from a worker thread)
    pids, todo = [], [str(daemon.proc.pid)]
    while todo:
        pid = todo.pop()
        new = []  # a child is listed under the thread that started it
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            try:
                new += task.read_text().split()
            except OSError:
                continue  # the thread ended
        pids += new
        todo += new
    workers = [p for p in pids if b"multiprocessing" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(workers) >= 2  # the fork server and the stage processes forked from it
    for pid in workers:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert not any(v.startswith((b"NOTIFY_SOCKET=", b"WATCHDOG_USEC=")) for v in env)


def test_push_without_the_token_is_refused(daemon):
    pcm = bytes(3200)
    assert http(daemon.port, "/push", method="POST", data=pcm)[0] == 401
    wrong = {"Authorization": "Bearer not-the-token-at-all"}
    assert http(daemon.port, "/push", method="POST", data=pcm, headers=wrong)[0] == 401
    assert http(daemon.port, "/metrics", method="POST", data=b"x")[0] == 405  # read-only


def _ticks_total(families) -> float:
    return sum(s.value for s in families["subd_ticks"].samples
               if s.name == "subd_ticks_total" and s.labels["channel"] == "main")


def test_metrics_parse_with_prometheus_client(daemon):
    def scrape():
        status, body = http(daemon.port, "/metrics")
        assert status == 200
        return {f.name: f for f in text_string_to_metric_families(body.decode())}

    wait_for(lambda: _ticks_total(scrape()) > 0, 20, "ticks in /metrics", daemon.proc, daemon.log)
    for _ in range(2):  # two refused pushes, whatever ran before
        assert http(daemon.port, "/push", method="POST", data=bytes(320))[0] == 401
    families = scrape()
    assert "subd_publish_error_seconds" in families
    rejected = sum(s.value for s in families["subd_http_rejected"].samples
                   if s.name == "subd_http_rejected_total")
    assert rejected >= 2  # the refused pushes were counted
    loaded = families["subd_model_loaded"].samples[0].value
    assert loaded == 1
    stages = {s.labels["stage"] for s in families["subd_stage_duration_seconds"].samples
              if s.name == "subd_stage_duration_seconds_count" and s.value > 0}
    assert {"recognise", "publish"} <= stages  # per-stage durations are exported


def test_a_bad_reload_keeps_the_daemon_running_and_says_why(daemon):
    good = daemon.config.read_text()
    daemon.config.write_text(good.replace(f"latency_ms = {LATENCY_MS}", "latency_ms = 5"))
    try:
        daemon.signal(signal.SIGHUP)
        wait_for(lambda: "reload rejected" in daemon.log_text(), 20, "the rejection",
                 daemon.proc, daemon.log)
    finally:
        daemon.config.write_text(good)
    line = next(x for x in daemon.log_text().splitlines() if "reload rejected" in x)
    assert "latency_ms" in line and "out of range" in line
    before = ticks(daemon)
    wait_for(lambda: ticks(daemon) > before + 15, 20, "ticks after the bad reload",
             daemon.proc, daemon.log)
    start, published = read_jsonl(daemon.out / "events.jsonl")
    assert latency_ns_of(start, published[-1]) == LATENCY_MS * 10**6  # unchanged


def test_a_reload_into_a_folder_that_takes_no_file_is_refused(daemon):
    good = daemon.config.read_text()
    daemon.config.write_text(good.replace(f'directory = "{daemon.out}"',
                                          'directory = "/proc/subd-captions"'))
    try:
        n = daemon.log_text().count("reload rejected")
        daemon.signal(signal.SIGHUP)
        wait_for(lambda: daemon.log_text().count("reload rejected") > n, 20, "the rejection",
                 daemon.proc, daemon.log)
    finally:
        daemon.config.write_text(good)
    line = [x for x in daemon.log_text().splitlines() if "reload rejected" in x][-1]
    assert "[sinks.srt] directory /proc/subd-captions: cannot write" in line
    before = ticks(daemon)
    wait_for(lambda: ticks(daemon) > before + 15, 20, "ticks after the refused reload",
             daemon.proc, daemon.log)


def test_sighup_changes_the_latency_of_the_next_ticks(daemon):
    daemon.config.write_text(daemon.config.read_text().replace(
        f"latency_ms = {LATENCY_MS}", f"latency_ms = {NEW_LATENCY_MS}"))
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: "configuration reloaded" in daemon.log_text(), 20, "the reload",
             daemon.proc, daemon.log)
    reloaded_k = ticks(daemon)
    wait_for(lambda: ticks(daemon) > reloaded_k + 45, 20, "ticks after the reload",
             daemon.proc, daemon.log)
    start, published = read_jsonl(daemon.out / "events.jsonl")
    assert [t["k"] for t in published] == list(range(len(published)))  # nothing dropped
    latencies = [latency_ns_of(start, t) for t in published]
    switch = latencies.index(NEW_LATENCY_MS * 10**6)
    assert set(latencies[:switch]) == {LATENCY_MS * 10**6}
    assert set(latencies[switch:]) == {NEW_LATENCY_MS * 10**6}
    assert switch <= reloaded_k + 15  # the very next ticks follow the new latency
    assert all(t["sent_ns"] >= t["due_ns"] for t in published)  # never early
    assert any("RELOADING=1" in m for m in daemon.notify.drain())


def test_sigterm_exits_0_with_the_srt_complete(daemon):
    wait_for(lambda: (daemon.out / "live.srt").exists() and pysrt.open(
        str(daemon.out / "live.srt")), 60, "a first cue", daemon.proc, daemon.log)
    sent = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(timeout=5.0) == 0  # the acceptance bound: drain within 5 s
    print(f"SIGTERM -> exit: {time.monotonic() - sent:.2f} s")
    subs = pysrt.open(str(daemon.out / "live.srt"), error_handling=pysrt.ERROR_RAISE)
    srt_words = " ".join(s.text for s in subs).split()
    _, published = read_jsonl(daemon.out / "events.jsonl")
    assert published and same_words_shown(srt_words, published)  # every word, in order, once
    assert all(a.start <= a.end <= b.start for a, b in zip(subs, subs[1:], strict=False))
    assert any("STOPPING=1" in m for m in daemon.notify.drain())
    assert "drained" in daemon.log_text()
