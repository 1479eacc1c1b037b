"""Several channels in one real daemon (one shared model): a channel whose source fails is
reported in /healthz and /metrics while the other keeps its tick error unchanged.

Channels: ``a`` plays a copy of a clip that the test deletes (file vanishes), ``b`` plays
another clip throughout, ``c`` takes HTTP push audio from a pusher that stops (disconnects).
"""

from __future__ import annotations

import importlib.util
import shutil
import signal
import statistics
import threading
import time

import numpy as np
import pytest
import soundfile as sf
from daemon_helpers import (
    LIBRIVOX,
    SHORT_CLIP,
    START_LIMIT_S,
    TOKEN,
    daemon_config,
    free_port,
    healthz,
    http,
    read_jsonl,
    start_daemon,
    wait_for,
)
from prometheus_client.parser import text_string_to_metric_families

OTHER_CLIP = LIBRIVOX / "sense_and_sensibility_01_austen_64kb-0930.wav"

pytestmark = pytest.mark.skipif(
    not OTHER_CLIP.exists() or importlib.util.find_spec("subd.recognise.streaming") is None,
    reason="needs the LibriVox clips (pocketsphinx-testdata) and the streaming recogniser")


def config_text(tmp, port: int) -> str:
    return daemon_config(port, tick={"latency_ms": 1000}, extra=f"""[channels.a.source]
kind = "file"
path = "{tmp}/a.wav"
[channels.a.events]
path = "{tmp}/a.jsonl"
[channels.b.source]
kind = "file"
path = "{OTHER_CLIP}"
[channels.b.events]
path = "{tmp}/b.jsonl"
[channels.c.source]
kind = "http"
quiet_after_ms = 1000
[channels.c.events]
path = "{tmp}/c.jsonl"
""")


def push_for(port: int, seconds: float) -> None:
    """Push a clip as s16le PCM in 100 ms requests, paced at real time, then go away."""
    audio, _ = sf.read(str(SHORT_CLIP), dtype="int16")
    pcm = np.tile(audio, 4)[: int(seconds * 16000)].tobytes()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    step = 3200
    t0 = time.monotonic()
    for i in range(0, len(pcm), step):
        for _ in range(30):  # told to come back (the channel not up yet): as a client would
            status, _ = http(port, "/c/c/push", method="POST", data=pcm[i:i + step],
                             headers=headers)
            if status != 503:
                break
            time.sleep(1.0)
        assert status == 204, status
        time.sleep(max(0.0, t0 + (i + step) / 32000 - time.monotonic()))


def metric(port: int, name: str, channel: str) -> float:
    body = http(port, "/metrics")[1].decode()
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name == name and s.labels.get("channel") == channel:
                return s.value
    raise AssertionError(f"{name}{{channel={channel!r}}} not exported")


def errors_ms(ticks: list[dict]) -> list[float]:
    return [(t["sent_ns"] - t["due_ns"]) / 1e6 for t in ticks]


def test_a_failing_source_is_reported_while_the_other_channel_keeps_its_clock(tmp_path):
    shutil.copy(SHORT_CLIP, tmp_path / "a.wav")
    port = free_port()
    daemon = start_daemon(tmp_path, config_text(tmp_path, port), port)
    try:
        wait_for(lambda: healthz(port), START_LIMIT_S, "the port", daemon.proc, daemon.log)
        # pushed while the model loads: the channel exists, it is not up yet; a pusher is told
        # to come back (or, up within the wait, accepted), never that there is no such channel
        status, body = http(port, "/c/c/push", method="POST", data=bytes(3200),
                            headers={"Authorization": f"Bearer {TOKEN}"})
        assert status in (204, 503), (status, body)
        wait_for(lambda: healthz(port)[1].get("model_loaded"), START_LIMIT_S, "the server",
                 daemon.proc, daemon.log)
        pusher = threading.Thread(target=push_for, args=(port, 2.5), daemon=True)
        pusher.start()

        def channels():
            return healthz(port)[1]["channels"]

        wait_for(lambda: all(channels()[n]["last_tick"] for n in "abc"), 60,
                 "every channel ticking", daemon.proc, daemon.log)
        pusher.join(30)
        # the pusher went away: channel c says so, and keeps its clock
        wait_for(lambda: channels()["c"]["source"] == "down", 20, "c reported down",
                 daemon.proc, daemon.log)
        assert "no audio for" in channels()["c"]["source_detail"]
        c_tick = channels()["c"]["last_tick"]

        time.sleep(2.0)  # b's tick error with every source up
        _, b_before = read_jsonl(tmp_path / "b.jsonl")
        (tmp_path / "a.wav").unlink()  # channel a's file vanishes
        wait_for(lambda: channels()["a"]["source"] == "down", 30, "a reported down",
                 daemon.proc, daemon.log)
        status, report = healthz(port)
        assert status == 200 and report["status"] == "degraded", report
        assert "vanished" in report["channels"]["a"]["source_detail"]
        assert healthz(port, "/c/a/healthz")[0] == 503
        assert healthz(port, "/c/b/healthz")[0] == 200
        assert metric(port, "subd_source_up", "a") == 0
        assert metric(port, "subd_source_failures_total", "a") >= 1
        assert metric(port, "subd_source_up", "c") == 0
        assert metric(port, "subd_source_up", "b") == 1
        a_tick = channels()["a"]["last_tick"]

        time.sleep(2.0)  # b's tick error while a and c are down
        _, b_all = read_jsonl(tmp_path / "b.jsonl")
        assert [t["k"] for t in b_all] == list(range(len(b_all)))  # not a tick lost
        b_after = b_all[len(b_before):]
        assert len(b_after) >= 60
        before = statistics.median(errors_ms(b_before[-60:]))
        after = statistics.median(errors_ms(b_after))
        print(f"b: publish error p50 {before * 1e6:.0f} ns with every source up, "
              f"{after * 1e6:.0f} ns with a and c down")
        assert after <= max(3 * before, 0.5)
        miss_ms = 1000 / 30 / 2
        assert sum(e > miss_ms for e in errors_ms(b_after)) <= len(b_after) // 50
        # the failed channels run on (their clocks tick on silence and on nothing)
        assert channels()["a"]["last_tick"] > a_tick and channels()["c"]["last_tick"] > c_tick

        shutil.copy(SHORT_CLIP, tmp_path / "a.wav")  # the file is back
        wait_for(lambda: channels()["a"]["source"] == "up", 30, "a back up",
                 daemon.proc, daemon.log)
        assert metric(port, "subd_source_up", "a") == 1
        daemon.signal(signal.SIGTERM)
        assert daemon.proc.wait(timeout=10) == 0
        log = daemon.log_text()
        assert "channel a: source down" in log and "channel a: source is back" in log
    finally:
        daemon.stop()
