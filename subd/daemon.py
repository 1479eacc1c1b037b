"""The daemon: configuration -> channels (source, pipeline, sinks), one shared model, the HTTP
server, health, metrics and the service manager.

Order matters for timing: worker processes are spawned (and load the model) *before* the
publisher asks for SCHED_FIFO, so they never inherit real-time priority; each channel's clock
t0 is set only when everything is ready, so the first tick is not eaten by start-up.

Several channels share ONE recogniser worker process (one model in memory, one recogniser state
per channel; requests are served one at a time, first come first served) and one tagger
process. Each channel runs under :class:`~subd.channels.ChannelSupervisor`, so a failing channel
is restarted or given up on while the others keep their clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import importlib.resources
import importlib.util
import logging
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from subd.channels import FAILED, RUNNING, ChannelSupervisor, SharedWorker
from subd.clock import Clock, MonotonicClock, request_realtime_priority
from subd.config import ChannelSpec, Config
from subd.errors import AudioInputError, ConfigError, ModelError
from subd.events_log import EventsLog
from subd.health import HealthMonitor
from subd.metrics import Metrics
from subd.notify import Notifier
from subd.scheduler import Observer, Pipeline, Source
from subd.stages import FactorySpec, resolve_tagger
from subd.tickstats import Counters
from subd.worker import InlineWorker, ProcessWorker

log = logging.getLogger("subd.daemon")

DEMO_CLIP = ("data", "demo.wav")
HOUSEKEEPING_S = 1.0
STATUS_EVERY_S = 5.0
WORKER_CLOSE_S = 1.0  # after a drain the workers have nothing left to do: do not wait long
DRAIN_BUDGET_S = 3.0  # SIGTERM: the pipelines' own drain, before it is cut short


def recognizer_spec(model: str, factory: str = "", **opts: Any) -> FactorySpec:
    """The streaming recogniser, imported in the worker process: subd.streaming's over the
    process's shared engine by default, or any ``module:callable`` taking no arguments
    (``[recognizer] factory``)."""
    if factory:
        return FactorySpec(factory)
    if importlib.util.find_spec("subd.streaming") is None:
        raise ModelError("the streaming recogniser (subd/streaming.py) is not installed")
    return FactorySpec("subd.channels:shared_streaming_recognizer", {"model": model, **opts})


def demo_clip_path() -> Path:
    ref = importlib.resources.files("subd").joinpath(*DEMO_CLIP)
    if not ref.is_file():
        raise AudioInputError("the bundled demo clip subd/data/demo.wav is missing")
    return Path(str(ref))


def build_source(config: Config, *, seed: int = 0, spec: ChannelSpec | None = None,
                 token: str | None = None) -> Source:
    from fractions import Fraction

    from subd.sources import FileSource, MicSource, PcmStreamSource, QueueSource

    src = (spec or config.channel_specs()[0]).source
    kind = src.kind
    if kind == "auto":
        kind = "mic" if src.device else "file"
    if kind == "file":
        path = Path(src.path) if src.path else demo_clip_path()
        return FileSource.from_path(path, speed=Fraction(str(src.speed)),
                                    jitter_ms=src.jitter_ms, chunk_ms=src.chunk_ms,
                                    loops=1_000_000 if src.loop else 1, seed=seed)
    if kind == "stdin":
        return PcmStreamSource(fmt=src.pcm_format, chunk_ms=src.chunk_ms)
    if kind == "mic":
        return MicSource(src.device, src.chunk_ms)
    if not (token or config.server.push_token):
        raise ConfigError("[server] push_token: the HTTP audio source needs a bearer token "
                          "(or SUBD_PUSH_TOKEN in the environment)")
    return QueueSource("http push")


def build_sink(name: str, options: dict[str, Any]) -> Any:
    from subd.sinks import load_sink_factory

    factory = load_sink_factory(name)
    from_mapping = getattr(factory, "from_mapping", None)
    return from_mapping(options) if from_mapping else factory(**options)


def sink_options(config: Config, name: str, spec: ChannelSpec | None = None) -> dict[str, Any]:
    if spec is None:
        opts = dict(config.extra.get("sink_options", {}).get(name, {}))
        latency_ms = config.tick.latency_ms
    else:
        opts = dict(spec.sink_options.get(name, {}))
        latency_ms = spec.tick.latency_ms
    if name == "sse":
        opts.setdefault("host", "")  # mounted on the daemon's own server
        opts.setdefault("latency_ms", latency_ms)
    return opts


def build_layout(spec: str) -> Any | None:
    """``[pipeline] layout``: "none" or a "module:factory" building an object with apply()."""
    return None if spec in ("", "none") else FactorySpec(spec).build()


class GuardedSource:
    """A channel's source as its pipeline sees it. Ingest ends when the channel is asked to
    stop (drain). With ``path`` (a looping file) the file is read again at every pass: when it
    has vanished the channel reports its source down and gets paced silence, a second at a
    time, until the file is back, so its clock runs on and the audio timeline stays whole."""

    def __init__(self, inner: Any, stop: asyncio.Event, report: Any,
                 path: Path | None = None) -> None:
        self.inner = inner
        self.stop = stop
        self.report = report  # report(up: bool, detail: str)
        self.path = path
        self.live = inner.live
        self.pullable = inner.pullable
        self.speed = getattr(inner, "speed", None)
        self.t0_ns = 0
        self._clock: Clock | None = None

    async def start(self, clock: Clock) -> int:
        self._clock = clock
        self.t0_ns = await self.inner.start(clock)
        return self.t0_ns

    async def chunks(self) -> Any:
        from subd.types import AudioChunk

        source, offset = self.inner, 0
        while True:
            end = offset
            async for chunk in source.chunks():
                if self.stop.is_set():
                    return
                end = offset + chunk.start_sample + chunk.n_samples
                yield chunk if not offset else AudioChunk(chunk.start_sample + offset,
                                                          chunk.samples)
            if self.path is None or self.stop.is_set():
                return
            offset = end
            source = await self._next_pass(offset)

    async def _next_pass(self, offset: int) -> Any:
        import numpy as np

        from subd.sources import NS_PER_S, FileSource, load_audio
        from subd.types import SAMPLE_RATE_HZ

        inner = self.inner
        try:
            audio = await asyncio.get_running_loop().run_in_executor(None, load_audio,
                                                                     self.path)
            self.report(True, "")
        except AudioInputError as exc:
            self.report(False, f"file vanished or unreadable: {exc}")
            audio = np.zeros(SAMPLE_RATE_HZ, dtype=np.float32)
        source = FileSource(audio, speed=inner.speed, jitter_ms=inner.jitter_ns // 1_000_000,
                            chunk_ms=inner.chunk_samples * 1000 // SAMPLE_RATE_HZ,
                            name=inner.name)
        await source.start(self._clock)
        speed = inner.speed
        source.t0_ns = self.t0_ns + offset * NS_PER_S * speed.denominator // (
            SAMPLE_RATE_HZ * speed.numerator)
        return source


@dataclass
class ReloadPlan:
    """What a reload will change on one channel, built (and checked) before anything changes."""

    spec: ChannelSpec
    sinks: dict[str, tuple[Any, dict[str, Any]]] = field(default_factory=dict)  # name -> new
    events_path: str | None = None

    async def discard(self) -> None:
        self.sinks.clear()  # built, never started: nothing to close


class DaemonChannel:
    """One channel's life: source -> pipeline -> sinks, run (and re-run) by the supervisor."""

    def __init__(self, daemon: Daemon, spec: ChannelSpec, *, source: Source | None = None,
                 sinks: list[Any] | None = None, events_path: str | None = None,
                 observer: Observer | None = None) -> None:
        self.daemon = daemon
        self.spec = spec
        self.name = spec.name
        self._given_source = source
        self._given_sinks = sinks
        self._events_path = events_path
        self.inner_observer = observer
        self.metrics = daemon.metrics.channel(spec.name)
        self.sinks: dict[str, Any] = {}
        self._sink_opts: dict[str, dict[str, Any]] = {}
        self.source: GuardedSource | None = None
        self.pipeline: Pipeline | None = None
        self.events: EventsLog | None = None
        self.counters: Counters | None = None
        self.push_handler: Any = None
        self.stopping = False
        self.aborted = False
        self.lag_ns = 0
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()  # set once its sinks are up (or its start failed)
        self._task: asyncio.Task | None = None
        self._source_state: tuple[bool, str] | None = None
        self._started_ns = time.monotonic_ns()
        self._stage_seen: dict[str, int] = {}
        self._sse_dropped = 0

    # -- what the daemon and the HTTP routes read --------------------------------------------

    @property
    def sse(self) -> Any:
        return next((s for s in self.sinks.values() if hasattr(s, "handle_events")), None)

    @property
    def n_sse_clients(self) -> int:
        return sum(getattr(s, "n_clients", 0) for s in self.sinks.values())

    @property
    def deadline_misses(self) -> int:
        return self.pipeline.counters.deadline_misses if self.pipeline is not None else 0

    def status(self) -> dict[str, Any]:
        p = self.pipeline
        return {"ticks": p.counters.ticks if p else 0, "lag_ms": self.lag_ns / 1e6}

    def report_source(self, up: bool, detail: str = "") -> None:
        if self._source_state == (up, detail):
            return
        was = self._source_state
        self._source_state = (up, detail)
        self.daemon.health.set_source(self.name, up, detail)
        self.metrics.set_source(up)
        if not up:
            log.warning("channel %s: source down: %s", self.name, detail)
        elif was is not None and not was[0]:
            log.info("channel %s: source is back", self.name)

    # -- life --------------------------------------------------------------------------------

    def request_stop(self) -> None:
        self.stopping = True
        self._stop.set()
        end = getattr(self.source.inner if self.source else None, "end", None)
        if end is not None:
            end()  # a queue source (push, microphone) ends its stream: the pipeline drains

    def abort(self) -> None:
        """Cut the drain short: the pipeline stops now; sinks still finalise their files."""
        self.aborted = True
        if self._task is not None:
            self._task.cancel()

    async def run(self) -> None:
        while not self.stopping:
            try:
                await self._run_once()
            finally:
                self.ready.set()
            if self._given_source is not None or self.spec.source.kind != "http":
                return  # an HTTP push stream that ended: wait for the next one

    def _build_source(self) -> GuardedSource:
        from subd.sources import FileSource

        d, src = self.daemon, self.spec.source
        if self._given_source is not None:
            return GuardedSource(self._given_source, self._stop, self.report_source)
        try:
            inner = build_source(d.config, spec=self.spec, token=d.push_token)
        except AudioInputError as exc:
            self.report_source(False, str(exc))
            raise
        path = None
        if isinstance(inner, FileSource) and src.path and src.loop:
            inner.loops, path = 1, Path(src.path)  # read again at every pass (vanished?)
        if not inner.live:
            self.report_source(True, "")
        return GuardedSource(inner, self._stop, self.report_source, path)

    async def _run_once(self) -> None:
        from fractions import Fraction

        from subd.metrics import OpsObserver
        from subd.ring import AudioHistory
        from subd.scheduler import TickSettings
        from subd.sources import QueueSource, make_push_handler
        from subd.stages import TagHost
        from subd.types import SAMPLE_RATE_HZ
        from subd.worker import InlineWorker

        d, spec, cfg = self.daemon, self.spec, self.daemon.config
        self.aborted = False
        self._started_ns = time.monotonic_ns()
        self.source = source = self._build_source()
        if isinstance(source.inner, QueueSource) and not hasattr(source.inner, "open"):
            self.push_handler = make_push_handler(source.inner, fmt=spec.source.pcm_format)
        async with AsyncExitStack() as stack:
            stack.callback(setattr, self, "push_handler", None)
            history = AudioHistory(cfg.recognizer.history_s * SAMPLE_RATE_HZ,
                                   shared=cfg.recognizer.process)
            stack.callback(history.close)
            rec = await d.recogniser.attach(self.name, d.recogniser_host(history))
            stack.push_async_callback(d.recogniser.detach, self.name)
            if d.tagger is not None:
                tag = await d.tagger.attach(self.name, FactorySpec(
                    "subd.stages:TagHost", {"tagger": d.tagger_spec}))
                stack.push_async_callback(d.tagger.detach, self.name)
            else:
                tag = InlineWorker("tag", TagHost(d.tagger_spec), d.clock)
            if hasattr(source.inner, "open"):
                source.inner.open()  # a microphone
                stack.callback(source.inner.close)
            stack.push_async_callback(self._close_outputs)
            await self._start_sinks()
            self.ready.set()
            events_path = self._events_path if self._given_source else spec.events.path
            self.events = EventsLog(events_path) if events_path else None
            speed = source.speed
            tick = spec.tick
            settings = TickSettings(
                fps=tick.fps, latency_ms=tick.latency_ms, lookahead_ms=tick.lookahead_ms,
                rate=speed if isinstance(speed, Fraction) else Fraction(1),
                min_update_ms=cfg.recognizer.min_update_ms,
                miss_tolerance_ms=tick.miss_tolerance_ms,
                drain_timeout_s=cfg.pipeline.drain_timeout_s,
                max_latency_ms=tick.max_latency_ms)
            observer = OpsObserver(self.metrics, d.health, d.notifier,
                                   audio_to_mono_ns=self._audio_to_mono_ns,
                                   inner=self.inner_observer)
            self.pipeline = Pipeline(clock=d.clock, settings=settings, source=source,
                                     recogniser=rec, tagger=tag, history=history,
                                     sinks=list(self.sinks.values()), events=self.events,
                                     observer=observer, layout=build_layout(d.layout_spec))
            self._task = asyncio.create_task(self.pipeline.run(), name=f"pipeline:{self.name}")
            try:
                self.counters = await self._task
            except asyncio.CancelledError:
                if not self.aborted or asyncio.current_task().cancelling():
                    raise
                self.counters = self.pipeline.counters
                log.warning("channel %s: drain cut short; the files hold what was published",
                            self.name)
            except AudioInputError as exc:
                if self.stopping:
                    return  # a stream that ended before its first audio: nothing to drain
                self.report_source(False, str(exc))
                raise
        c = self.counters
        log.info("channel %s: published %d ticks: %d deadline misses, %d fallbacks, "
                 "%d stale slots, %d degraded", self.name, c.ticks, c.deadline_misses,
                 c.fallbacks, c.stale_slots, c.degraded_ticks)

    def _audio_to_mono_ns(self, audio_ns: int) -> int:
        grid = self.pipeline.grid
        return grid.t0_ns + int(audio_ns / grid.rate)

    async def _start_sinks(self) -> None:
        if self._given_source is not None:
            given = self._given_sinks or []
            self.sinks = {f"{getattr(s, 'name', 'sink')}#{i}": s for i, s in enumerate(given)}
        else:
            cfg = self.daemon.config
            self._sink_opts = {n: sink_options(cfg, n, self.spec)
                               for n in self.spec.sinks.enabled}
            self.sinks = {n: build_sink(n, o) for n, o in self._sink_opts.items()}
        for sink in self.sinks.values():
            await sink.start()

    async def _close_outputs(self) -> None:
        sinks, self.sinks = list(self.sinks.values()), {}
        for sink in sinks:
            try:
                await sink.close()
            except Exception:  # noqa: BLE001 - the other sinks still close
                log.exception("channel %s: closing sink %s failed", self.name,
                              getattr(sink, "name", sink))
        if self.events is not None:
            self.events.close()
            self.events = None

    # -- housekeeping (once a second) --------------------------------------------------------

    def housekeeping(self) -> None:
        self._check_live_source()
        p = self.pipeline
        if p is None or p.grid is None or p.ring is None:
            return
        m, health = self.metrics, self.daemon.health
        m.sync_stale_slots(p.ring.stale_count)
        self.lag_ns = max(0, p.ingested_until_ns - p.recognised_until_ns)
        m.set_lag(self.lag_ns)
        health.set_lag(self.name, self.lag_ns)
        m.sse_clients.set(self.n_sse_clients)
        dropped = sum(getattr(s, "n_dropped", 0) for s in self.sinks.values())
        if dropped > self._sse_dropped:
            m.sse_drops.inc(dropped - self._sse_dropped)
        self._sse_dropped = dropped
        for stage, durations in p.counters.stage.items():
            if stage == "recognise":
                continue  # recorded per result by the observer
            seen = self._stage_seen.get(stage, 0)
            new = durations.values()[-min(durations.count - seen, 256):] \
                if durations.count > seen else ()
            for ns in new:
                m.stage_duration(stage, int(ns))
            self._stage_seen[stage] = durations.count

    def _check_live_source(self) -> None:
        inner = self.source.inner if self.source is not None else None
        last = getattr(inner, "last_push_ns", -1)
        if last == -1 or self.stopping:
            return  # not a queue source (push, microphone)
        quiet_ns = self.spec.source.quiet_after_ms * 1_000_000
        now = time.monotonic_ns()
        if last is None:
            if now - self._started_ns > quiet_ns:
                self.report_source(False, "no audio received yet")
        elif now - last > quiet_ns:
            self.report_source(False, f"no audio for {(now - last) / 1e9:.0f} s "
                                      f"(pusher or device gone)")
        else:
            self.report_source(True, "")

    # -- reload -------------------------------------------------------------------------------

    def needs_restart(self, spec: ChannelSpec) -> bool:
        """A new source or tick rate cannot be switched to on a running pipeline."""
        same_tick = dataclasses.replace(self.spec.tick, latency_ms=0) == \
            dataclasses.replace(spec.tick, latency_ms=0)
        return self.pipeline is None or not same_tick or self.spec.source != spec.source

    async def prepare(self, spec: ChannelSpec) -> ReloadPlan:
        tick = spec.tick
        if not tick.lookahead_ms < tick.latency_ms <= self.spec.tick.max_latency_ms:
            raise ConfigError(f"[channels.{self.name}.tick] latency_ms = {tick.latency_ms}: "
                              f"must be in {tick.lookahead_ms + 1}.."
                              f"{self.spec.tick.max_latency_ms} (max_latency_ms at start)")
        plan = ReloadPlan(spec)
        cfg = self.daemon.config
        for name in spec.sinks.enabled:
            opts = sink_options(cfg, name, spec)
            old = self._sink_opts.get(name)
            if "latency_ms" in opts and old is not None:
                old = {**old, "latency_ms": opts["latency_ms"]}  # SSE: patched in place
            if name in self.sinks and old == opts:
                continue  # unchanged
            plan.sinks[name] = (build_sink(name, opts), opts)  # checks the options
        if spec.events.path != self.spec.events.path:
            plan.events_path = spec.events.path
        return plan

    async def commit(self, plan: ReloadPlan, layout: Any | None) -> None:
        p, spec = self.pipeline, plan.spec
        if spec.tick.latency_ms != p.settings.latency_ms:
            for attempt in range(20):
                try:
                    p.set_latency(spec.tick.latency_ms)
                    break
                except RuntimeError:
                    if attempt == 19:
                        raise
                    await asyncio.sleep(0.05)
        sse = self.sse
        if sse is not None and hasattr(sse.config, "latency_ms"):
            sse.config = dataclasses.replace(sse.config, latency_ms=spec.tick.latency_ms)
        old = {n: s for n, s in self.sinks.items()
               if n not in spec.sinks.enabled or n in plan.sinks}
        sinks = {n: self.sinks[n] if n not in plan.sinks else plan.sinks[n][0]
                 for n in spec.sinks.enabled}
        self.sinks, p.sinks[:] = sinks, list(sinks.values())  # one step: no tick is missed
        for name, (_, opts) in plan.sinks.items():
            self._sink_opts[name] = opts
        for sink in old.values():  # finalise the old files before the new sinks adopt them
            await sink.close()
        for name in plan.sinks:
            try:
                await sinks[name].start()
            except Exception:  # noqa: BLE001 - cannot roll back now; the others run on
                log.exception("reload: channel %s: sink %s did not start", self.name, name)
        plan.sinks.clear()
        if plan.events_path is not None:
            self._swap_events(plan.events_path)
        p.layout = layout
        self.spec = spec

    def _swap_events(self, path: str) -> None:
        from subd.ticks import fps_text

        p = self.pipeline
        new = EventsLog(path) if path else None
        if new is not None:
            g = p.grid
            new.write_start(g.t0_ns, fps_text(g.fps), g.latency_ns // 1_000_000,
                            g.lookahead_ns // 1_000_000)
        old, self.events, p.events = self.events, new, new
        if old is not None:
            old.close()


@dataclass
class Daemon:
    """``source``/``sinks``/``events_path`` given: one channel run to its end (``subd
    stream``, tests), errors propagate. Otherwise the channels of the configuration, each
    supervised (``supervise=True``: ``subd run``)."""

    config: Config
    source: Source | None = None
    sinks: list[Any] = field(default_factory=list)
    events_path: str | None = None
    recognizer: FactorySpec | None = None
    observer: Observer | None = None
    clock: Clock = field(default_factory=MonotonicClock)
    serve: tuple[str, int] | None = None  # our own HTTP server (SSE, push, health, metrics)
    notifier: Notifier | None = None
    metrics: Metrics | None = None
    health: HealthMonitor | None = None
    log_filter: Any | None = None  # subd.logs.RepeatFilter: flushed by the housekeeping
    supervise: bool = False
    push_token: str | None = None
    bound_port: int | None = None
    channels: dict[str, DaemonChannel] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.notifier = self.notifier or Notifier(env={})
        self.metrics = self.metrics or Metrics()
        self.health = self.health or HealthMonitor()
        self.supervisor = ChannelSupervisor(clock=self.clock, on_state=self._on_state)
        self._tasks: dict[str, asyncio.Task] = {}
        self._stopping = False
        self._finished = asyncio.Event()
        self.recogniser: SharedWorker | None = None
        self.tagger: SharedWorker | None = None
        self.tagger_spec: FactorySpec | None = None
        self.layout_spec = self.config.pipeline.layout
        self.exit_code = 0

    @property
    def pipeline(self) -> Any:
        first = next(iter(self.channels.values()), None)
        return first.pipeline if first is not None else None

    # ---- workers (one model for every channel) --------------------------------------------

    def _recogniser_worker(self) -> Any:
        cfg = self.config.recognizer
        preload = None
        if self.recognizer is None and not cfg.factory:
            recognizer_spec(cfg.model)  # a clear error if the recogniser is not installed
            preload = FactorySpec("subd.channels:shared_engine", {"model": cfg.model})
        host = FactorySpec("subd.channels:MultiplexHost", {"preload": preload})
        if cfg.process:
            return ProcessWorker("recognise", host)
        return InlineWorker("recognise", host.build(), self.clock)

    def recogniser_host(self, history: Any) -> FactorySpec:
        cfg = self.config.recognizer
        spec = self.recognizer or recognizer_spec(cfg.model, cfg.factory)
        where = {"history_name": history.shm_name} if cfg.process else {"history": history}
        return FactorySpec("subd.stages:RecogniserHost",
                           {"recognizer": spec, "history_capacity": history.capacity, **where})

    async def _start_workers(self, stack: AsyncExitStack) -> None:
        cfg = self.config
        rec = self._recogniser_worker()
        self.tagger_spec = resolve_tagger(cfg.pipeline.tagger)
        workers = [rec]
        if self.tagger_spec is not None and cfg.pipeline.tag_process:
            check = FactorySpec("subd.stages:TagHost", {"tagger": self.tagger_spec})
            tag = ProcessWorker("tag", FactorySpec("subd.channels:MultiplexHost",
                                                   {"preload": check}))  # loads, or fails now
            workers.append(tag)
            self.tagger = SharedWorker(tag)
        for worker in workers:
            stack.push_async_callback(functools.partial(worker.close, WORKER_CLOSE_S))
        started = await asyncio.gather(*(w.start(cfg.recognizer.start_timeout_s)
                                         for w in workers), return_exceptions=True)
        for outcome in started:
            if isinstance(outcome, BaseException):
                raise outcome
        self.recogniser = SharedWorker(rec)
        self.metrics.model_loaded.set(1)
        self.health.set_model_loaded()

    # ---- channels ---------------------------------------------------------------------------

    def _on_state(self, name: str, state: str, detail: str) -> None:
        self.health.set_state(name, state, detail)
        if name in self.channels:
            cm = self.metrics.channel(name)
            cm.channel_up.set(1 if state == RUNNING else 0)
            if state == "restarting":
                cm.channel_restarts.inc()

    def _new_channel(self, spec: ChannelSpec) -> DaemonChannel:
        if self.source is not None:  # one given source: not rebuilt, not restarted
            return DaemonChannel(self, spec, source=self.source, sinks=self.sinks,
                                 events_path=self.events_path, observer=self.observer)
        return DaemonChannel(self, spec, observer=self.observer)

    def _start_channel(self, spec: ChannelSpec) -> None:
        ch = self.channels[spec.name] = self._new_channel(spec)
        self.health.add_channel(spec.name)
        self.metrics.channel(spec.name)
        if self.supervise:
            self._tasks[spec.name] = self.supervisor.start(ch)
        else:
            self._tasks[spec.name] = asyncio.create_task(ch.run(), name=f"channel:{spec.name}")

    async def _stop_channel(self, name: str) -> None:
        ch = self.channels.pop(name, None)
        if ch is None:
            return
        ch.request_stop()
        if self.supervise:
            await self.supervisor.stop(name, timeout_s=DRAIN_BUDGET_S)
        self._tasks.pop(name, None)
        self.health.remove_channel(name)
        self.metrics.remove_channel(name)

    # ---- life -------------------------------------------------------------------------------

    async def run(self) -> Counters:
        cfg = self.config
        try:
            async with AsyncExitStack() as stack:
                await self._start_workers(stack)
                specs = cfg.channel_specs()[:1] if self.source is not None \
                    else cfg.channel_specs()
                if self._stopping:  # SIGTERM while the model loaded
                    return Counters()
                for spec in specs:
                    self._start_channel(spec)
                await asyncio.wait([asyncio.ensure_future(ch.ready.wait())
                                    for ch in self.channels.values()])
                if self.serve is not None:  # every channel's sinks are up: serve them
                    from subd.http import serve_daemon

                    await serve_daemon(self, stack)
                if any(s.tick.realtime for s in specs):
                    request_realtime_priority()
                self.notifier.ready(self.status_line())
                housekeeping = asyncio.create_task(self._housekeeping(), name="housekeeping")
                stack.callback(housekeeping.cancel)
                gc.freeze()  # start-up objects leave the collector's view: shorter GC pauses
                await self._wait_channels()
        finally:
            self._finished.set()
            if self.log_filter is not None:
                self.log_filter.flush_all()
        first = next(iter(self.channels.values()), None)
        return first.counters if first is not None and first.counters else Counters()

    async def _wait_channels(self) -> None:
        while True:
            tasks = [t for t in self._tasks.values() if not t.done()]
            if not tasks:
                break
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in list(self._tasks.values()):
                if task.done() and not self.supervise and not task.cancelled() \
                        and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        if self.supervise and any(s.state == FAILED for s in self.supervisor.states().values()):
            self.exit_code = 1

    def request_stop(self) -> None:
        """Stop ingest on every channel; each drains, finalises its files and ends."""
        self._stopping = True
        for ch in self.channels.values():
            ch.request_stop()

    async def drain(self, budget_s: float = DRAIN_BUDGET_S) -> None:
        """SIGTERM: stop ingest, let the pipelines publish what they committed (up to
        ``budget_s``, then cut short), finalise every open cue to the files, close."""
        self.request_stop()
        tasks = [t for t in self._tasks.values() if not t.done()]
        # channels waiting to be restarted are cancelled; running ones drain
        stopper = asyncio.ensure_future(self.supervisor.stop_all(timeout_s=budget_s + 1.0))
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=budget_s)
            if pending:
                log.warning("drain budget of %.1f s spent: closing %d channels now",
                            budget_s, len(pending))
                for ch in self.channels.values():
                    ch.abort()
        await stopper
        await self._finished.wait()

    # ---- housekeeping -----------------------------------------------------------------------

    def status_line(self) -> str:
        lag_ms = max((ch.lag_ns for ch in self.channels.values()), default=0) / 1e6
        clients = sum(ch.n_sse_clients for ch in self.channels.values())
        misses = sum(ch.deadline_misses for ch in self.channels.values())
        return (f"{len(self.channels)} channels, lag {lag_ms:.0f} ms, {clients} SSE clients, "
                f"{misses} misses")

    async def _housekeeping(self) -> None:
        last_status = time.monotonic()
        while True:
            await asyncio.sleep(HOUSEKEEPING_S)
            if self.log_filter is not None:
                self.log_filter.flush()
            for ch in list(self.channels.values()):
                try:
                    ch.housekeeping()
                except Exception:  # noqa: BLE001 - reporting must never stop a channel
                    log.exception("housekeeping of channel %s failed", ch.name)
            if time.monotonic() - last_status >= STATUS_EVERY_S:
                last_status = time.monotonic()
                self.notifier.status(self.status_line())

    # ---- reload -----------------------------------------------------------------------------

    async def apply_config(self, new: Config) -> None:
        """SIGHUP: switch to ``new`` without dropping the channels that stay. Latency, sinks,
        layout and events logs change in place; a channel whose source or tick rate changed is
        restarted; added and removed channels start and stop. Everything is checked before
        anything changes: on an error the old configuration stays in force."""
        old = self.config
        for section in ("server", "recognizer"):
            if getattr(old, section) != getattr(new, section):
                log.warning("[%s] changed: takes effect at the next restart", section)
        if new.pipeline.tagger != old.pipeline.tagger:
            log.warning("[pipeline] tagger changed: takes effect at the next restart")
        layout = build_layout(new.pipeline.layout)
        specs = {s.name: s for s in new.channel_specs()}
        plans = {}
        for name, ch in self.channels.items():
            if name in specs and not ch.needs_restart(specs[name]):
                plans[name] = await ch.prepare(specs[name])  # builds sinks, checks latency
        try:
            self.config = dataclasses.replace(
                new, recognizer=old.recognizer, server=old.server,
                pipeline=dataclasses.replace(new.pipeline, tagger=old.pipeline.tagger))
            self.layout_spec = new.pipeline.layout
            for name in list(self.channels):
                if name not in specs:
                    log.info("reload: channel %s removed", name)
                    await self._stop_channel(name)
                elif name not in plans:
                    log.info("reload: channel %s restarts (source or tick rate changed)", name)
                    await self._stop_channel(name)
                    self._start_channel(specs[name])
                else:
                    await self.channels[name].commit(plans.pop(name), layout)
            for name, spec in specs.items():
                if name not in self.channels:
                    log.info("reload: channel %s added", name)
                    self._start_channel(spec)
        finally:
            for plan in plans.values():  # not committed: release what it built
                await plan.discard()
