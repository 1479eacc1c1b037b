"""The tick scheduler: ingest → recognise → tag → layout → publish, pulled by a clock.

Four tasks share the event loop and never wait on each other:

* ingest: source chunks into the channel's one copy of its audio, the shared-memory history
  the recogniser reads in place;
* recognise: whenever enough new audio is in, one ``update`` in the recogniser worker (its own
  process); committed words join an append-only stream that only ever grows;
* fetch: at ``T(k) − A`` tick k's words go to the tag/layout worker; if that worker has been
  busy for more than 2·P the tick takes the cheap path at once (degraded) instead of queueing;
* publish: at ``T(k)`` exactly, tick k's laid-out state, or, if it is not ready, the last good
  state marked ``fallback`` (a late result joins the next tick). Committed words are published
  exactly once, in order: a result only contributes words past the published index. The
  publish half (with the layout of the cues) is :mod:`subd.pipeline.publish`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from fractions import Fraction
from typing import Any

from subd.clock import Clock
from subd.history import AudioHistory, writer_lead_samples
from subd.layout.cues import CueLayout
from subd.pipeline.contracts import (  # noqa: F401 - named here by the service and tests
    PREPARE_NS,
    Observer,
    Source,
    TickSettings,
    Worker,
)
from subd.pipeline.deadline import UpdatePlanner
from subd.pipeline.gcpace import PACER
from subd.pipeline.ingest import Ingest
from subd.pipeline.publish import TickPublisher
from subd.pipeline.recognition import RecognitionLoop
from subd.pipeline.ring import DEGRADED, READY, SlotFlag, SlotRing, n_slots_for
from subd.pipeline.ticks import NS_PER_MS, TickGrid, fps_text
from subd.pipeline.tickstats import Counters
from subd.pipeline.wordstream import WordStream
from subd.sinks.events_log import EventsLog
from subd.sources.drift import DriftEstimator
from subd.tasks import start_task
from subd.types import CaptionState, Cue, samples_to_ns
from subd.workers.hosts import (
    RecogniseResult,
    TagResult,
)

log = logging.getLogger("subd.pipeline.scheduler")

REBASE_EVERY_TICKS = 150  # live sources: refit the sample clock every ~5 s of ticks
MAX_SLEW_NS = 500_000  # at most 0.5 ms of offset correction per refit


class Pipeline(RecognitionLoop, TickPublisher):
    def __init__(self, *, clock: Clock, settings: TickSettings, source: Source,
                 recogniser: Worker, tagger: Worker, history: AudioHistory,
                 sinks: list[Any] = (), events: EventsLog | None = None,
                 observer: Observer | None = None, layout: Any | None = None,
                 prompt: str | None = None) -> None:
        self.clock = clock
        self.settings = settings
        self.source = source
        self.recogniser = recogniser
        self.tagger = tagger
        self.history = history
        self.sinks = list(sinks)
        self.events = events
        self.observer = observer
        self.prompt = prompt  # names and terms to expect: each update carries it (live)
        # cues are laid out here, once per tick, and carried in the state to every sink:
        # .apply(state) -> state with cues, .finish() -> the cues closed at the end
        self.layout = layout if layout is not None else CueLayout()
        self._carried_cues: tuple[Cue, ...] = ()  # closed by a layout replaced on reload
        self.counters = Counters()
        self._prepare_ns = max(PREPARE_NS, settings.prepare_ns)
        self.grid: TickGrid | None = None
        self._grid_prev: TickGrid | None = None
        self._switch_k = -1  # ticks before it are due on _grid_prev
        self.ring: SlotRing | None = None
        self.drift = DriftEstimator() if source.live else None
        self.words = WordStream()
        self.ingest: Ingest | None = None
        self._rec_audio_end_ns = 0  # the furthest the recogniser has accounted for
        self._rec_settled_ns = 0  # the latest hypothesis's settled end (the tagger's pauses)
        self._rec_accepted = 0
        self._rec_finished = False
        self._captioned = False  # a hypothesis had words: the channel has shown a caption
        self._source_done = False
        self._done_at_ns: int | None = None
        self._audio_event = asyncio.Event()
        self._consumed_event = asyncio.Event()
        self._tag_event = asyncio.Event()
        self._tag_pending: tuple[int, bool] | None = None
        # each update's deadline and encoder span (subd.pipeline.deadline)
        # a channel's worker onto a recogniser that may serve other channels (the daemon's
        # subd.service.stages.ChannelWorker) has ``shared``: planned as shared while others are
        # attached to it (a channel alone is planned as `subd bench quality` measures it)
        stage = getattr(recogniser, "shared", None)
        self.planner = UpdatePlanner(  # a planned cost is also the shortest cadence
            settings.encoder_span, max(settings.min_update_ms, settings.update_cost_ms),
            shared=(lambda: stage.n_channels() > 1) if stage is not None else False,
            planned_cost_ms=settings.update_cost_ms)
        self._prev: CaptionState | None = None
        self.last_published_k = -1

    # ---- setup ------------------------------------------------------------------------------

    def _due(self, k: int) -> int:
        assert self.grid is not None
        if self._grid_prev is not None and k < self._switch_k:
            return self._grid_prev.due_ns(k)
        return self.grid.due_ns(k)

    @property
    def wall_period_ns(self) -> Fraction:
        assert self.grid is not None
        return self.grid.wall_period_ns

    async def run(self) -> Counters:
        s = self.settings
        # what the recogniser's process measured its updates to cost (subd.recognise.warmup)
        costs = getattr(self.recogniser, "update_costs", None)
        if costs is not None:
            self.planner.expect(costs)
        t0_ns = await self.source.start(self.clock)
        self.grid = TickGrid.create(s.fps, t0_ns, s.latency_ms, s.lookahead_ms, rate=s.rate)
        self._ring_latency_ns = max(self.grid.latency_ns, s.max_latency_ms * NS_PER_MS)
        n_slots = n_slots_for(self._ring_latency_ns, self.grid.lookahead_ns,
                              self.grid.wall_period_ns)
        self.ring = SlotRing(n_slots)
        self.ingest = Ingest(self.history, self.clock, self.counters)
        tol = s.miss_tolerance_ms * NS_PER_MS or self.wall_period_ns / 2
        self._miss_tolerance_ns = int(tol)
        if self.events is not None:
            self.events.write_start(t0_ns, fps_text(self.grid.fps), s.latency_ms, s.lookahead_ms)
        tasks = [
            start_task(self._ingest_loop(), "pipeline:ingest"),
            start_task(self._recognise_loop(), "pipeline:recognise"),
            start_task(self._fetch_loop(), "pipeline:fetch"),
            start_task(self._tag_loop(), "pipeline:tag"),
        ]
        publisher = start_task(self._publish_loop(), "pipeline:publish")
        PACER.acquire()  # collections after publishing, never just before a deadline
        try:
            while True:
                done, _ = await asyncio.wait([publisher, *tasks],
                                             return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t is not publisher and not t.cancelled() and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
                if publisher in done:
                    publisher.result()
                    break
                tasks = [t for t in tasks if not t.done()]
        finally:
            for t in [publisher, *tasks]:
                t.cancel()
            await asyncio.gather(publisher, *tasks, return_exceptions=True)
            PACER.release()
            if self.events is not None:
                self.events.flush()
        self.counters.stale_slots = self.ring.stale_count
        return self.counters

    # ---- hooks for the daemon (reload, health) ----------------------------------------------

    @property
    def recognised_until_ns(self) -> int:
        """Audio time the recogniser has heard up to."""
        return self._rec_audio_end_ns

    @property
    def ingested_until_ns(self) -> int:
        return samples_to_ns(self.ingest.ingested) if self.ingest is not None else 0

    def set_latency(self, latency_ms: int) -> int | None:
        """Change D on the running pipeline (a configuration reload). Returns the first tick
        due with the new D (None before the clock started). Ticks already fetched keep their
        times; a longer D pauses publication by the difference, a shorter one publishes the
        ticks that are then overdue at once (late: they count as deadline misses)."""
        s = self.settings
        limit_ms = max(s.max_latency_ms, s.latency_ms)
        if self.grid is not None:
            limit_ms = self._ring_latency_ns // NS_PER_MS
        if not s.lookahead_ms < latency_ms <= limit_ms:
            raise ValueError(f"latency_ms = {latency_ms}: must be in {s.lookahead_ms + 1}.."
                             f"{limit_ms} (the slot ring was sized at start)")
        self.settings = replace(s, latency_ms=latency_ms)
        grid = self.grid
        if grid is None:
            return None
        if self.last_published_k + 1 < self._switch_k:
            raise RuntimeError("the tick grid is still switching; try again")
        now = self.clock.now_ns()
        margin_ns = grid.lookahead_ns + 2 * int(grid.wall_period_ns)  # not fetched yet
        k = max(grid.first_due_at_or_after(now + margin_ns), self._switch_k + 1,
                self.last_published_k + 2)
        delta_ns = latency_ms * NS_PER_MS - grid.latency_ns
        anchor_due_ns = grid.due_ns(grid.anchor_k) if grid.anchor_due_ns is None \
            else grid.anchor_due_ns
        # same anchor, shifted by the change: T(k) = t0 + (k+1)·P + D' stays exact
        self._grid_prev, self._switch_k, self.grid = grid, k, replace(
            grid, latency_ns=latency_ms * NS_PER_MS, anchor_due_ns=anchor_due_ns + delta_ns)
        log.info("latency %d -> %d ms from tick %d", grid.latency_ns // NS_PER_MS, latency_ms, k)
        return k

    # ---- ingest + features ------------------------------------------------------------------

    async def _ingest_loop(self) -> None:
        # the recogniser reads its window in place, up to 30 s back from what it was sent
        lead = writer_lead_samples(self.history.capacity)
        async for chunk in self.source.chunks():
            end = chunk.start_sample + chunk.n_samples
            if self.drift is not None:
                self.drift.observe(end, self.clock.now_ns())
            if self.source.pullable:  # hold the source back rather than lap the recogniser
                while end - self._rec_accepted > lead:
                    self._consumed_event.clear()
                    await self._consumed_event.wait()
            self.ingest.write(chunk)
            self._audio_event.set()
        self._source_done = True
        self._done_at_ns = self.clock.now_ns()
        self._audio_event.set()

    # ---- recognise (the loop: subd.pipeline.recognition) ----------------------------------

    def _integrate(self, result: RecogniseResult, final: bool = False) -> None:
        hyp = result.hypothesis
        self.words.add_hypothesis(hyp)
        if hyp.committed:
            self.planner.started = True
        self._captioned |= bool(hyp.committed or hyp.tentative)
        self._rec_audio_end_ns = max(self._rec_audio_end_ns, hyp.audio_end_ns)
        # not the furthest: after a decode that stopped short of the last one's words, the
        # speech after them is no pause (subd.recognise.streaming._settle)
        self._rec_settled_ns = hyp.audio_end_ns
        self._rec_accepted = result.accepted_sample
        self._consumed_event.set()
        self.counters.stage["recognise"].add(result.duration_ns)
        if result.lost_samples:
            self.counters.lost_samples += result.lost_samples
            log.warning("recogniser fell %d samples behind a live source; audio skipped",
                        result.lost_samples)
        if self.observer is not None:
            self.observer.on_hypothesis(result, self.clock.now_ns())
        self._rec_finished |= final

    # ---- fetch + tag ------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        k = 0
        while True:
            await self.clock.sleep_until(self._due(k) - self.grid.lookahead_ns, precise=False)
            if self.drift is not None and k % REBASE_EVERY_TICKS == REBASE_EVERY_TICKS - 1:
                self._rebase(k + 1)
            self._fetch(k)
            k += 1

    def _rebase(self, k: int) -> None:
        fit = self.drift.fit()
        if fit is None:
            return
        grid = self.grid
        rate = fit.rate() * self.settings.rate
        want_ns = fit.monotonic_ns(grid.audio_end_sample(k)) + grid.latency_ns
        offset = max(-MAX_SLEW_NS, min(MAX_SLEW_NS, want_ns - self._due(k)))
        self._grid_prev, self._switch_k, self.grid = grid, k, replace(
            grid, rate=rate, anchor_k=k, anchor_due_ns=self._due(k) + offset)
        log.debug("sample clock %+.1f ppm; tick grid rebased at k=%d (%+d ns)", fit.ppm, k,
                  offset)

    def _fetch(self, k: int) -> None:
        now = self.clock.now_ns()
        slot = self.ring.acquire(k)
        if slot is None:  # the ring was lapped by a burst of audio: this tick falls back
            return
        if not self._rec_finished and self._rec_audio_end_ns < self.grid.audio_end_ns(k):
            self.counters.recognition_behind += 1
        busy = self.tagger.busy_since_ns
        if busy is not None and now - busy > 2 * self.wall_period_ns:
            # the tag stage overran 2·P: this tick skips it (committed words go out untagged)
            # instead of queueing behind it
            self._degrade(k)
            return
        flush = self._rec_finished and not self.words.tag_flushed
        cutoff_ns = self.grid.audio_end_ns(k)
        if self.words.tagger_is_current() and not flush and \
                not self.words.undecided_until(cutoff_ns):
            # nothing new since the last tag pass and no word due undecided: the tick's state
            # is ready as it is
            slot.mode = READY
            self.ring.mark(slot, SlotFlag.TAGGED | SlotFlag.LAID_OUT)
            return
        if self._tag_pending is not None:
            self.counters.superseded_requests += 1
        self._tag_pending = (k, flush)
        self._tag_event.set()

    async def _tag_loop(self) -> None:
        while True:
            self._tag_event.clear()
            await self._tag_event.wait()
            while self._tag_pending is not None:
                (k, flush), self._tag_pending = self._tag_pending, None
                if self.clock.now_ns() >= self._due(k) - self._prepare_ns:
                    self.counters.superseded_requests += 1
                    continue  # too late to matter; a newer tick will carry its words
                request = self.words.tag_request(k, self._rec_settled_ns, flush,
                                                 decide_until_ns=self.grid.audio_end_ns(k))
                started = self.clock.now_ns()
                watchdog = start_task(self._overrun_watch(k, started), "pipeline:tag-watchdog")
                try:
                    result = await self.tagger.call(request, started)
                finally:
                    watchdog.cancel()
                self._store(result)

    async def _overrun_watch(self, k: int, started_ns: int) -> None:
        """A tag pass still running 2·P after it started: tick k takes the cheap path."""
        await self.clock.sleep_until(started_ns + int(2 * self.wall_period_ns) + 1,
                                     precise=False)
        self._degrade(k)

    def _degrade(self, k: int) -> None:
        slot = self.ring.get(k)
        if slot is None or slot.flags & (SlotFlag.PUBLISHED | SlotFlag.LAID_OUT):
            return
        slot.mode = DEGRADED
        self.ring.mark(slot, SlotFlag.TAGGED | SlotFlag.LAID_OUT)
        self.counters.degraded_ticks += 1

    def _store(self, result: TagResult) -> None:
        self._stage_done("tag", result.duration_ns)
        self.words.add_tagged(result)
        slot = self.ring.get(result.k)
        if slot is not None and slot.mode is DEGRADED:
            return  # already switched to the cheap path; its words reach the next ticks
        if slot is None or slot.flags & SlotFlag.PUBLISHED or \
                self.clock.now_ns() > self._due(result.k) - self._prepare_ns:
            self.counters.late_results += 1  # its words join the next tick that is ready
            return
        slot.mode = READY
        self.ring.mark(slot, SlotFlag.TAGGED | SlotFlag.LAID_OUT)
