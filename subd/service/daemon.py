"""The daemon: configuration -> channels (source, pipeline, sinks), one shared model, the HTTP
server, health, metrics and the service manager.

Order matters for timing: worker processes are spawned (and load the model) *before* the
publisher asks for SCHED_FIFO, so they never inherit real-time priority; each channel's clock
t0 is set only when everything is ready, so the first tick is not eaten by start-up.

Several channels share ONE recogniser worker process (one model in memory, one recogniser state
per channel; requests are served one at a time, first come first served) and one tagger
process; a stage process that dies or hangs is respawned (:mod:`subd.service.stages`) while
every clock goes on. Each channel runs under
:class:`~subd.service.supervisor.ChannelSupervisor`, so a failing channel is restarted, with
capped backoff, while the others keep their clock. One channel's life is in
:mod:`subd.service.channel`; what is built from the configuration in :mod:`subd.service.build`.
The systemd watchdog is fed from a liveness check (:meth:`Daemon.liveness_problem`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from subd.clock import Clock, MonotonicClock, request_realtime_priority, share_gil_within_spin
from subd.config import ChannelSpec, Config, nvidia_present
from subd.pipeline.scheduler import Observer, Source
from subd.pipeline.tickstats import Counters
from subd.service.batching import BatchingSharedWorker
from subd.service.build import (  # noqa: F401 - re-exported: subd stream, benches, tests
    DEMO_CLIP,
    GuardedSource,
    build_layout,
    build_sink,
    build_source,
    demo_clip_path,
    recognizer_spec,
    serial_host_spec,
    sink_options,
    tagger_factory,
)
from subd.service.channel import (
    DRAIN_BUDGET_S,
    HOUSEKEEPING_S,
    WORKER_CLOSE_S,
    DaemonChannel,
)
from subd.service.context import ChannelContext
from subd.service.health import HealthMonitor
from subd.service.metrics import Metrics
from subd.service.notify import Notifier
from subd.service.sharding import rows_cap, serial_recogniser, sharded_recogniser
from subd.service.stages import UP, SharedWorker, StagePolicy
from subd.service.supervisor import FAILED, RUNNING, ChannelSupervisor
from subd.tasks import start_task
from subd.workers.hosts import FactorySpec
from subd.workers.process import InlineWorker, ProcessWorker

log = logging.getLogger("subd.service.daemon")

STATUS_EVERY_S = 5.0


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
    log_filter: Any | None = None  # subd.service.logs.RepeatFilter: flushed by the housekeeping
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
        self.context: ChannelContext | None = None  # once the workers are up
        self.exit_code = 0

    @property
    def pipeline(self) -> Any:
        first = next(iter(self.channels.values()), None)
        return first.pipeline if first is not None else None

    # ---- workers (one model for every channel) --------------------------------------------

    def _batched(self) -> bool:
        """One batched recogniser for every channel (subd.service.batching): on CUDA, or when
        asked for; never for a custom recogniser factory (it decodes on its own)."""
        cfg = self.config.recognizer
        if self.recognizer is not None or cfg.factory or cfg.batched == "off":
            return False
        return cfg.batched == "on" or cfg.device != "cpu" and nvidia_present()

    def _recogniser_worker(self) -> Any:
        cfg = self.config.recognizer
        if self._batched():
            recognizer_spec(cfg.model)  # a clear error if the recogniser is not installed
            host = FactorySpec("subd.service.batching:BatchedMultiplexHost", {
                "model": cfg.model, "device": cfg.device, "precision": cfg.precision,
                **rows_cap(cfg)})
            if cfg.process:
                return ProcessWorker("recognise", host)
            return InlineWorker("recognise", host.build(), self.clock)
        host = serial_host_spec(cfg.model if self.recognizer is None and not cfg.factory
                                else None, precision=cfg.precision)
        if cfg.process:
            return ProcessWorker("recognise", host)
        return InlineWorker("recognise", host.build(), self.clock)

    async def _start_workers(self, stack: AsyncExitStack) -> None:
        cfg = self.config
        # a respawned stage loads its model again: it gets the same start limit
        policy = StagePolicy(start_timeout_s=cfg.recognizer.start_timeout_s,
                             spare=cfg.recognizer.spare_process)
        shared_class = BatchingSharedWorker if self._batched() else SharedWorker
        # several batched processes share the channels (subd.service.sharding),
        # or several serial processes on the CPU (not for a custom recogniser: it decodes on
        # its own), or one process
        serial = not (self._batched() or self.recognizer is not None or cfg.recognizer.factory)
        # a batched one orders the channels' requests by their due times, on their clock
        timed = {"clock": self.clock, **rows_cap(cfg.recognizer)} if self._batched() else {}
        self.recogniser = sharded_recogniser(cfg.recognizer, self._batched(), policy=policy,
                                             on_state=self._on_stage, **timed) or \
            (serial and serial_recogniser(cfg.recognizer, len(cfg.channel_specs()),
                                          policy=policy, on_state=self._on_stage)) or \
            shared_class(self._recogniser_worker(), policy=policy, on_state=self._on_stage,
                         **timed)
        self.tagger_spec = tagger_factory(cfg)
        shared = list(getattr(self.recogniser, "shards", [self.recogniser]))
        if self.tagger_spec is not None and cfg.pipeline.tag_process:
            check = FactorySpec("subd.workers.hosts:TagHost", {"tagger": self.tagger_spec})
            tag = ProcessWorker("tag", FactorySpec("subd.service.supervisor:MultiplexHost",
                                                   {"preload": check}))  # loads, or fails now
            self.tagger = SharedWorker(tag, policy=policy, on_state=self._on_stage)
            shared.append(self.tagger)
        for sw in shared:
            stack.push_async_callback(functools.partial(sw.close, WORKER_CLOSE_S))
        started = await asyncio.gather(*(sw.worker.start(cfg.recognizer.start_timeout_s)
                                         for sw in shared), return_exceptions=True)
        for outcome in started:
            if isinstance(outcome, BaseException):
                raise outcome
        for sw in shared:
            self._on_stage(sw.name, UP, "")
            sw.keep_spare()  # loads in the background (policy.spare)
        self.metrics.model_loaded.set(1)
        self.health.set_model_loaded()
        self.context = ChannelContext(
            config=self.config, clock=self.clock, metrics=self.metrics, health=self.health,
            notifier=self.notifier, push_token=self.push_token, recogniser=self.recogniser,
            tagger=self.tagger, tagger_spec=self.tagger_spec, layout_spec=self.layout_spec,
            recogniser_spec=self.recognizer)

    def _on_stage(self, name: str, state: str, detail: str) -> None:
        stages = (*getattr(self.recogniser, "shards", [self.recogniser]), self.tagger)
        sw = next((w for w in stages if w and w.name == name), None)
        self.health.set_stage(name, state, detail, getattr(sw.worker, "pid", None) if sw else None,
                              sw.restarts if sw else 0)
        self.metrics.stage_up.labels(name).set(1 if state == UP else 0)
        if state == UP and detail:
            self.metrics.stage_restarts.labels(name).inc()

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
            return DaemonChannel(self.context, spec, source=self.source, sinks=self.sinks,
                                 events_path=self.events_path, observer=self.observer)
        return DaemonChannel(self.context, spec, observer=self.observer)

    def _start_channel(self, spec: ChannelSpec) -> None:
        ch = self.channels[spec.name] = self._new_channel(spec)
        self.health.add_channel(spec.name, spec.tick.latency_ns)
        self.metrics.channel(spec.name)
        if self.supervise:
            self._tasks[spec.name] = self.supervisor.start(ch)
        else:
            # unsupervised (subd stream), a channel's failure ends the run: _wait_channels
            # raises it, and the command reports it in its one line
            self._tasks[spec.name] = start_task(ch.run(), f"channel:{spec.name}",
                                                expected=(Exception,))

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
                if self.serve is not None:
                    # the port first: a busy one is a one-line error before any model loads
                    # or channel starts (routes answer 404/503 until the channels are up)
                    from subd.server.app import serve_daemon

                    await serve_daemon(self, stack)
                await self._start_workers(stack)
                specs = cfg.channel_specs()[:1] if self.source is not None \
                    else cfg.channel_specs()
                if self._stopping:  # SIGTERM while the model loaded
                    return Counters()
                for spec in specs:
                    self._start_channel(spec)
                await asyncio.wait([start_task(ch.ready.wait(), f"ready:{ch.name}")
                                    for ch in self.channels.values()])
                if any(s.tick.realtime for s in specs):
                    request_realtime_priority()
                    share_gil_within_spin()
                self.notifier.ready(self.status_line())
                housekeeping = start_task(self._housekeeping(), "housekeeping")
                stack.callback(housekeeping.cancel)
                if self.notifier.watchdog_enabled:
                    watchdog = start_task(self._watchdog(), "watchdog")
                    stack.callback(watchdog.cancel)
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
        stopper = start_task(self.supervisor.stop_all(timeout_s=budget_s + 1.0), "stop-all")
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=budget_s)
            if pending:
                log.warning("drain budget of %.1f s spent: closing %d channels now",
                            budget_s, len(pending))
                for ch in self.channels.values():
                    ch.abort()
        await stopper
        await self._finished.wait()

    # ---- the systemd watchdog ----------------------------------------------------------------

    def liveness_problem(self) -> str:
        """'' when the daemon does its job: this event loop runs (we are here), and every
        channel's clock publishes on time or the channel is idle by design (waiting for its
        first audio or its next push stream, backing off before a restart). A stage process
        that died or hung is not a problem here: it is respawned while the clock goes on."""
        now_ns = self.clock.now_ns()
        bound_ns = self.health.limits.stall_after_ns
        for ch in self.channels.values():
            why = ch.liveness_problem(now_ns, bound_ns)
            if why:
                return f"channel {ch.name}: {why}"
        return ""

    async def _watchdog(self) -> None:
        """Feed the watchdog only while :meth:`liveness_problem` finds nothing, checking at a
        quarter of its timeout (the notifier sends at most every half)."""
        period_s = self.notifier.watchdog_timeout_ns / 4e9
        said = ""
        while True:
            why = self.liveness_problem()
            if why:
                if why != said:
                    log.error("not feeding the watchdog: %s", why)
            else:
                self.notifier.watchdog()
            said = why
            await asyncio.sleep(period_s)

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
        kept = dataclasses.replace(old.recognizer, prompt=new.recognizer.prompt)  # live
        for section, was in (("server", old.server), ("recognizer", kept)):
            if was != getattr(new, section):
                log.warning("[%s] changed: takes effect at the next restart", section)
        if new.pipeline.tagger != old.pipeline.tagger:
            log.warning("[pipeline] tagger changed: takes effect at the next restart")
        layout = build_layout(new.pipeline.layout, new)  # checked; each channel builds its own
        specs = {s.name: s for s in new.channel_specs()}
        plans = {}
        for name, ch in self.channels.items():
            if name in specs and not ch.needs_restart(specs[name]):
                plans[name] = await ch.prepare(specs[name])  # builds sinks, checks latency
        try:
            self.config = dataclasses.replace(
                new, recognizer=kept, server=old.server,
                pipeline=dataclasses.replace(new.pipeline, tagger=old.pipeline.tagger))
            self.layout_spec = new.pipeline.layout
            self.context.config, self.context.layout_spec = self.config, self.layout_spec
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
                    self.health.set_latency(name, specs[name].tick.latency_ns)
            for name, spec in specs.items():
                if name not in self.channels:
                    log.info("reload: channel %s added", name)
                    self._start_channel(spec)
        finally:
            for plan in plans.values():  # not committed: release what it built
                await plan.discard()
