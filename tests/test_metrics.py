"""/metrics served by a real aiohttp server and parsed with prometheus-client's own parser."""

from __future__ import annotations

import asyncio

from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from daemon_helpers import beats_during
from prometheus_client.parser import text_string_to_metric_families

from subd.service.metrics import Metrics, metrics_handler

MS = 1_000_000


async def _scrape(metrics: Metrics) -> tuple[str, str]:
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(metrics))
    async with TestServer(app, host="127.0.0.1") as server:
        async with ClientSession() as session:
            async with session.get(server.make_url("/metrics")) as resp:
                assert resp.status == 200
                return resp.headers["Content-Type"], await resp.text()


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_endpoint_parses_and_carries_per_channel_figures():
    metrics = Metrics()
    metrics.model_loaded.set(1)
    a = metrics.channel("studio", stages=("recognise", "tag"))
    b = metrics.channel("hall")
    a.published(due_ns=100 * MS, sent_ns=100 * MS + 300_000)  # 0.3 ms late: fine
    a.published(due_ns=133 * MS, sent_ns=133 * MS + 4 * MS, fallback=True,
                missed=True)  # the scheduler's tolerance said so
    a.published(due_ns=166 * MS, sent_ns=166 * MS - 2 * MS, degraded=True)  # early
    b.published(due_ns=0, sent_ns=200_000)
    a.stage_duration("recognise", 180 * MS)
    a.stage_duration("tag", 3 * MS)
    a.committed_words([1200 * MS, 800 * MS])
    a.sse_clients.set(3)
    a.sse_drops.inc()
    a.real_time_factor.set(0.42)
    a.set_lag(25 * MS)
    b.set_source(False)
    b.set_source(False)  # still down: one failure, not two
    metrics.http_rejected.labels("unauthorized").inc()
    a.sync_stale_slots(2)
    a.sync_stale_slots(5)
    a.sync_stale_slots(5)

    content_type, text = asyncio.run(_scrape(metrics))
    assert content_type.startswith("text/plain")
    s = _samples(text)
    studio = (("channel", "studio"),)
    hall = (("channel", "hall"),)
    assert s[("subd_ticks_total", studio)] == 3
    assert s[("subd_ticks_total", hall)] == 1
    assert s[("subd_publish_error_seconds_count", studio)] == 3
    assert s[("subd_publish_error_seconds_bucket", studio + (("le", "0.0005"),))] == 1
    assert s[("subd_publish_error_seconds_bucket", studio + (("le", "0.005"),))] == 3
    assert s[("subd_deadline_misses_total", studio)] == 1
    assert s[("subd_publish_early_total", studio)] == 1
    assert s[("subd_fallbacks_total", studio)] == 1
    assert s[("subd_degraded_ticks_total", studio)] == 1
    assert s[("subd_stale_slots_total", studio)] == 5
    assert s[("subd_fallbacks_total", hall)] == 0
    recog = (("channel", "studio"), ("stage", "recognise"))
    assert s[("subd_stage_duration_seconds_count", recog)] == 1
    assert abs(s[("subd_stage_duration_seconds_sum", recog)] - 0.18) < 1e-9
    assert s[("subd_committed_word_latency_seconds_count", studio)] == 2
    assert s[("subd_sse_clients", studio)] == 3
    assert s[("subd_sse_drops_total", studio)] == 1
    assert s[("subd_real_time_factor", studio)] == 0.42
    assert s[("subd_lag_seconds", studio)] == 0.025
    assert s[("subd_source_up", hall)] == 0
    assert s[("subd_source_up", studio)] == 1
    assert s[("subd_source_failures_total", hall)] == 1
    assert s[("subd_model_loaded", ())] == 1
    assert s[("subd_http_rejected_total", (("reason", "unauthorized"),))] == 1


def test_a_scrape_renders_off_the_event_loop_while_the_loop_keeps_ticking():
    """Rendering 4 channels' series is ~10 ms of pure Python: on the event loop every scrape
    held the tick clock back that long. It renders in a thread of its own, and the loop's
    timers run meanwhile."""
    import threading
    import time

    class Slow(Metrics):
        def render(self) -> bytes:
            self.thread = threading.get_ident()
            time.sleep(0.2)  # a render that would hold the loop
            return super().render()

    metrics = Slow()
    metrics.channel("c0").published(due_ns=0, sent_ns=0)

    async def run() -> tuple[int, str]:
        (_, text), beats = await beats_during(_scrape(metrics))
        return beats, text

    beats, text = asyncio.run(run())
    assert metrics.thread != threading.get_ident()
    assert beats >= 5  # the loop ran its timers during the 200 ms render
    assert ("subd_ticks_total", (("channel", "c0"),)) in _samples(text)


def test_removed_channel_disappears_from_metrics():
    metrics = Metrics()
    metrics.channel("old", stages=("tag",)).published(due_ns=0, sent_ns=0)
    metrics.channel("kept").published(due_ns=0, sent_ns=0)
    metrics.remove_channel("old")
    text = metrics.render().decode()
    channels = {
        sample.labels.get("channel")
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert "old" not in channels
    assert "kept" in channels


def test_two_daemons_in_one_process_do_not_share_series():
    first, second = Metrics(), Metrics()
    first.channel("x").published(due_ns=0, sent_ns=0)
    s = _samples(second.render().decode())
    assert ("subd_ticks_total", (("channel", "x"),)) not in s


def test_ops_observer_feeds_metrics_and_health_but_not_the_watchdog(tmp_path):
    import socket

    from subd.service.health import HealthMonitor
    from subd.service.metrics import OpsObserver
    from subd.service.notify import Notifier
    from subd.types import CaptionState, Hypothesis, Word
    from subd.workers.hosts import RecogniseResult

    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    notifier = Notifier(env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "10000000"})
    metrics = Metrics()
    health = HealthMonitor(now_ns=lambda: 0)
    health.set_model_loaded()
    t0_ns = 5_000 * MS
    obs = OpsObserver(metrics.channel("studio"), health, notifier,
                      audio_to_mono_ns=lambda audio_ns: t0_ns + audio_ns)
    word = Word("hello", start_ns=100 * MS, end_ns=400 * MS)
    # 1 s of audio recognised in 250 ms, committed 900 ms after the word ended.
    result = RecogniseResult(Hypothesis((word,), (), 1000 * MS), accepted_sample=16_000,
                             duration_ns=250 * MS)
    obs.on_hypothesis(result, now_ns=t0_ns + 1300 * MS)
    for k in range(3):
        due = t0_ns + (k + 1) * 33 * MS
        obs.on_publish(CaptionState(k=k, due_ns=due, audio_end_ns=0, fallback=k == 2), due)
    s = _samples(metrics.render().decode())
    studio = (("channel", "studio"),)
    assert s[("subd_real_time_factor", studio)] == 0.25
    assert abs(s[("subd_committed_word_latency_seconds_sum", studio)] - 0.9) < 1e-9
    assert s[("subd_ticks_total", studio)] == 3
    assert s[("subd_fallbacks_total", studio)] == 1
    assert health.channel("studio", now_ns=t0_ns + 100 * MS).last_tick_k == 2
    # ticks do not feed the watchdog: the daemon's liveness check does (a channel idle by
    # design publishes no tick and must not get the daemon killed)
    sock.setblocking(False)
    try:
        extra = sock.recv(64)
    except BlockingIOError:
        extra = b""
    assert extra == b""
    notifier.close()
    sock.close()
