"""A failing channel is restarted with backoff or marked failed; the others keep running."""

from __future__ import annotations

import asyncio

from subd.service.health import HealthMonitor
from subd.service.supervisor import (
    FAILED,
    RESTARTING,
    RUNNING,
    STOPPED,
    Channel,
    ChannelSupervisor,
    RestartPolicy,
)

S = 1_000_000_000


class FakeClock:
    def __init__(self) -> None:
        self.t_ns = 0
        self.sleeps_ns: list[int] = []

    def now_ns(self) -> int:
        return self.t_ns

    async def sleep_until(self, deadline_ns: int, *, precise: bool = True) -> int:
        self.sleeps_ns.append(deadline_ns - self.t_ns)
        self.t_ns = max(self.t_ns, deadline_ns)
        await asyncio.sleep(0)
        return self.t_ns


class Ticking:
    """A healthy channel: ticks until asked to stop, then drains and returns."""

    def __init__(self, name: str, clock: FakeClock, health: HealthMonitor) -> None:
        self.name, self.clock, self.health = name, clock, health
        self.ticks = 0
        self._stop = asyncio.Event()
        self.drained = False

    async def run(self) -> None:
        while not self._stop.is_set():
            self.ticks += 1
            self.health.tick(self.name, self.ticks, self.clock.t_ns)
            await asyncio.sleep(0)
        self.drained = True

    def request_stop(self) -> None:
        self._stop.set()

    def status(self):
        return {"ticks": self.ticks}


class Broken:
    """A channel whose source keeps failing (the file vanished)."""

    def __init__(self, name: str, fail_times: int | None = None) -> None:
        self.name = name
        self.runs = 0
        self.fail_times = fail_times
        self.cancelled = False

    async def run(self) -> None:
        self.runs += 1
        if self.fail_times is None or self.runs <= self.fail_times:
            async with asyncio.TaskGroup() as tg:  # its own task set: one task fails
                tg.create_task(self._ingest())
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def _ingest(self) -> None:
        raise FileNotFoundError(f"/srv/{self.name}.wav: no such file")

    def status(self):
        return {"runs": self.runs}


def _hooks(health: HealthMonitor, seen: list):
    def on_state(name: str, state: str, detail: str) -> None:
        seen.append((name, state))
        health.set_state(name, state, detail)

    return on_state


async def _until(predicate, limit: int = 10_000) -> None:
    for _ in range(limit):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


