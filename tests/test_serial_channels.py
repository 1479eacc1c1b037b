"""Several channels of one daemon sharing its serial recogniser (the CPU default; issue 17's CPU
point: 4 tiny.en channels, 0 misses and 0 fallbacks at D = 2 s, words shown within D + 0.3 s at
p95).

Each channel's round trip is then the wait behind the other channels' updates plus its own
update. Runs the daemon's SharedWorker over a MultiplexHost and one pipeline per channel on a
fake clock, updates lasting one idle core's modelled costs (tiny.en int8: the full input 450 ms,
the cut span 140 ms).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from subd.clock import FakeClock
from subd.history import AudioHistory
from subd.pipeline.deadline import UpdatePlanner
from subd.pipeline.scheduler import Pipeline, TickSettings
from subd.pipeline.ticks import TickGrid
from subd.service.multiplex import MultiplexHost
from subd.service.stages import SharedWorker
from subd.sources.live import FileSource
from subd.types import SAMPLE_RATE_HZ
from subd.workers.hosts import FactorySpec, TagHost
from subd.workers.process import InlineWorker
from tests.test_scheduler import ListSink

MS = 1_000_000
T0_NS = 5_000_000_000
D_MS = 2000
COST_MS = {True: 450, False: 140}  # tiny.en int8 on one idle core: full input, cut span


def _shared_channels(n: int, seconds: float, stagger_ms: int):
    """``n`` channels (tests.test_deadline's scripted recogniser: a word every 0.4 s) start
    ``stagger_ms`` apart and share one serial recogniser worker: per channel, its pipeline and
    each committed word's shown latency (its tick's publication minus the word's end), ms."""

    def delay(request) -> int:
        inner = getattr(request, "request", None)  # ForChannel(UpdateRequest); attach: free
        return COST_MS[inner.full_span] * MS if hasattr(inner, "full_span") else 0

    async def main():
        clock = FakeClock(start_ns=T0_NS)
        shared = SharedWorker(InlineWorker("recognise", MultiplexHost(None), clock, delay))
        runs = []

        async def channel(i: int) -> None:
            await clock.sleep_until(T0_NS + i * stagger_ms * MS)
            history = AudioHistory(SAMPLE_RATE_HZ * 40)
            worker = await shared.attach(f"c{i}", FactorySpec(
                "subd.workers.hosts:RecogniserHost", {
                    "recognizer": FactorySpec("tests.test_deadline:DeadlineRecognizer",
                                              {"n_words": int((seconds - 1) / 0.4)}),
                    "history_capacity": history.capacity, "history": history}))
            sink = ListSink()
            pipeline = Pipeline(
                clock=clock, settings=TickSettings(latency_ms=D_MS, drain_timeout_s=60),
                source=FileSource(np.zeros(int(seconds * SAMPLE_RATE_HZ), np.float32)),
                recogniser=worker, tagger=InlineWorker("tag", TagHost(None), clock,
                                                       lambda r: 5 * MS),
                history=history, sinks=[sink])
            runs.append((pipeline, sink))
            await pipeline.run()

        task = asyncio.ensure_future(asyncio.gather(*(channel(i) for i in range(n))))
        await clock.run_until_done(task, limit_ns=T0_NS + int((seconds + 90) * 1e9))
        task.result()
        return runs

    out = []
    for pipeline, sink in asyncio.run(main()):
        grid = pipeline.grid
        shown = np.array([grid.due_ns(s.k) - grid.t0_ns - tw.word.end_ns
                          for s in sink.states for tw in s.committed]) / MS
        out.append((pipeline, shown))
    return out


@pytest.mark.parametrize("stagger_ms", [0, 170])
def test_four_channels_on_one_serial_recogniser_show_their_words_in_time(stagger_ms):
    """4 channels, one serial worker: every channel's words within D + 0.3 s at p95, at most
    one in twenty after its own tick, no deadline miss, no fallback; the channels stay on the
    cut span (the full input's 0.45 s behind three other updates left no right context).
    Before the planner told the wait from the update's own run: p95 2.37 s, 87-91 of 280 words
    late, half the channels on the full input."""
    runs = _shared_channels(4, 30.0, stagger_ms)
    shown = np.concatenate([s for _, s in runs])
    assert len(shown) == 4 * 72  # every word of every channel shown once
    assert np.percentile(shown, 95) <= D_MS + 300
    assert (shown > D_MS + 1000 / 30 + 1).mean() <= 0.05
    for pipeline, _ in runs:
        assert pipeline.counters.deadline_misses == 0
        assert pipeline.counters.fallbacks == 0
        assert pipeline.planner.n_full <= 3  # its first update's probe, and little more


def test_the_span_is_chosen_on_the_wait_plus_the_updates_own_run():
    """Alone on the worker (no wait) the full input leaves ~0.9 s of right context and is
    chosen; behind three other channels' cut updates (0.42 s wait) it would leave none, and
    the cut span is chosen, though the full input's round trips measured when the others
    waited as long were no slower than the cut span's."""
    grid = TickGrid.create("30", T0_NS, D_MS, 150)

    def steady_choice(wait_ms: int, full_rtt_ms: int) -> bool:
        planner = UpdatePlanner("auto")
        now = T0_NS + 1000 * MS
        for full in (True, False):  # the two probes: each kind measured once
            plan = planner.plan(grid, now)
            assert plan.full_span == full
            rtt = full_rtt_ms if full else wait_ms + COST_MS[False]
            planner.record(plan, rtt * MS, COST_MS[full] * MS)
            now += rtt * MS
        return planner.plan(grid, now).full_span

    assert steady_choice(0, COST_MS[True])
    assert not steady_choice(420, 420 + COST_MS[False])  # full measured while others waited
    assert not steady_choice(420, 420 + COST_MS[True])


def test_bench_serial_runs_channels_of_real_speech_through_the_shared_recogniser(capsys):
    """``subd bench serial``: real tiny.en on the LibriVox clips, 2 channels on the fake clock
    with modelled update costs: every word shown, none before D, no deadline miss, and the
    line says so (words, late words by cause, misses, fallbacks)."""
    from subd.cli import main

    assert main(["bench", "serial", "--streams", "2", "--duration-s", "6", "--ramp-s", "1"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("N=2 ")
    words = int(line.split(" words=")[1].split()[0])
    assert words >= 20  # two channels of 6 s of read speech
    assert "deadline misses 0, fallbacks 0" in line
    p50 = float(line.split("visible p50/p95/max ")[1].split("/")[0])
    assert 2000 <= p50 <= 2100


def test_behind_other_channels_the_full_input_is_not_probed_where_it_cannot_pay():
    """A recogniser shared with other channels is probed on the cut span first. Behind three
    other channels' cut updates (a 0.42 s wait) the full input is never probed: each probe
    would have held the others back by its 0.45 s. Once the others are gone (no wait) it is
    probed, and chosen (alone, it leaves ~0.9 s of right context)."""
    grid = TickGrid.create("30", T0_NS, D_MS, 150)
    planner = UpdatePlanner("auto", shared=True)
    now = T0_NS + 1000 * MS
    kinds = []
    for i in range(40):
        plan = planner.plan(grid, now)
        kinds.append(plan.full_span)
        wait_ms = 420 if i < 20 else 0
        rtt_ms = wait_ms + COST_MS[plan.full_span]
        planner.record(plan, rtt_ms * MS, COST_MS[plan.full_span] * MS)
        now += rtt_ms * MS
    assert not any(kinds[:20])
    assert kinds[-1] and kinds.index(True) < 30
    # alone on its worker (not shared), the full input is measured first, as before
    assert UpdatePlanner("auto").plan(grid, T0_NS + 1000 * MS).full_span


def test_a_slow_cut_span_does_not_make_the_unmeasured_full_input_look_as_cheap():
    """A loaded core (subd run, 4 channels, load average 6): cut updates ran 0.3-0.6 s behind
    waits of 1-2 s. The full input, not measured yet, is taken to cost what the cut span did
    scaled as on an idle core (x 2.7), not as much as the cut span: it is not probed where
    every kind leaves no right context (before: equal costs, the full input won on the slack,
    and its probe held the other channels back by 0.85 s)."""
    grid = TickGrid.create("30", T0_NS, D_MS, 150)
    planner = UpdatePlanner("auto", shared=True)
    now = T0_NS + 1000 * MS
    kinds = []
    for _ in range(12):
        plan = planner.plan(grid, now)
        kinds.append(plan.full_span)
        run_ms = 850 if plan.full_span else 420
        planner.record(plan, (1300 + run_ms) * MS, run_ms * MS)
        now += (1300 + run_ms) * MS
    assert not any(kinds)


def test_a_channel_alone_on_the_shared_recogniser_is_planned_as_one_on_its_own():
    """The daemon gives every channel a ChannelWorker onto its shared recogniser, also when it
    runs one channel (`subd stream`): that channel is planned as one alone (on encoder_span
    "auto", the full input measured first, as `subd bench quality` measures it), and as shared
    once a second channel attaches."""

    async def main() -> list[bool]:
        clock = FakeClock(start_ns=T0_NS)
        shared = SharedWorker(InlineWorker("recognise", MultiplexHost(None), clock))
        grid = TickGrid.create("30", T0_NS, D_MS, 150)
        first = []
        for name in ("c0", "c1"):
            history = AudioHistory(SAMPLE_RATE_HZ * 40)
            worker = await shared.attach(name, FactorySpec(
                "subd.workers.hosts:RecogniserHost", {
                    "recognizer": FactorySpec("tests.test_deadline:DeadlineRecognizer",
                                              {"n_words": 3}),
                    "history_capacity": history.capacity, "history": history}))
            pipeline = Pipeline(
                clock=clock, settings=TickSettings(latency_ms=D_MS, encoder_span="auto"),
                source=FileSource(np.zeros(SAMPLE_RATE_HZ, np.float32)), recogniser=worker,
                tagger=InlineWorker("tag", TagHost(None), clock), history=history,
                sinks=[ListSink()])
            first.append(pipeline.planner.plan(grid, T0_NS + 1000 * MS).full_span)
        return first

    assert asyncio.run(main()) == [True, False]  # alone: full input first; with c0: cut first


def test_bench_serial_times_updates_in_the_daemons_own_recogniser_process(capsys):
    """``--update-ms ''``: the updates run in the recogniser process ``subd run`` starts
    (ProcessWorker over the MultiplexHost, audio in shared memory) and last their CPU time
    there on the held fake clock: words are shown at D, and the line gives each kind's own
    run as measured there (a cut update takes real work: not 0, not a modelled constant)."""
    from subd.cli import main

    assert main(["bench", "serial", "--streams", "2", "--duration-s", "6", "--ramp-s", "1",
                 "--update-ms", ""]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "daemon's recogniser process" in out[0]
    line = out[-1]
    assert int(line.split(" words=")[1].split()[0]) >= 20
    assert "deadline misses 0, fallbacks 0" in line
    cut_p50, cut_p90 = (float(x) for x in
                        line.split("own run p50/p90 cut ")[1].split(" ms")[0].split("/"))
    assert 20 <= cut_p50 <= cut_p90
    p50 = float(line.split("visible p50/p95/max ")[1].split("/")[0])
    assert 2000 <= p50 <= 2100
