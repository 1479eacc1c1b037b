"""One deadline-aware scheduler for every stream's GPU work.

Each stream submits *updates* (decode its current window). One GPU round runs a batch of them
(features, encoder, decoder steps). Per round the scheduler:

1. orders pending updates: streams that have not shown a first caption yet first, then by
   earliest publication deadline;
2. grows the batch in that order while the predicted end of the round (a cost model fitted to
   the rounds measured so far) stays within every member's deadline and within the longest
   round allowed (rounds are not preemptible: this bounds a new stream's wait);
3. *degrades* instead of queueing: an update that cannot finish by its deadline even in a batch
   of its own is not run; its tick publishes the last good state (a fallback) and the stream's
   next update, which covers the same audio and more, replaces it. A newer update from a stream
   also replaces an older one still pending (coalescing), so no stream queues behind itself.

The daemon's batched recogniser picks each batch with it (subd.service.batching: there a
degraded update is answered from the channel's last reading); ``subd bench gpu --simple``
simulates streams on it. Pure Python, no clock of its own: callers pass ``now_ns`` (tests use
exact fake times).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Update:
    stream_id: int
    ready_ns: int  # when the audio it covers was complete
    deadline_ns: int  # its result must exist by then (publication time minus look-ahead)
    first_caption: bool  # the stream has shown nothing yet
    seq: int = 0  # the stream's update counter
    # False: never degraded, and its deadline only orders it (a stream's last decode; a
    # request without a due time, ordered by when it was sent)
    degradable: bool = True


@dataclass(frozen=True, slots=True)
class Plan:
    batch: tuple[Update, ...]
    degraded: tuple[Update, ...]  # fallback published; superseded by the stream's next update
    predicted_end_ns: int


class CostModel:
    """Round cost by batch size: piecewise-linear between measured sizes (calibration points,
    then moved by each measured round at the nearest size, EWMA), a prior line before any."""

    def __init__(self, fixed_ns: int = 20_000_000, per_row_ns: int = 200_000,
                 alpha: float = 0.2):
        self.fixed_ns, self.per_row_ns = float(fixed_ns), float(per_row_ns)
        self.alpha = alpha
        self._points: dict[int, float] = {}  # rows -> cost in ns
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None

    def predict_ns(self, n_rows: int) -> int:
        if n_rows <= 0:
            return 0
        if not self._points:
            return int(self.fixed_ns + self.per_row_ns * n_rows)
        if self._arrays is None:  # rebuilt only after the points change
            rows = np.array(sorted(self._points), dtype=np.float64)
            self._arrays = rows, np.array([self._points[int(r)] for r in rows])
        rows, cost = self._arrays
        if len(rows) == 1:
            return int(cost[0] * max(1.0, n_rows / rows[0]))  # beyond: at least linear
        if n_rows > rows[-1]:  # extrapolate with the last segment's slope
            slope = (cost[-1] - cost[-2]) / (rows[-1] - rows[-2])
            return int(cost[-1] + max(slope, cost[-1] / rows[-1]) * (n_rows - rows[-1]))
        return int(np.interp(n_rows, rows, cost))

    def calibrate(self, n_rows: int, elapsed_ns: int) -> None:
        """A round measured on purpose (before streams are live)."""
        old = self._points.get(n_rows)
        self._arrays = None
        self._points[n_rows] = float(elapsed_ns) if old is None else (old + elapsed_ns) / 2

    def observe(self, n_rows: int, elapsed_ns: int) -> None:
        self._arrays = None
        if not self._points:
            self._points[n_rows] = float(elapsed_ns)
            return
        near = min(self._points, key=lambda r: abs(np.log(r) - np.log(max(n_rows, 1))))
        if abs(np.log(near) - np.log(max(n_rows, 1))) > np.log(1.5):
            self._points[n_rows] = float(elapsed_ns)  # a new size: a new point
            return
        # scale the measurement to the nearest point's size before blending it in
        scaled = elapsed_ns * self.predict_ns(near) / max(self.predict_ns(n_rows), 1)
        self._points[near] += self.alpha * (scaled - self._points[near])
        self._arrays = None


class GpuScheduler:
    """``fill``: the daemon's batched recogniser (subd.service.batching). Every pending
    update joins the round in order, up to ``max_rows``, however that lengthens the round for
    the tightest member (step 2 is left out), and an update is degraded only when its deadline
    passed a whole round ago (``predict_ns(1)``, unpadded): the process is behind, and its
    decode would only add to the backlog. A round of the GPU costs little more for more rows,
    and a member left out waits a whole round: step 2 cut 56-channel batches to 8 on an H100
    (large-v3-turbo size, 448 channels) and 8697 of 9927 updates were degraded. Degraded where
    a round alone would end past the deadline (step 3), 459 of 14720 updates of 1024 tiny.en
    channels were, and the words were shown later (p95 2.37 s against 2.11 s): a degraded
    update decides its due words from the last reading, and a word that reading has not
    seen waits for the next update (MEASUREMENTS, "One scheduler for the batched recogniser")."""

    def __init__(self, cost: CostModel, max_rows: int, safety: float = 1.15,
                 max_round_ns: int | None = None, fill: bool = False):
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        self.cost = cost
        self.fill = fill
        self.max_rows = max_rows
        # a round cannot be interrupted: capping its length bounds how long a newly arrived
        # stream waits before its first caption can even start
        self.max_round_ns = max_round_ns
        self.safety = safety  # predicted costs are inflated by this factor
        self._pending: dict[int, Update] = {}
        self._n_first = 0  # pending updates of streams with no caption yet
        self.n_submitted = self.n_superseded = self.n_degraded = 0

    def submit(self, update: Update) -> Update | None:
        """Queue ``update``; returns the stream's older pending update it replaces, if any."""
        self.n_submitted += 1
        old = self._pending.get(update.stream_id)
        if old is not None:
            self.n_superseded += 1
            self._n_first -= old.first_caption
            # a stream's first caption stays urgent until one has actually been shown
            if old.first_caption and not update.first_caption:
                update = _with_first(update)
        self._pending[update.stream_id] = update
        self._n_first += update.first_caption
        return old

    @property
    def n_pending(self) -> int:
        return len(self._pending)

    @property
    def n_first_pending(self) -> int:
        """Pending updates of streams that have shown no caption yet (the urgent ones)."""
        return self._n_first

    def _predict(self, n_rows: int) -> int:
        return int(self.cost.predict_ns(n_rows) * self.safety)

    def plan(self, now_ns: int, limit: int | None = None) -> Plan:
        """The next batch (at most ``limit`` rows, e.g. the free decode slots) and the updates
        degraded because they cannot make their deadline even alone."""
        cap = self.max_rows if limit is None else min(limit, self.max_rows)
        order = sorted(self._pending.values(),
                       key=lambda u: (not u.first_caption, u.deadline_ns, u.stream_id))
        batch: list[Update] = []
        degraded: list[Update] = []
        tightest = None
        memo: dict[int, int] = {}  # the cost model is asked once per size, not per update

        def predict(rows: int) -> int:
            if rows not in memo:
                memo[rows] = self._predict(rows)
            return memo[rows]

        # hopeless once now + ``ahead`` is past a deadline: a round alone would end after it;
        # filling, the deadline passed a round ago (class docstring)
        ahead = -self.cost.predict_ns(1) if self.fill else predict(1)
        for u in order:
            if not u.degradable:  # no due time to keep: it goes in its turn
                if len(batch) < cap:
                    batch.append(u)
                continue
            if now_ns + ahead > u.deadline_ns:
                degraded.append(u)  # hopeless even alone: publish the fallback, don't queue
                continue
            if len(batch) >= cap:
                continue
            if self.fill:
                batch.append(u)
                continue
            limit = u.deadline_ns if tightest is None else min(tightest, u.deadline_ns)
            if self.max_round_ns is not None and batch and \
                    predict(len(batch) + 1) > self.max_round_ns:
                continue
            if now_ns + predict(len(batch) + 1) <= limit:
                batch.append(u)
                tightest = limit
        for u in batch + degraded:
            del self._pending[u.stream_id]
            self._n_first -= u.first_caption
        self.n_degraded += len(degraded)
        return Plan(tuple(batch), tuple(degraded), now_ns + predict(len(batch)))

    def done(self, plan: Plan, elapsed_ns: int) -> None:
        if plan.batch:
            self.cost.observe(len(plan.batch), elapsed_ns)


def _with_first(u: Update) -> Update:
    return Update(u.stream_id, u.ready_ns, u.deadline_ns, True, u.seq, u.degradable)
