"""Prometheus metrics for the daemon, labelled per channel, and the aiohttp ``/metrics`` handler.

Each daemon owns one :class:`Metrics` (its own ``CollectorRegistry``, so tests and several
daemons in one process never collide). The hot path takes a :class:`ChannelMetrics` once per
channel: its label children are resolved up front, so a tick costs a few attribute lookups and
no dictionary work inside prometheus-client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from subd.server.ops import metrics_handler  # noqa: F401 - re-exported (callers, tests)
from subd.types import NS_PER_SAMPLE

# Publish-time error |sent − due|: the promise is ≤ 1 ms at p99, so resolve well below that.
PUBLISH_ERROR_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005,
    0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
)
# Stage durations: a tick is 33 ms at 30 fps; recognition updates can take a few hundred ms.
STAGE_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.033, 0.05, 0.075, 0.1, 0.15,
    0.25, 0.5, 1.0, 2.0, 5.0,
)
# Committed-word latency: from the end of the spoken word to its commit, seconds.
WORD_LATENCY_BUCKETS_S = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 20.0, 30.0)

if TYPE_CHECKING:
    from subd.service.health import HealthMonitor
    from subd.service.notify import Notifier

NS_PER_S = 1_000_000_000


class Metrics:
    """Every metric the daemon exports; label ``channel`` on all per-channel series."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        ch = ("channel",)
        self.ticks = Counter("subd_ticks", "Ticks published.", ch, registry=r)
        self.publish_error = Histogram(
            "subd_publish_error_seconds",
            "Absolute publish-time error |sent - due| per tick.",
            ch, buckets=PUBLISH_ERROR_BUCKETS_S, registry=r,
        )
        self.publish_early = Counter(
            "subd_publish_early", "Ticks sent before their deadline (should stay 0).", ch,
            registry=r,
        )
        self.deadline_misses = Counter(
            "subd_deadline_misses", "Ticks published more than the allowed error after T(k).",
            ch, registry=r,
        )
        self.fallbacks = Counter(
            "subd_fallbacks", "Ticks published as a fallback (own state not ready).", ch,
            registry=r,
        )
        self.stale_slots = Counter(
            "subd_stale_slots", "Ring slots still busy when the ring came round.", ch, registry=r
        )
        self.degraded_ticks = Counter(
            "subd_degraded_ticks", "Ticks that took the cheaper (degraded) path.", ch, registry=r
        )
        self.stage_duration = Histogram(
            "subd_stage_duration_seconds", "Time spent per stage per unit of work.",
            ("channel", "stage"), buckets=STAGE_BUCKETS_S, registry=r,
        )
        self.real_time_factor = Gauge(
            "subd_real_time_factor", "Processing time / audio time (below 1 keeps up).", ch,
            registry=r,
        )
        self.lag = Gauge(
            "subd_lag_seconds", "How far the pipeline's audio end trails the tick's audio end.",
            ch, registry=r,
        )
        self.sse_clients = Gauge("subd_sse_clients", "Connected SSE clients.", ch, registry=r)
        self.sse_drops = Counter(
            "subd_sse_drops", "SSE clients dropped for falling behind.", ch, registry=r
        )
        self.committed_word_latency = Histogram(
            "subd_committed_word_latency_seconds",
            "Delay from the end of a spoken word to its commit.",
            ch, buckets=WORD_LATENCY_BUCKETS_S, registry=r,
        )
        self.source_up = Gauge(
            "subd_source_up", "1 while the channel's audio source delivers, else 0.", ch,
            registry=r,
        )
        self.source_failures = Counter(
            "subd_source_failures", "Times the channel's audio source failed.", ch, registry=r
        )
        self.channel_up = Gauge(
            "subd_channel_up", "1 while the channel runs, 0 when failed or stopped.", ch,
            registry=r,
        )
        self.channel_restarts = Counter(
            "subd_channel_restarts", "Channel restarts after a failure.", ch, registry=r
        )
        self.model_loaded = Gauge("subd_model_loaded", "1 once the model is loaded.", registry=r)
        self.stage_up = Gauge(
            "subd_stage_up", "1 while the stage process answers, 0 while it is respawned.",
            ("stage",), registry=r,
        )
        self.stage_restarts = Counter(
            "subd_stage_restarts", "Stage processes respawned after dying or hanging.",
            ("stage",), registry=r,
        )
        self.sink_errors = Counter(
            "subd_sink_errors", "Ticks a sink failed to take (full disk, closed file, bug).",
            ch, registry=r,
        )
        self.updates_skipped = Counter(
            "subd_recogniser_updates_skipped",
            "Planned recogniser updates left out: the recogniser was behind its schedule "
            "([recognizer] update_cost_ms).", ch, registry=r,
        )
        self.updates_degraded = Counter(
            "subd_recogniser_updates_degraded",
            "Recogniser updates answered without a decode: the shared recogniser could not "
            "have made their due time; their due words came from the last reading.", ch,
            registry=r,
        )
        self.file_write_errors = Counter(
            "subd_file_write_errors",
            "Failed writes of live files and the events log (retried; disk full, I/O error).",
            ch, registry=r,
        )
        self.file_cues_lost = Counter(
            "subd_file_cues_lost",
            "Committed cues dropped from a live file because writes kept failing.", ch,
            registry=r,
        )
        self.http_rejected = Counter(
            "subd_http_rejected", "HTTP requests refused by the safety middlewares.",
            ("reason",), registry=r,
        )
        self.reloads = Counter(
            "subd_reloads", "Configuration reloads by outcome.", ("result",), registry=r
        )
        self._channels: dict[str, ChannelMetrics] = {}

    def channel(self, name: str, stages: Iterable[str] = ()) -> ChannelMetrics:
        """The per-channel view (created once, then cached)."""
        cm = self._channels.get(name)
        if cm is None:
            cm = self._channels[name] = ChannelMetrics(self, name)
        for stage in stages:
            cm.stage(stage)
        return cm

    def remove_channel(self, name: str) -> None:
        """Drop a channel's series (after a reload removed it)."""
        cm = self._channels.pop(name, None)
        if cm is None:
            return
        for metric in self._per_channel():
            try:
                metric.remove(name)
            except KeyError:
                pass
        for stage in cm.stage_names():
            try:
                self.stage_duration.remove(name, stage)
            except KeyError:
                pass

    def _per_channel(self) -> tuple:
        return (
            self.ticks, self.publish_error, self.publish_early, self.deadline_misses,
            self.fallbacks, self.stale_slots, self.degraded_ticks, self.real_time_factor,
            self.lag, self.sse_clients, self.sse_drops, self.committed_word_latency,
            self.source_up, self.source_failures, self.channel_up, self.channel_restarts,
            self.sink_errors, self.file_write_errors, self.file_cues_lost,
            self.updates_skipped, self.updates_degraded,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ChannelMetrics:
    """Label children of one channel, resolved once for the hot path."""

    def __init__(self, metrics: Metrics, channel: str) -> None:
        self._m = metrics
        self.channel = channel
        c = channel
        self._ticks = metrics.ticks.labels(c)
        self._publish_error = metrics.publish_error.labels(c)
        self._publish_early = metrics.publish_early.labels(c)
        self._deadline_misses = metrics.deadline_misses.labels(c)
        self._fallbacks = metrics.fallbacks.labels(c)
        self._degraded = metrics.degraded_ticks.labels(c)
        self.stale_slots = metrics.stale_slots.labels(c)
        self.real_time_factor = metrics.real_time_factor.labels(c)
        self.lag_seconds = metrics.lag.labels(c)
        self.sse_clients = metrics.sse_clients.labels(c)
        self.sse_drops = metrics.sse_drops.labels(c)
        self._word_latency = metrics.committed_word_latency.labels(c)
        self.source_up = metrics.source_up.labels(c)
        self.source_failures = metrics.source_failures.labels(c)
        self.channel_up = metrics.channel_up.labels(c)
        self.channel_restarts = metrics.channel_restarts.labels(c)
        self.sink_errors = metrics.sink_errors.labels(c)
        self.updates_skipped = metrics.updates_skipped.labels(c)
        self.updates_degraded = metrics.updates_degraded.labels(c)
        self.file_write_errors = metrics.file_write_errors.labels(c)
        self.file_cues_lost = metrics.file_cues_lost.labels(c)
        self._file_seen = (0, 0)  # the sinks' running totals, as last synced
        self._stages: dict[str, object] = {}
        self._source_is_up = True
        self._stale_seen = 0
        self.channel_up.set(1)
        self.source_up.set(1)

    def published(
        self, due_ns: int, sent_ns: int, *, fallback: bool = False, degraded: bool = False,
        missed: bool = False,
    ) -> None:
        """Record one published tick (call right after the send). ``missed``: the scheduler
        counted it as a deadline miss (its ``miss_tolerance_ms``: one definition of a miss)."""
        error_ns = sent_ns - due_ns
        self._ticks.inc()
        self._publish_error.observe(abs(error_ns) / NS_PER_S)
        if error_ns < 0:
            self._publish_early.inc()
        if missed:
            self._deadline_misses.inc()
        if fallback:
            self._fallbacks.inc()
        if degraded:
            self._degraded.inc()

    def stage(self, name: str):
        child = self._stages.get(name)
        if child is None:
            child = self._stages[name] = self._m.stage_duration.labels(self.channel, name)
        return child

    def stage_names(self) -> tuple[str, ...]:
        return tuple(self._stages)

    def stage_duration(self, name: str, duration_ns: int) -> None:
        self.stage(name).observe(duration_ns / NS_PER_S)

    def committed_words(self, latencies_ns: Iterable[int]) -> None:
        for latency_ns in latencies_ns:
            self._word_latency.observe(max(latency_ns, 0) / NS_PER_S)

    def sync_stale_slots(self, total: int) -> None:
        """Bring the counter up to the ring's running total (``SlotRing.stale_count``)."""
        delta = total - self._stale_seen
        if delta > 0:
            self.stale_slots.inc(delta)
            self._stale_seen = total

    def sync_file_errors(self, write_errors: int, cues_lost: int) -> None:
        """Bring the counters up to the file sinks' running totals (a channel restart starts
        new sinks from 0: only growth is counted)."""
        seen_errors, seen_lost = self._file_seen
        if write_errors > seen_errors:
            self.file_write_errors.inc(write_errors - seen_errors)
        if cues_lost > seen_lost:
            self.file_cues_lost.inc(cues_lost - seen_lost)
        self._file_seen = (write_errors, cues_lost)

    def set_lag(self, lag_ns: int) -> None:
        self.lag_seconds.set(lag_ns / NS_PER_S)

    def set_source(self, up: bool) -> None:
        if not up and self._source_is_up:  # count transitions to down, not every report
            self.source_failures.inc()
        self._source_is_up = up
        self.source_up.set(1 if up else 0)


class OpsObserver:
    """A ``subd.pipeline.scheduler.Observer`` for one channel: metrics and health per tick.
    (The systemd watchdog is fed by the daemon's liveness check, not by ticks: a channel idle by
    design publishes none.)

    ``audio_to_mono_ns`` maps an audio-timeline time to CLOCK_MONOTONIC (live sources:
    ``t0_ns + audio_ns``) for the committed-word latency; without it that metric stays empty.
    ``inner`` is another observer to forward to.
    """

    def __init__(
        self,
        metrics: ChannelMetrics,
        health: HealthMonitor | None = None,
        notifier: Notifier | None = None,
        audio_to_mono_ns: Callable[[int], int] | None = None,
        inner: Any | None = None,
    ) -> None:
        self.metrics = metrics
        self.health = health
        self.notifier = notifier
        self.audio_to_mono_ns = audio_to_mono_ns
        self.inner = inner
        self._accepted_sample = 0
        self.counters: Any | None = None  # the pipeline's (tickstats.Counters), once it exists
        self._misses_seen = 0
        self._sink_errors_seen = 0
        self._skipped_seen = self._degraded_seen = 0

    def on_publish(self, state: Any, sent_ns: int) -> None:
        missed = False
        c = self.counters
        if c is not None:
            missed = c.deadline_misses > self._misses_seen
            self._misses_seen = c.deadline_misses
            if c.sink_errors > self._sink_errors_seen:
                self.metrics.sink_errors.inc(c.sink_errors - self._sink_errors_seen)
                self._sink_errors_seen = c.sink_errors
            if c.updates_skipped > self._skipped_seen:
                self.metrics.updates_skipped.inc(c.updates_skipped - self._skipped_seen)
                self._skipped_seen = c.updates_skipped
            if c.updates_degraded > self._degraded_seen:
                self.metrics.updates_degraded.inc(c.updates_degraded - self._degraded_seen)
                self._degraded_seen = c.updates_degraded
        self.metrics.published(state.due_ns, sent_ns, fallback=state.fallback,
                               degraded=state.degraded, missed=missed)
        if self.health is not None:
            self.health.tick(self.metrics.channel, state.k, sent_ns)
        if self.inner is not None:
            self.inner.on_publish(state, sent_ns)

    def on_stage(self, name: str, duration_ns: int) -> None:
        """A stage other than recognition finished one unit of work (tag pass, publication)."""
        self.metrics.stage_duration(name, duration_ns)
        forward = getattr(self.inner, "on_stage", None)
        if forward is not None:
            forward(name, duration_ns)

    def on_hypothesis(self, result: Any, now_ns: int) -> None:
        """``result`` is a ``subd.workers.hosts.RecogniseResult``."""
        self.metrics.stage_duration("recognise", result.duration_ns)
        n_new = result.accepted_sample - self._accepted_sample
        if n_new > 0:
            self._accepted_sample = result.accepted_sample
            audio_ns = n_new * NS_PER_SAMPLE
            self.metrics.real_time_factor.set(result.duration_ns / audio_ns)
        if self.audio_to_mono_ns is not None:
            self.metrics.committed_words(
                now_ns - self.audio_to_mono_ns(w.end_ns) for w in result.hypothesis.committed
            )
        if self.inner is not None:
            self.inner.on_hypothesis(result, now_ns)
