"""One channel of the daemon: source -> pipeline -> sinks, run (and re-run) by the supervisor,
with its housekeeping; its configuration reload is :mod:`subd.service.reload`."""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from subd.config import ChannelSpec
from subd.errors import AudioInputError
from subd.pipeline.scheduler import Observer, Pipeline, Source
from subd.pipeline.tickstats import Counters
from subd.service.build import (
    GuardedSource,
    build_layout,
    build_sink,
    build_source,
    layout_key,
    sink_options,
)
from subd.service.reload import ChannelReload
from subd.sinks.events_log import EventsLog
from subd.sources.retry import RetryBackoff
from subd.tasks import start_task
from subd.workers.hosts import FactorySpec

if TYPE_CHECKING:
    from subd.service.context import ChannelContext

log = logging.getLogger("subd.service.daemon")

HOUSEKEEPING_S = 1.0
WORKER_CLOSE_S = 1.0  # after a drain the workers have nothing left to do: do not wait long
DRAIN_BUDGET_S = 3.0  # SIGTERM: the pipelines' own drain, before it is cut short


class DaemonChannel(ChannelReload):
    """One channel's life: source -> pipeline -> sinks, run (and re-run) by the supervisor."""

    def __init__(self, context: ChannelContext, spec: ChannelSpec, *, source: Source | None = None,
                 sinks: list[Any] | None = None, events_path: str | None = None,
                 observer: Observer | None = None) -> None:
        self.ctx = context  # what the daemon lends a channel (subd.service.context)
        self.spec = spec
        self.name = spec.name
        self._given_source = source
        self._given_sinks = sinks
        self._events_path = events_path
        self.inner_observer = observer
        self.metrics = context.metrics.channel(spec.name)
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
        self._retry = RetryBackoff()  # reopening a quiet microphone
        self._layout_key: tuple[str, str] | None = None
        self.bus: Any = None  # subd.bus.channel.ChannelBus while this daemon holds the lease

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
        self.ctx.health.set_source(self.name, up, detail)
        self.metrics.set_source(up)
        if not up and (was is None or was[0]):  # once when it goes down, not every second
            log.warning("channel %s: source down: %s", self.name, detail)
        elif up and was is not None and not was[0]:
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
                await self._run_on_bus()
            finally:
                self.ready.set()
            if self._given_source is not None or self.spec.source.kind != "http":
                return  # an HTTP push stream that ended: wait for the next one

    async def _run_on_bus(self) -> None:
        """Without [bus]: the channel runs here. With it: only while this daemon holds the
        channel's lease (a standby waits for it; subd.bus.channel.run_held)."""
        from subd.bus.channel import ChannelBus, run_held

        bus = None if self._given_source is not None else ChannelBus.configured(
            self.ctx.config, self.name, self.spec.tick.lookahead_ms)
        if bus is None:
            await self._run_once()
        else:
            await run_held(bus, self, self._run_once)

    async def _build_source(self) -> GuardedSource:
        from subd.sources.live import FileSource

        d, src = self.ctx, self.spec.source
        if self._given_source is not None:
            return GuardedSource(self._given_source, self._stop, self.report_source)
        try:
            # in a thread: a file is decoded whole (an 85 s WAV: 9 ms; a long or compressed
            # one, through ffmpeg, seconds), and every other channel's ticks would wait for it
            inner = await asyncio.to_thread(build_source, d.config, spec=self.spec,
                                            token=d.push_token)
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

        from subd.history import AudioHistory
        from subd.pipeline.cadence import update_cadence_ms
        from subd.pipeline.scheduler import TickSettings
        from subd.service.metrics import OpsObserver
        from subd.sources.live import QueueSource
        from subd.sources.push import make_push_handler
        from subd.types import SAMPLE_RATE_HZ
        from subd.workers.hosts import TagHost
        from subd.workers.process import InlineWorker

        d, spec, cfg = self.ctx, self.spec, self.ctx.config
        self.aborted = False
        self._started_ns = time.monotonic_ns()
        self.source = source = await self._build_source()
        if isinstance(source.inner, QueueSource) and not hasattr(source.inner, "open"):
            src = spec.source
            rejected = d.metrics.http_rejected  # beside the HTTP layer's own refusals
            self.push_handler = make_push_handler(
                source.inner, fmt=src.pcm_format, rate_hz=src.pcm_rate_hz,
                channels=src.pcm_channels, on_reject=lambda r: rejected.labels(r).inc())
        async with AsyncExitStack() as stack:
            stack.callback(setattr, self, "push_handler", None)
            history = AudioHistory(cfg.recognizer.history_s * SAMPLE_RATE_HZ,
                                   shared=cfg.recognizer.process)
            stack.callback(history.close)
            rec = await d.recogniser.attach(self.name, d.recogniser_host(history))
            stack.push_async_callback(d.recogniser.detach, self.name)
            if d.tagger is not None:
                tag = await d.tagger.attach(self.name, FactorySpec(
                    "subd.workers.hosts:TagHost", {"tagger": d.tagger_spec}))
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
                # on a GPU [recognizer] gpu_update_ms ("auto": from D), else min_update_ms
                min_update_ms=update_cadence_ms(cfg.recognizer, tick.latency_ms,
                                                tick.lookahead_ms, d.recogniser_spec is None
                                                and cfg.recognizer.on_gpu()),
                encoder_span=cfg.recognizer.encoder_span,
                update_cost_ms=cfg.recognizer.planned_cost_ms(),
                miss_tolerance_ms=tick.miss_tolerance_ms,
                drain_timeout_s=cfg.pipeline.drain_timeout_s,
                max_latency_ms=tick.max_latency_ms,
                **({"prepare_ns": self.bus.prepare_ns} if self.bus is not None else {}))
            observer = OpsObserver(self.metrics, d.health, d.notifier,
                                   audio_to_mono_ns=self._audio_to_mono_ns,
                                   inner=self.inner_observer)
            self.pipeline = Pipeline(clock=d.clock, settings=settings, source=source,
                                     recogniser=rec, tagger=tag, history=history,
                                     sinks=list(self.sinks.values()), events=self.events,
                                     observer=observer,
                                     layout=build_layout(d.layout_spec, d.config),
                                     prompt=spec.prompt_in(cfg.recognizer))
            self._layout_key = layout_key(d.layout_spec, d.config)
            observer.counters = self.pipeline.counters  # misses as the scheduler counts them
            # awaited here: its failure is the channel's (and its supervisor's) to report
            self._task = start_task(self.pipeline.run(), f"pipeline:{self.name}",
                                    expected=(Exception,))
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
                if self._given_source is None:  # a given source's command says it, once
                    self.report_source(False, str(exc))
                raise
        c = self.counters
        log.info("channel %s: published %d ticks: %d deadline misses, %d fallbacks, "
                 "%d stale slots, %d degraded", self.name, c.ticks, c.deadline_misses,
                 c.fallbacks, c.stale_slots, c.degraded_ticks)
        if c.updates_skipped:
            log.warning("channel %s: %d planned recogniser updates skipped: the recogniser "
                        "was behind [recognizer] update_cost_ms", self.name, c.updates_skipped)
        if c.updates_degraded:
            log.warning("channel %s: %d recogniser updates degraded: the shared recogniser "
                        "could not have made their due time", self.name, c.updates_degraded)

    def _audio_to_mono_ns(self, audio_ns: int) -> int:
        grid = self.pipeline.grid
        return grid.t0_ns + int(audio_ns / grid.rate)

    async def _start_sinks(self) -> None:
        if self._given_source is not None:
            given = self._given_sinks or []
            self.sinks = {f"{getattr(s, 'name', 'sink')}#{i}": s for i, s in enumerate(given)}
        else:
            cfg = self.ctx.config
            self._sink_opts = {n: sink_options(cfg, n, self.spec)
                               for n in self.spec.sinks.enabled}
            self.sinks = {n: build_sink(n, o) for n, o in self._sink_opts.items()}
        if self.bus is not None:  # not a configured sink: kept across reloads (commit)
            from subd.bus.channel import SINK_NAME

            sse_opts = sink_options(self.ctx.config, "sse", self.spec)
            self.sinks[SINK_NAME] = self.bus.publisher(sse_opts)
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
        m, health = self.metrics, self.ctx.health
        m.sync_stale_slots(p.ring.stale_count)
        self.lag_ns = max(0, p.ingested_until_ns - p.recognised_until_ns)
        m.set_lag(self.lag_ns)
        health.set_lag(self.name, self.lag_ns)
        m.sse_clients.set(self.n_sse_clients)
        dropped = sum(getattr(s, "n_dropped", 0) for s in self.sinks.values())
        if dropped > self._sse_dropped:
            m.sse_drops.inc(dropped - self._sse_dropped)
        self._sse_dropped = dropped
        # files (SRT/VTT, events log): failed writes and cues dropped while the disk was full
        sinks = [*self.sinks.values(), *([self.events] if self.events is not None else [])]
        m.sync_file_errors(sum(getattr(s, "n_write_errors", 0) for s in sinks),
                           sum(getattr(s, "n_lost", 0) for s in sinks))
        for stage, durations in p.counters.stage.items():
            if stage == "recognise":
                continue  # recorded per result by the observer
            seen = self._stage_seen.get(stage, 0)
            new = durations.values()[-min(durations.count - seen, 256):] \
                if durations.count > seen else ()
            for ns in new:
                m.stage_duration(stage, int(ns))
            self._stage_seen[stage] = durations.count

    def liveness_problem(self, now_ns: int, bound_ns: int) -> str:
        """'' when this channel's clock publishes on time, or no clock runs by design (waiting
        for the first audio of a stream, between push streams, backing off before a restart);
        else what is wrong (the watchdog is then not fed)."""
        p, task = self.pipeline, self._task
        if p is None or task is None or task.done() or p.grid is None:
            return ""
        k = p.last_published_k + 1
        due = getattr(p, "_due", p.grid.due_ns)(k)  # a reload's grid switch included
        if now_ns - due > bound_ns:
            return f"tick {k} is {(now_ns - due) / 1e9:.1f} s overdue (publisher stalled)"
        return ""

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
                self._reopen(inner, now)
        elif now - last > quiet_ns:
            self.report_source(False, f"no audio for {(now - last) / 1e9:.0f} s "
                                      f"(pusher or device gone)")
            self._reopen(inner, now)
        else:
            self.report_source(True, "")
            self._retry.reset()

    def _reopen(self, inner: Any, now_ns: int) -> None:
        """A quiet microphone is reopened, with capped backoff, forever (it may have been
        unplugged and plugged back); a push source just waits for its pusher."""
        reopen = getattr(inner, "reopen", None)
        if reopen is None or not self._retry.due(now_ns):
            return
        try:
            reopen()
        except AudioInputError as exc:
            delay_ns = self._retry.failed(now_ns)
            log.warning("channel %s: reopening the source failed: %s; next try in %.0f s",
                        self.name, exc, delay_ns / 1e9)
            return
        self._retry.failed(now_ns)  # reopened: if it stays quiet, the next try waits longer
        log.info("channel %s: source reopened", self.name)