def test_failing_channel_gives_up_while_the_other_keeps_ticking():
    clock = FakeClock()
    health = HealthMonitor(now_ns=clock.now_ns)
    health.set_model_loaded()
    policy = RestartPolicy(initial_backoff_ns=S // 2, max_backoff_ns=4 * S, max_failures=5,
                           window_ns=300 * S)
    seen: list = []

    async def main():
        sup = ChannelSupervisor(policy, clock, on_state=_hooks(health, seen))
        good = Ticking("studio", clock, health)
        bad = Broken("hall")
        assert isinstance(good, Channel) and isinstance(bad, Channel)
        sup.start(good)
        sup.start(bad)
        await _until(lambda: sup.states()["hall"].state == FAILED)
        ticks_at_failure = good.ticks
        await _until(lambda: good.ticks > ticks_at_failure + 100)
        states = sup.states()
        assert states["studio"].state == RUNNING
        assert states["hall"].restarts == 4
        assert "FileNotFoundError: /srv/hall.wav: no such file" in states["hall"].last_error
        assert states["hall"].detail == {"runs": 5}
        report = health.report(now_ns=clock.t_ns)
        assert report.status == "fail"
        assert report.channels["studio"].ok
        assert not report.channels["hall"].ok
        assert "channel failed" in report.channels["hall"].problems[0]
        assert await sup.stop_all(timeout_s=1.0)
        assert good.drained

    asyncio.run(main())
    assert clock.sleeps_ns == [S // 2, S, 2 * S, 4 * S]  # doubling backoff, capped at 4 s
    assert seen.count(("hall", RESTARTING)) == 4
    assert ("hall", FAILED) in seen


def test_channel_that_recovers_runs_on_after_restarts():
    clock = FakeClock()
    health = HealthMonitor(now_ns=clock.now_ns)

    async def main():
        sup = ChannelSupervisor(RestartPolicy(), clock, on_state=_hooks(health, []))
        flaky = Broken("flaky", fail_times=2)
        sup.start(flaky)
        await _until(lambda: flaky.runs == 3)
        await asyncio.sleep(0)
        assert sup.states()["flaky"].state == RUNNING
        assert sup.states()["flaky"].restarts == 2
        assert await sup.stop_all(timeout_s=1.0)  # no request_stop: cancelled
        assert flaky.cancelled  # cancellation reached the channel, not swallowed

    asyncio.run(main())


def test_finished_channel_is_not_restarted():
    class Finite:
        name = "file"
        runs = 0

        async def run(self) -> None:
            self.runs += 1

        def status(self):
            return {}

    async def main():
        sup = ChannelSupervisor(clock=FakeClock())
        ch = Finite()
        await sup.start(ch)
        assert sup.states()["file"].state == STOPPED
        assert ch.runs == 1

    asyncio.run(main())


def test_stopping_one_channel_leaves_the_others():
    clock = FakeClock()
    health = HealthMonitor(now_ns=clock.now_ns)

    async def main():
        sup = ChannelSupervisor(clock=clock)
        a, b = Ticking("a", clock, health), Ticking("b", clock, health)
        sup.start(a)
        sup.start(b)
        await _until(lambda: a.ticks > 10 and b.ticks > 10)
        assert await sup.stop("a", timeout_s=1.0)
        assert a.drained and sup.names() == ("b",)
        before = b.ticks
        await _until(lambda: b.ticks > before + 10)
        await sup.stop_all(timeout_s=1.0)

    asyncio.run(main())


def test_a_new_channel_is_not_failed_before_its_first_tick_is_due():
    """A channel's first tick comes D after its audio: with D = 4 s, /healthz said "no tick
    published since start" (503) from 2 s on, until that tick."""
    from subd.service.health import HealthLimits

    clock = FakeClock()
    health = HealthMonitor(HealthLimits(stall_after_ns=2 * S), now_ns=clock.now_ns)
    health.set_model_loaded()
    health.add_channel("slow", latency_ns=4 * S)
    health.add_channel("quick", latency_ns=S // 2)
    clock.t_ns += 3 * S
    assert health.channel("slow").problems == ()
    assert health.channel("quick").problems == ("no tick published since start",)
    clock.t_ns += 3 * S + 1
    assert health.channel("slow").problems == ("no tick published since start",)


def test_a_reload_that_changes_d_moves_the_first_tick_grace_with_it(tmp_path):
    """A reload changes a running channel's D in place (it is not restarted), and its first tick
    is then due the new D after its audio. /healthz kept the old D's grace: a push channel
    reloaded from D = 0.5 s to 30 s before its first audio read "no tick published since start"
    (503) 2.5 s after it started. A real daemon, with the scripted recogniser (no model)."""
    import signal
    import time

    from daemon_helpers import (
        START_LIMIT_S,
        free_port,
        healthz,
        scripted_push_config,
        start_daemon,
        wait_for,
    )

    port = free_port()
    config = scripted_push_config(port, latency_ms=500, quiet_after_ms=100,
                                  tick={"max_latency_ms": 30000})
    daemon = start_daemon(tmp_path, config, port)
    try:
        def main() -> dict:
            return healthz(port)[1]["channels"]["main"]

        wait_for(main, START_LIMIT_S, "the channel", daemon.proc, daemon.log)
        added_by = time.monotonic()
        # its source is checked once the daemon is ready: the pipeline is built, so a reload
        # changes its D in place
        wait_for(lambda: main()["source"] == "down", 30, "no audio", daemon.proc, daemon.log)
        daemon.config.write_text(config.replace("\nlatency_ms = 500", "\nlatency_ms = 30000"))
        daemon.signal(signal.SIGHUP)
        wait_for(lambda: "configuration reloaded" in daemon.log_text(), 30, "the reload",
                 daemon.proc, daemon.log)
        assert "restarts" not in daemon.log_text()
        time.sleep(max(0.0, added_by + 3.0 - time.monotonic()))  # past the old D's grace
        status, body = healthz(port)
        assert "no tick published since start" not in body["channels"]["main"]["problems"]
        assert status == 200, body
    finally:
        daemon.stop()


def test_healthz_reports_sources_stalls_and_the_model_over_http():
    from aiohttp import ClientSession, web
    from aiohttp.test_utils import TestServer

    from subd.service.health import HealthLimits, health_handler

    clock = FakeClock()
    health = HealthMonitor(HealthLimits(stall_after_ns=S, max_lag_ns=5 * S), now_ns=clock.now_ns)
    app = web.Application()
    app.router.add_get("/healthz", health_handler(health))
    app.router.add_get("/c/studio/healthz", health_handler(health, "studio"))
    app.router.add_get("/c/hall/healthz", health_handler(health, "hall"))

    async def get(session, server, path):
        async with session.get(server.make_url(path)) as resp:
            return resp.status, await resp.json()

    async def main():
        async with TestServer(app, host="127.0.0.1") as server, ClientSession() as session:
            health.add_channel("studio")
            health.add_channel("hall")
            status, body = await get(session, server, "/healthz")
            assert (status, body["status"]) == (503, "fail")
            assert "model not loaded" in body["problems"]
            health.set_model_loaded()
            for k in range(3):
                clock.t_ns += S // 30
                health.tick("studio", k)
                health.tick("hall", k)
            health.set_source("studio", True)
            health.set_source("hall", False, "pusher disconnected")
            status, body = await get(session, server, "/healthz")
            assert (status, body["status"]) == (200, "degraded")
            assert body["channels"]["hall"]["source"] == "down"
            assert body["problems"] == ["hall: source down (pusher disconnected)"]
            assert (await get(session, server, "/c/studio/healthz"))[0] == 200
            status, body = await get(session, server, "/c/hall/healthz")
            assert (status, body["source_detail"]) == (503, "pusher disconnected")
            health.set_source("hall", True)
            health.set_lag("studio", 6 * S)
            status, body = await get(session, server, "/healthz")
            assert status == 503 and body["problems"] == ["studio: lag 6000 ms over bound 5000 ms"]
            health.set_lag("studio", 0)
            clock.t_ns += 2 * S  # the clock stalls: no tick for 2 s
            status, body = await get(session, server, "/healthz")
            assert status == 503
            assert body["channels"]["studio"]["problems"][0].startswith("ticks stalled")

    asyncio.run(main())


def test_a_file_channel_decodes_its_file_off_the_event_loop(tmp_path, monkeypatch):
    """A file is decoded whole when its channel starts: a 10-minute MP3 added by a reload took
    ~300 ms, through ffmpeg, on the event loop, and every other channel's ticks waited (265 of
    3400 over 1 ms late). It decodes in a thread; the loop's timers run meanwhile."""
    import threading
    import time

    import numpy as np
    import soundfile as sf
    from daemon_helpers import beats_during

    import subd.service.channel as channel_mod
    from subd.clock import MonotonicClock
    from subd.config import config_from_dict
    from subd.service.context import ChannelContext
    from subd.service.health import HealthMonitor
    from subd.service.metrics import Metrics
    from subd.service.notify import Notifier

    wav = tmp_path / "a.wav"
    sf.write(wav, np.zeros(16_000, np.float32), 16_000)
    cfg = config_from_dict({"channels": {"slow": {"source": {"kind": "file",
                                                             "path": str(wav)}}}})
    built_in = []
    real = channel_mod.build_source

    def slow_build(*args, **kwargs):
        built_in.append(threading.get_ident())
        time.sleep(0.2)  # as a long file would take
        return real(*args, **kwargs)

    monkeypatch.setattr(channel_mod, "build_source", slow_build)
    context = ChannelContext(config=cfg, clock=MonotonicClock(), metrics=Metrics(),
                             health=HealthMonitor(), notifier=Notifier(env={}), push_token=None,
                             recogniser=None, tagger=None, tagger_spec=None, layout_spec=None,
                             recogniser_spec=None)
    channel = channel_mod.DaemonChannel(context, cfg.channel_specs()[0])
    source, beats = asyncio.run(beats_during(channel._build_source()))
    assert beats >= 5 and built_in and built_in[0] != threading.get_ident()
    assert source.inner.audio.shape == (16_000,)
