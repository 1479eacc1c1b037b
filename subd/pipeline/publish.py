"""The publish half of the tick pipeline: at T(k) − prepare, tick k's state is built, laid out
(the cues, once, for every sink) and put in its slot, and its SSE event is encoded, once, into
the slot's buffer for every SSE sink; the other sinks that can encode ahead do it then; at T(k)
exactly the state goes to every sink. A tick whose slot is not ready repeats the last state as
a fallback (its event encoded in the ring's spare buffer if the slot is gone).
:class:`TickPublisher` is mixed into :class:`~subd.pipeline.scheduler.Pipeline`, whose streams
and counters it reads.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from subd.pipeline.gcpace import PACER
from subd.pipeline.ring import DEGRADED
from subd.sinks.sse.wire import TickEvent
from subd.types import CaptionState, Cue, samples_to_ns

log = logging.getLogger("subd.pipeline.scheduler")


class TickPublisher:
    """Publishing, for :class:`~subd.pipeline.scheduler.Pipeline` (which sets every attribute
    used here: clock, ring, words, layout, sinks, events, observer, counters, grid)."""

    layout: Any
    _carried_cues: tuple[Cue, ...]

    async def _publish_loop(self) -> None:
        k = 0
        while True:
            due = self._due(k)
            await self.clock.sleep_until(due - self._prepare_ns, precise=False)
            state = self._prepare(k, due)
            self._prepare_sinks(state, self._encode(state))
            sent = await self.clock.sleep_until(due)
            slot = self.ring.get(k)  # the prepared state waits in tick k's slot until T(k)
            self._emit(slot.state if slot is not None and slot.state is not None else state,
                       sent)
            PACER.after_publish()
            k += 1
            if self._drained(k - 1):
                return

    def _prepare(self, k: int, due: int) -> CaptionState:
        """Tick k's state, laid out (the cues closed at this tick, then the open cue), and
        put in its slot; a tick without a ready slot repeats the last state as a fallback."""
        slot = self.ring.get(k)
        mode = slot.mode if slot is not None else None
        prev = self._prev
        carried, self._carried_cues = self._carried_cues, ()
        if mode is None:
            # the open cue stays on screen; a closed cue is never sent twice
            still_open = tuple(c for c in prev.cues if not c.committed) if prev else ()
            return CaptionState(k=k, due_ns=due,
                                audio_end_ns=prev.audio_end_ns if prev else 0,
                                tentative=prev.tentative if prev else "",
                                cues=carried + still_open, fallback=True)
        t_ns = self.clock.now_ns()
        state = self.layout.apply(
            self.words.state(k, due, self.grid.audio_end_ns(k), mode is DEGRADED))
        closing = self._finished_after(state)
        if carried or closing:  # a closing cue takes the open cue's place, at the end
            kept = tuple(c for c in state.cues if c.committed or not closing)
            state = replace(state, cues=carried + kept + tuple(closing))
        self._stage_done("layout", self.clock.now_ns() - t_ns)
        slot.state = state
        return state

    def _finished_after(self, state: CaptionState) -> list[Cue]:
        """The open cue, closed, if ``state`` is the stream's last (its drain ends with it)."""
        if self._source_done and self._rec_finished and self.words.tag_flushed \
                and self.words.n_unpublished == len(state.committed) \
                and self.grid.audio_end_ns(state.k) >= samples_to_ns(self.ingest.ingested):
            return list(self.layout.finish())
        return []

    def set_layout(self, layout: object) -> None:
        """A reload's new layout takes over at the next tick; the old one's open cue is
        closed and published then, so no committed cue is lost."""
        self._carried_cues += tuple(self.layout.finish())
        self.layout = layout

    def _sink_failed(self, sink: Any, what: str, k: int) -> None:
        """Counted always (subd_sink_errors); logged with its traceback the first 10 times, then
        once every 1000 with the count, so a sink failing every tick neither floods the log
        nor goes quiet."""
        n = self.counters.sink_errors = self.counters.sink_errors + 1
        name = getattr(sink, "name", sink)
        if n <= 10:
            log.exception("sink %s failed to %s tick %d", name, what, k)
        elif n % 1000 == 0:
            log.error("sink %s failed to %s tick %d (%d sink errors so far)", name, what, k, n)

    def _encode(self, state: CaptionState) -> TickEvent | None:
        """Tick k's SSE event, encoded once, into its slot's buffer (the ring's spare if the
        slot is gone), for the sinks that write it (``prepare_event``). None if no sink does:
        nothing is encoded that nobody reads. Its first word's index is the count of words
        published before it, the same for every sink."""
        if not any(getattr(s, "prepare_event", None) is not None for s in self.sinks):
            return None
        event = self.ring.event_for(state.k)
        try:
            event.encode(state, self.words.published_idx + 1)
        except Exception:  # noqa: BLE001 - the sinks encode it themselves (prepare)
            event.clear()
            self._sink_failed("tick-event", "encode", state.k)
            return None
        return event

    def _prepare_sinks(self, state: CaptionState, event: TickEvent | None) -> None:
        """Sinks that write the tick's encoded event take it now (``prepare_event``); others
        that can encode ahead (``prepare``) do it now; so T(k) only writes."""
        for sink in self.sinks:
            prepare = getattr(sink, "prepare_event", None) if event is not None else None
            arg: Any = event
            if prepare is None:
                prepare, arg = getattr(sink, "prepare", None), state
            if prepare is None:
                continue
            try:
                prepare(arg)
            except Exception:  # noqa: BLE001 - a broken sink must not stop the clock
                self._sink_failed(sink, "prepare", state.k)

    def _emit(self, state: CaptionState, sent_ns: int) -> None:
        for sink in self.sinks:
            try:
                sink.publish(state)
            except Exception:  # noqa: BLE001 - a broken sink must not stop the clock
                self._sink_failed(sink, "publish", state.k)
        c = self.counters
        c.ticks += 1
        err = sent_ns - state.due_ns
        c.publish_error.add(err)
        if err > self._miss_tolerance_ns:
            c.deadline_misses += 1
        if state.fallback:
            c.fallbacks += 1
        if self.events is not None:
            self.events.record(state, sent_ns)
        self.words.mark_published(state)
        self.ring.release(state.k)
        self.last_published_k = state.k
        self._prev = state
        self._stage_done("publish", self.clock.now_ns() - sent_ns)
        if self.observer is not None:
            self.observer.on_publish(state, sent_ns)

    def _stage_done(self, name: str, duration_ns: int) -> None:
        self.counters.stage[name].add(duration_ns)
        on_stage = getattr(self.observer, "on_stage", None)
        if on_stage is not None:
            on_stage(name, duration_ns)

    def _drained(self, k: int) -> bool:
        if self._source_done and self._rec_finished and self.words.tag_flushed \
                and self.words.n_unpublished == 0 \
                and self.grid.audio_end_ns(k) >= samples_to_ns(self.ingest.ingested):
            return True
        if self._done_at_ns is None:
            return False
        if self.clock.now_ns() < self._done_at_ns + int(self.settings.drain_timeout_s * 1e9):
            return False
        lost = self.words.n_unpublished
        log.error("drain timed out at tick %d: %d committed words unpublished "
                  "(recogniser %s)", k, lost, "finished" if self._rec_finished else "busy")
        return True
