"""The real daemon under a stand-in for systemd's notify socket: the watchdog is fed while a push
channel waits for its first audio (idle by design, no ticks), and a busy HTTP port stops the
daemon before any channel starts."""

from __future__ import annotations

import importlib.util
import socket
import time

import pytest
from daemon_helpers import (
    PUSH_SOURCE,
    START_LIMIT_S,
    NotifyListener,
    daemon_config,
    free_port,
    healthz,
    start_daemon,
    wait_for,
)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("subd.recognise.streaming") is None,
                                reason="needs the streaming recogniser")


def push_config(tmp, port: int) -> str:
    return daemon_config(port, source=PUSH_SOURCE, extra=f"""[events]
path = "{tmp}/events.jsonl"
""")


def test_the_watchdog_is_fed_while_a_push_channel_waits_for_audio(tmp_path):
    port = free_port()
    notify = NotifyListener(tmp_path / "notify.sock")
    daemon = start_daemon(tmp_path, push_config(tmp_path, port), port,
                          env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "2000000"})
    try:
        wait_for(lambda: "READY=1" in notify.assignments(), START_LIMIT_S, "READY=1",
                 daemon.proc, daemon.log)
        n_ready = len(notify.assignments())
        time.sleep(6.0)  # three watchdog intervals without a byte of audio
        later = notify.assignments()[n_ready:]
        assert later.count("WATCHDOG=1") >= 3, later
        channel = healthz(port)[1]["channels"]["main"]
        assert channel["last_tick"] is None  # idle by design: no tick was published
        assert daemon.proc.poll() is None
    finally:
        daemon.stop()
        notify.close()


def test_a_busy_port_stops_the_daemon_before_any_channel_starts(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = push_config(tmp_path, port).replace('kind = "http"', 'kind = "file"\n'
                                                      'path = "/nonexistent.wav"')
        daemon = start_daemon(tmp_path, config, port)
        try:
            code = daemon.proc.wait(START_LIMIT_S)
        finally:
            daemon.stop()
    log = daemon.log_text()
    assert code != 0
    assert log.count(f"cannot listen on 127.0.0.1:{port}") == 1, log  # one line, said once
    assert "Traceback" not in log
    # nothing was started: no model process, no channel (its events log would exist)
    assert not (tmp_path / "events.jsonl").exists()
    assert "recognise" not in log and "/nonexistent.wav" not in log, log
