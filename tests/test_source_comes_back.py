"""A channel whose file is missing is retried forever (capped backoff), not given up on after 5
failures: once the file appears, the real daemon plays it while the other channel never
stopped."""

from __future__ import annotations

import importlib.util
import shutil

import pytest
from daemon_helpers import (
    LIBRIVOX,
    SHORT_CLIP,
    START_LIMIT_S,
    daemon_config,
    free_port,
    healthz,
    http,
    start_daemon,
    wait_for,
)
from prometheus_client.parser import text_string_to_metric_families

OTHER_CLIP = LIBRIVOX / "sense_and_sensibility_01_austen_64kb-0930.wav"

pytestmark = pytest.mark.skipif(
    not OTHER_CLIP.exists() or importlib.util.find_spec("subd.recognise.streaming") is None,
    reason="needs the LibriVox clips (pocketsphinx-testdata) and the streaming recogniser")


def restarts(port: int, channel: str) -> float:
    body = http(port, "/metrics")[1].decode()
    return next(s.value for f in text_string_to_metric_families(body) for s in f.samples
                if s.name == "subd_channel_restarts_total" and s.labels["channel"] == channel)


def last_tick(port: int, channel: str) -> int | None:
    return healthz(port)[1]["channels"].get(channel, {}).get("last_tick")


def test_a_missing_file_is_retried_until_it_appears(tmp_path):
    port = free_port()
    config = daemon_config(port, extra=f"""[channels.late.source]
kind = "file"
path = "{tmp_path}/late.wav"
[channels.steady.source]
kind = "file"
path = "{OTHER_CLIP}"
loop = true
""")
    daemon = start_daemon(tmp_path, config, port)
    try:
        wait_for(lambda: last_tick(port, "steady"), START_LIMIT_S,
                 "the steady channel ticking", daemon.proc, daemon.log)
        # more failures than the old policy allowed (5) before it gave up for good
        wait_for(lambda: restarts(port, "late") >= 6, 120, "six restarts of the late channel",
                 daemon.proc, daemon.log)
        assert healthz(port)[1]["channels"]["late"]["state"] in ("restarting", "running")
        steady = healthz(port)[1]["channels"]["steady"]["last_tick"]
        shutil.copy(SHORT_CLIP, tmp_path / "late.wav")  # the file appears
        wait_for(lambda: last_tick(port, "late"), 120,
                 "the late channel ticking", daemon.proc, daemon.log)
        assert healthz(port)[1]["channels"]["steady"]["last_tick"] > steady
        assert daemon.proc.poll() is None
    finally:
        daemon.stop()
