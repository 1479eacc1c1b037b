"""The recognise half of the tick pipeline: whenever enough new audio is in, one update in the
recogniser worker, sent with the deadline and encoder span the planner chose
(subd.pipeline.deadline); at the stream's end the last decode, after the words due before it can
be in were decided from the last reading. With ``[recognizer] update_cost_ms`` the updates go out
on the audio's own clock (subd.pipeline.schedule). :class:`RecognitionLoop` is mixed into
:class:`~subd.pipeline.scheduler.Pipeline`, whose streams, planner and counters it uses.
"""

from __future__ import annotations

import logging
from typing import Any

from subd.pipeline.schedule import AudioSchedule
from subd.pipeline.ticks import NS_PER_MS
from subd.tasks import start_task
from subd.workers.hosts import FinishRequest, UpdateRequest

log = logging.getLogger("subd.pipeline.scheduler")


class RecognitionLoop:
    """Recognition, for :class:`~subd.pipeline.scheduler.Pipeline` (which sets every attribute
    used here: clock, settings, grid, ingest, planner, recogniser, counters, prompt)."""

    async def _recognise_loop(self) -> None:
        step = max(self.settings.min_update_ms * 16, 1)
        # [recognizer] update_cost_ms: updates on the audio's own clock (subd.pipeline.schedule)
        planned = None if not self.settings.update_cost_ms else AudioSchedule(
            step, self.settings.update_cost_ms * NS_PER_MS, float(self.grid.rate))
        step = step if planned is None else planned.step
        release = None if planned is None else start_task(
            planned.release(self.clock, self._integrate), "pipeline:release")
        try:
            await self._recognise(step, planned, release)
        finally:
            if release is not None:
                release.cancel()

    async def _recognise(self, step: int, planned: AudioSchedule | None, release: Any) -> None:
        sent, plan = 0, None
        while True:
            while not self._source_done and self.ingest.ingested - sent < step:
                self._audio_event.clear()
                await self._audio_event.wait()
            end = self.ingest.ingested
            sent_ns = planned_ns = self.clock.now_ns()
            final = self._source_done
            if planned is not None:  # the end of the stream too, as if planned
                skipped = planned.skipped
                end, final, planned_ns = planned.next(sent, end, self._live_ns)
                if planned.skipped > skipped:
                    self._skipped()
            if final and planned is None and sent:
                # the stream's last decode runs on Whisper's full input: the words due before
                # it can be in are decided first, from the last reading (no new audio: no decode)
                due = UpdateRequest(sent, self.planner.finish_until(self.grid, sent_ns),
                                    full_span=plan is not None and plan.full_span, ending=True,
                                    prompt=self.prompt)
                self._integrate(await self.recogniser.call(due, sent_ns))
                sent_ns = planned_ns = self.clock.now_ns()
            plan = None if final else self.planner.plan(self.grid, planned_ns)
            request = FinishRequest(end, self.prompt) if plan is None else UpdateRequest(
                end, plan.commit_until_ns, full_span=plan.full_span, due_ns=plan.due_ns,
                first_caption=not self._captioned, prompt=self.prompt)
            result = await self.recogniser.call(request, sent_ns)
            if result.degraded:
                self._degraded_update()
            if plan is not None and result.decoded:  # a silent window costs next to nothing
                # the round trip, and the recogniser's own part of it (the rest: the wait
                # behind other channels sharing the worker)
                self.planner.record(plan, self.clock.now_ns() - sent_ns, result.duration_ns)
            sent = end
            if planned is not None:  # shown no sooner than planned
                planned.hold(planned_ns + planned.cost_ns, result, final)
                if final:
                    await release
                    return
                continue
            self._integrate(result, final)
            if final:
                return

    def _degraded_update(self) -> None:
        self.counters.updates_degraded += 1
        if self.counters.updates_degraded == 1:
            log.warning("the shared recogniser could not make an update's due time: its due "
                        "words were decided from the last reading (degraded updates)")

    def _skipped(self) -> None:
        self.counters.updates_skipped += 1
        if self.counters.updates_skipped == 1:
            log.warning("the recogniser is behind its planned update schedule: updates "
                        "skipped (raise [recognizer] update_cost_ms or the cadence)")

    def _live_ns(self, sample: int) -> int:
        """When audio up to ``sample`` was live: the end of the tick that holds its last
        sample, on the tick grid (the same for every device, however late it is sent)."""
        k = self.grid.tick_of_sample(max(sample - 1, 0))
        grid = self._grid_prev if self._grid_prev is not None and k < self._switch_k \
            else self.grid  # the grid tick k is due on (a live change of D: the one before)
        return grid.due_ns(k) - grid.latency_ns
