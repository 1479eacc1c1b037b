"""Recogniser updates on the audio's own clock: ``[recognizer] update_cost_ms = N``.

By default a channel sends its next update once a cadence of new audio is in and its last
answer is back, and the planner (subd.pipeline.deadline) measures what updates cost: a faster
device gets its answers back sooner and leaves the words more right context, so the captions
depend on the device and its load. With a planned cost the captions depend on the audio alone:

* update i covers the audio up to i cadences exactly, whenever it is sent;
* it is planned as a channel's serial recogniser taking N ms would run it: sent when that audio
  was live, or when the update before was back, whichever is later, and back N ms after
  (``UpdatePlanner(planned_cost_ms=N)`` plans each word's decision from that time);
* its result is shown no sooner than planned: the tentative tail and the words the tagger sees
  at each tick are those of a device that just keeps up.

A device that keeps up (each answer back by its planned time) then publishes the same caption
states for the same audio, a CPU and a GPU alike (tests/test_planned_cost.py; float32 on both:
rounding apart). The cadence is no shorter than N (a device planned to take N per update keeps
up with no faster one). An answer back later than planned shows its words late; a recogniser
``SLACK_STEPS`` cadences behind the audio skips to the last cadence heard, and the skip is
counted.
"""

from __future__ import annotations

import asyncio
import collections
import math
from collections.abc import Callable
from typing import Any

SLACK_STEPS = 2  # one step late is the jitter of a device that keeps up on average
MIN_STEP_SAMPLES = 320  # one 20 ms source chunk


class AudioSchedule:
    """Which audio each update covers, and when its result may be shown."""

    def __init__(self, step_samples: int, cost_ns: int, rate: float = 1.0) -> None:
        # no faster than an update is planned to last: a planned device keeps up
        self.step = max(step_samples, MIN_STEP_SAMPLES, math.ceil(cost_ns * 16 * rate / 1e6))
        self.cost_ns = cost_ns
        self.skipped = 0
        self._back_ns = 0  # when the update before is planned to be back
        self._held: collections.deque = collections.deque()  # (show at ns, result, final)
        self._ready = asyncio.Event()

    def next(self, sent: int, heard: int, live_ns: Callable[[int], int]) -> tuple[int, bool, int]:
        """(end sample, final, planned sending time) of the update after the one that ended at
        ``sent``, ``heard`` samples in; ``live_ns(sample)``: when audio up to it was live."""
        due = sent + self.step
        late = SLACK_STEPS * self.step
        if heard - due >= late:  # the recogniser is behind: the last cadence heard
            due = heard // self.step * self.step
            self.skipped += 1
        end, final = (heard, True) if heard < due else (due, False)
        sent_ns = max(live_ns(end), self._back_ns)  # the end of a stream: right after the last
        self._back_ns = sent_ns + self.cost_ns
        return end, final, sent_ns

    def hold(self, show_ns: int, result: Any, final: bool) -> None:
        self._held.append((show_ns, result, final))
        self._ready.set()

    async def release(self, clock: Any, integrate: Any) -> None:
        """Runs for the stream: hands each held result to ``integrate(result, final)`` at its
        time, in order; returns after the final one."""
        while True:
            while not self._held:
                self._ready.clear()
                await self._ready.wait()
            show_ns, result, final = self._held.popleft()
            await clock.sleep_until(show_ns, precise=False)
            integrate(result, final)
            if final:
                return
