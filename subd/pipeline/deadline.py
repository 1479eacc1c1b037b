"""When the recogniser must decide, and over how much of Whisper's input it encodes.

Each recogniser update is sent with a deadline (``UpdateRequest.commit_until_ns``; DESIGN, "The
promise" 5): the words of every tick whose look-ahead fetch ``T(k) − A`` comes before the *next*
update's result can be in are decided by this one; later words wait for a hypothesis with more
right context. An update's cost is a high quantile of the last round trips of its kind (they
include queueing behind other channels).

The encoder span is chosen here too, per update (``[recognizer] encoder_span``):

* ``"cut"`` (default): the recogniser's own span, the window plus ``encoder_pad_ms``, rounded up
  to ``encoder_bucket_ms``; the window keeps up to ``trim_after_ms`` (15 s) of committed audio,
  the sentence the due words belong to. Its cost grows with the window (tiny.en int8 on one core
  of the 2-core Xeon: 0.09-0.17 s an update at p50, against 0.28-0.30 s for the full input).
  A channel's first words are the exception: until it has committed a word (``started``, set by
  the pipeline) a channel that has its recogniser to itself decodes on the full input where that
  leaves the due words ``FULL_SPAN_CONTEXT_NS`` of right context. Those words have no words
  before them, and the cut span's short window read them worse (dev "Unless to be" -> "A less
  to be", "And Mr. John" -> "Mr John"; held-out "It imitates a much freer hand" -> "Imitate so
  much for your hand"): `subd bench quality --pace cpu --update-ms 300,170`, D = 2 s, WER dev
  6.3 -> 6.0 %, held-out 7.3 -> 5.5 % (docs/MEASUREMENTS.md, "A stream's first words on the
  full input").
* ``"full"``: Whisper's whole 30 s input, as offline transcription: the same cost whatever the
  window holds.
* ``"auto"``: full whenever that still leaves the due words ``FULL_SPAN_CONTEXT_NS`` of right
  context (or, for a channel that waits behind others, nearly as much as the cut span would);
  otherwise the cut span. At D = 1 s on that core the full input leaves ~0 s of right context;
  a threshold of 0 made the choice flap from update to update, so 0.75 s keeps D = 1 s on the
  cut span and D = 2 s on the full input there. On a GPU (both spans cost little) it is the
  full input at every D.

``"auto"`` was the default until 2026-12-05; it was chosen on the joined sets, one draw, when the
cut span kept 6 s and still lost a stream's first words. Measured since (``subd bench quality
--pace cpu --repeats 3``, every update its own CPU time, three draws, WER dev / held-out,
docs/MEASUREMENTS.md "The cut span by default"), D = 2 s: each clip a stream, auto 6.9 / 7.7 %,
cut with 15 s kept 6.1 / 6.0 % (offline, the same draws, 4.2 / 5.9 %); the sets joined as one
long stream, auto 6.4 / 6.9 %, cut 6.1 / 5.7 % (offline 3.7 / 5.5), ',' F1 0.40 / 0.61 against
0.58 / 0.65. Whisper reads a word as well from the window with its sentence as from the whole
30 s, and the cheaper updates leave the words more right context.

Both kinds are measured on the channel's first two decoded updates, and the one not in use is
measured again every ``PROBE_EVERY`` updates (load and devices change); until measured, a kind
is assumed to cost what the recogniser's process measured before the channel's first words
(``expect``, subd.recognise.warmup), else ``FIRST_COST_NS``, and no less than the other kind
was measured to cost.

Channels sharing one serial recogniser (the daemon on the CPU): a round trip is the wait behind
the other channels' updates plus the update's own run, and the span is chosen on those two
(the wait costs both kinds alike; the full input's own 0.45 s against the cut span's 0.14 s is
what differs). Such a channel probes the cut span first, and does not probe the full input
while it waits behind others and the full input could not pay (``_probe_due``). subd bench
serial, 4 tiny.en channels on one modelled core: visible p95 2.45 -> 2.03 s.

The next result is in one update cost after this one's, of the kind the *next* update will be.
Round trips that vary (a batched recogniser: a channel's answer waits for its whole batch, and
batches differ in size and span) come in later than two quantiles of single costs say, so the
planner also measures the horizon itself, from an update's sending to the next result, and
expects the next result no sooner than the largest of the last 20 of the same pair of update
kinds (a probe of the full input is not the horizon of the cut updates after it) (subd bench gpu
--device cpu, 2 channels batched: 8-14 of ~105 words were committed after their tick's fetch,
nearly all deferred words whose next result came 0.3-1 s after the estimate; on a fake clock
with round trips of 300 or 900 ms, tests/test_batched_deadline.py: 6-18 of 70 words late, p95
shown 2.29-2.69 s at D = 2 s, and 1-4 with the horizon, p95 2.00-2.09 s).

A planned cost (``[recognizer] update_cost_ms = N``): every update is planned as lasting N ms
(both spans; ``"auto"`` is then the full input) from when it is planned to be sent, not from
when it was sent, and updates go out on the audio's own clock (subd.pipeline.schedule). Which
update decides each word then depends on the audio alone: a GPU and a CPU that both keep up
give the same captions for the same audio, and a late result only shows its words late.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

from subd.pipeline.ticks import NS_PER_MS, TickGrid
from subd.types import DEFAULT_ENCODER_SPAN, ENCODER_SPANS, UpdateCosts

# An update is expected to cost the 70th percentile of the last 10 round trips of its kind,
# plus a margin for the event loop to integrate the result. The slowest of the 10 gave words
# 0.3 s less right context at D = 1 s (every word heard out committed at once); p70 still had
# every word in by its fetch (subd bench quality --pace cpu, LibriVox dev set), and a word
# whose next update runs long is late by that excess only.
UPDATE_COSTS_KEPT = 10
UPDATE_COST_QUANTILE = 0.7
UPDATE_MARGIN_NS = 30_000_000
# a recogniser that measured nothing before the first words (a plugged-in one): tiny.en int8 on
# one core, the cut span 0.12-0.15 s an update, the full input 0.38-0.42 s
FIRST_COST_NS = {False: 150_000_000, True: 400_000_000}
FULL_SPAN_CONTEXT_NS = 750_000_000
# A channel that waits behind others (a loaded GPU: round trips ~1 s, mostly the batch in
# flight) takes the full input also when it costs the due words at most this much context:
# the 0.75 s alone moved such channels between the spans as the wait rose and fell (tried,
# not kept: docs/MEASUREMENTS.md, "The cut span on a loaded GPU"). A channel that does not
# wait keeps the 0.75 s: at D = 1 s on a fast device the full input's 0.4-0.55 s read worse
# than the cut span's 0.55-0.6 s (dev WER 9.4 / 8.3 % against 6.9 / 6.9 % at 200/70 and 60/30
# ms an update, subd bench quality --pace cpu --per-clip)
FULL_SPAN_SLACK_NS = 150_000_000
WAITING_NS = 150_000_000
# D = 2 s on one core sat near the threshold: in a loaded run the full input's p70 cost rose
# past 0.53 s and 41 of 185 updates were full, the rest cut (dev WER 12.2 % that run)
FULL_SPAN_HYSTERESIS_NS = 300_000_000
# updates (~1 min at 200 ms): the span not in use is measured again. A probe of the full input
# where it loses costs that update's due words right context
PROBE_EVERY = 300
# how long after an update was sent the next result came in: the last HORIZONS_KEPT of them,
# and the next result is expected no sooner than the largest (where round trips are steady, as
# on one CPU core, that is the estimate from the two costs). The largest of 20 is later than
# the next horizon 20 times in 21 (the second largest: 19 in 21)
HORIZONS_KEPT = 20
# Several channels share one serial recogniser (the daemon's CPU default): a round trip is the
# wait behind the other channels' updates plus this update's own run (RecogniseResult's
# duration_ns). The span is chosen on the wait plus each kind's own cost, not on each kind's
# round trips: those were measured while the other channels sent what they sent then, and 4
# tiny.en channels on one core (wait ~0.4 s behind three cut updates) kept choosing the full
# input where its 0.45 s left the due words no right context, and made the others wait too


@dataclass(frozen=True, slots=True)
class UpdatePlan:
    commit_until_ns: int  # audio time: every word ending by then is decided by this update
    full_span: bool  # the encoder runs over Whisper's whole input
    sent_ns: int = 0  # when it was planned (sent)
    # when its result must be in: the look-ahead fetch T(k) - A of the first tick whose words
    # the update before did not decide (the tick that update's plan expected this result by)
    due_ns: int | None = None


class UpdatePlanner:
    def __init__(self, span: str = DEFAULT_ENCODER_SPAN, min_update_ms: int = 200,
                 shared: bool | Callable[[], bool] = False, planned_cost_ms: int = 0) -> None:
        if span not in ENCODER_SPANS:
            raise ValueError(f"encoder span {span!r}: one of {', '.join(ENCODER_SPANS)}")
        self.span = span
        # 0: costs as measured; N: every update planned as lasting N ms (module docstring)
        self.planned_cost_ns = planned_cost_ms * NS_PER_MS
        # the recogniser serves other channels too (see _probe_due): asked at each probe
        self.shared: Callable[[], bool] = shared if callable(shared) else (lambda: shared)
        self.min_update_ms = min_update_ms
        # what a kind costs until this channel's own updates measured it (see expect)
        self.first_cost_ns = dict(FIRST_COST_NS)
        self._costs = {kind: collections.deque(maxlen=UPDATE_COSTS_KEPT)
                       for kind in (False, True)}
        self.n_full = 0
        # plan number of each kind's last measured (decoded) update, None: never
        self._last_measured: dict[bool, int | None] = {False: None, True: None}
        self._n_plans = 0
        self._on_full = False  # the last choice that was not a probe
        # the channel has committed words (set by the pipeline): until then "cut" gives way
        # to the full input where that pays (module docstring)
        self.started = False
        self._due_k = 0  # the first tick whose words no update planned so far must decide
        # send to next result, ns, by the kinds of the two updates: a probe of the full input
        # (base on one core: 1.35 s against 0.4 s cut) is not the horizon of cut updates
        self._horizons: dict[tuple[bool, bool], collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=HORIZONS_KEPT))
        self._recorded_full = False  # the kind of the update last recorded
        self._recorded: tuple[int, int] | None = None  # (plan number, sent_ns) last recorded
        # own run time of each kind, and the wait before it (round trip less run time)
        self._runs = {kind: collections.deque(maxlen=UPDATE_COSTS_KEPT) for kind in (False, True)}
        self._waits: collections.deque = collections.deque(maxlen=UPDATE_COSTS_KEPT)

    def expect(self, costs: UpdateCosts) -> None:
        """Start from the update costs the recogniser's process measured (the full input, the
        cut span) instead of an idle core's tiny.en."""
        self.first_cost_ns = {True: max(1, costs.full_ns), False: max(1, costs.cut_ns)}
        # both kinds are measured: the first updates need not probe them (base on one core:
        # a probe of the full input at a stream's start cost its first words 1.35 s)
        self._last_measured = {False: self._n_plans, True: self._n_plans}

    def cost_ns(self, full: bool) -> int:
        if self.planned_cost_ns:
            return self.planned_cost_ns
        if not self._costs[full]:
            # never measured: no cheaper than the other kind was (a loaded machine or a
            # batched recogniser makes both dearer than an idle core's first guess)
            return max([self.first_cost_ns[full], *self._costs[not full]])
        return _quantile(self._costs[full])

    def choice_cost_ns(self, full: bool) -> int:
        """What an update of this kind is expected to take from sending to its result, for the
        choice of span: the wait measured lately, whatever kind the update was, plus this
        kind's own run; the round trips of the kind where run times were not measured."""
        if not self._waits:  # no run time measured yet
            return self.cost_ns(full)
        runs = self._runs[full]
        # never run: the other kind's run scaled as the two first costs are (as measured
        # before the first words, or an idle core's tiny.en: the full input 0.4 s, the cut
        # span 0.15 s), and no less than this kind's first cost. "No
        # cheaper than the other kind", as in cost_ns, let the full input's probe pay where a
        # loaded core ran the cut span in 0.41 s (subd run, 4 channels at load average 6)
        first = self.first_cost_ns
        other = _quantile(self._runs[not full]) * first[full] // first[not full]
        own = _quantile(runs) if runs else max(first[full], other)
        return _quantile(self._waits) + own

    def horizon_ns(self, kinds: tuple[bool, bool] | None = None) -> int:
        """How long after an update is sent the next result is in, as measured (0: not yet):
        for an update of kind ``kinds[0]`` followed by one of ``kinds[1]``, or any."""
        if self.planned_cost_ns:
            return 0  # planned, not measured
        if kinds is None:
            return max((max(h) for h in self._horizons.values() if h), default=0)
        return max(self._horizons[kinds], default=0)

    def record(self, plan: UpdatePlan, cost_ns: int, run_ns: int | None = None) -> None:
        """``cost_ns``: the round trip, from sending to the result; ``run_ns``: the
        recogniser's own part of it (the rest waited for other channels' updates)."""
        self._costs[plan.full_span].append(cost_ns)
        if run_ns is not None and 0 < run_ns <= cost_ns:
            self._runs[plan.full_span].append(run_ns)
            self._waits.append(cost_ns - run_ns)
        self._last_measured[plan.full_span] = self._n_plans
        # this is the next result of the update before, if that one was recorded too
        if self._recorded is not None and self._recorded[0] == self._n_plans - 1:
            self._horizons[self._recorded_full, plan.full_span].append(
                plan.sent_ns + cost_ns - self._recorded[1])
        self._recorded = (self._n_plans, plan.sent_ns)
        self._recorded_full = plan.full_span

    def finish_until(self, grid: TickGrid, now_ns: int) -> int:
        """The deadline of a stream's last decode, sent now: it runs on Whisper's full input,
        and the words of every tick whose fetch comes before its result can be in are decided
        from the last hypothesis (base on one core: the last words of a clip were shown 0.6 s
        later than D)."""
        next_in = now_ns + UPDATE_MARGIN_NS + self.cost_ns(True)
        k = grid.first_due_at_or_after(next_in + grid.lookahead_ns)
        return grid.audio_end_ns(k - 1) if k > 0 else 0

    def plan(self, grid: TickGrid, now_ns: int) -> UpdatePlan:
        gap = int(self.min_update_ms * NS_PER_MS / grid.rate)
        full = self._choose_full(grid, gap)
        self._n_plans += 1
        self.n_full += full
        # the next result is in one update cost after this one's, or after the audio for the
        # next update has arrived, and that update may be of the other kind (a probe); and no
        # sooner than the horizons measured say
        next_kind = self._next_kind(full, grid, gap)
        next_in = now_ns + UPDATE_MARGIN_NS + max(
            max(self.cost_ns(full), gap) + self.cost_ns(next_kind),
            self.horizon_ns((full, next_kind)))
        k = grid.first_due_at_or_after(next_in + grid.lookahead_ns)  # first fetch after it
        due_ns, self._due_k = grid.fetch_ns(self._due_k), max(self._due_k, k)
        return UpdatePlan(grid.audio_end_ns(k - 1) if k > 0 else 0, full, now_ns, due_ns)

    def _next_kind(self, full: bool, grid: TickGrid, gap_ns: int) -> bool:
        """The kind the next update will be, as things stand: a probe due then, else this."""
        if self.span != "auto" or self.planned_cost_ns:
            return full
        probe = self._probe_due(self._n_plans + 1, grid, gap_ns, full)
        return full if probe is None else probe

    def _probe_due(self, n_plans: int, grid: TickGrid, gap_ns: int,
                   measuring: bool | None = None) -> bool | None:
        """The kind that update number ``n_plans`` measures, or None. Each kind is measured
        first (``measuring``: the kind the update before is measuring), and each again every
        PROBE_EVERY updates; a probe that decoded nothing (silence: the stream's first
        updates) measured nothing and is made again.

        A recogniser shared with other channels is probed on the cut span first, and while
        this channel waits behind other updates (the wait at least one first cut update)
        the full input is not probed where it cannot pay: 4 tiny.en channels starting on one
        core each probed the full input first, each probe holding the three others' updates
        back by its 0.45 s (subd bench serial --update-ms 600,190: 35 of 41 late words were in
        a channel's first 9 s)."""
        for kind in ((False, True) if self.shared() else (True, False)):
            last = self._last_measured[kind]
            if last is None and kind == measuring:
                continue
            if last is None or n_plans - last >= PROBE_EVERY:
                if kind and self._waits and _quantile(self._waits) >= self.first_cost_ns[False] \
                        and not self._full_pays(grid, gap_ns, False):
                    continue
                return kind
        return None

    def _full_pays(self, grid: TickGrid, gap_ns: int, on_full: bool) -> bool:
        """Whether the full input leaves the due words FULL_SPAN_CONTEXT_NS of right context (or,
        waiting behind others, nearly as much as the cut span); ``on_full``: down to
        FULL_SPAN_HYSTERESIS_NS less (an update's cost moves with the load, and a choice that
        flips every few updates decides words from hypotheses of both kinds)."""
        budget = grid.latency_ns - grid.lookahead_ns - UPDATE_MARGIN_NS

        def context(full: bool) -> int:  # the right context due words get (wall ns)
            cost = self.choice_cost_ns(full)
            return budget - max(cost, gap_ns) - cost

        need = FULL_SPAN_CONTEXT_NS - (FULL_SPAN_HYSTERESIS_NS if on_full else 0)
        full_ctx = context(True)
        if full_ctx >= need:
            return True
        # short of it: the cut span, unless this channel waits behind others (below)
        waiting = _quantile(self._waits) >= WAITING_NS  # 0 while no wait was measured
        return waiting and full_ctx >= context(False) - FULL_SPAN_SLACK_NS

    def _choose_full(self, grid: TickGrid, gap_ns: int) -> bool:
        if self.planned_cost_ns:
            # a planned cost is the same for both kinds: the full input leaves as much context
            return self.span != "cut"
        if self.span == "cut" and not self.started and not self.shared():
            return self._full_pays(grid, gap_ns, False)  # a channel's first words
        if self.span != "auto":
            return self.span != "cut"
        probe = self._probe_due(self._n_plans, grid, gap_ns)
        if probe is not None:
            return probe
        self._on_full = self._full_pays(grid, gap_ns, self._on_full)
        return self._on_full


def _quantile(values) -> int:
    """UPDATE_COST_QUANTILE of ``values`` (0 when there are none)."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(UPDATE_COST_QUANTILE * len(ordered)))]
