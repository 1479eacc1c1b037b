"""``subd bench serial``: N channels of one daemon sharing its serial recogniser, on a fake clock.

The daemon's CPU default (``[recognizer] batched = "auto"`` without a GPU): every channel's
pipeline (subd.pipeline.scheduler, its own UpdatePlanner) sends its updates to ONE recogniser
worker, the daemon's SharedWorker over a MultiplexHost that holds each channel's streaming
recogniser (real tiny.en, real speech: the LibriVox clips looped, each channel from its own
offset, the channels starting ``--ramp-s`` apart). The clock is a fake one on which every
update lasts what ``--update-ms FULL,CUT`` says (one idle core's costs), or (``--update-ms ''``)
the CPU time it took in the daemon's own recogniser process (the ProcessWorker over the
MultiplexHost that ``subd run`` starts, reading each channel's audio from shared memory; its
heap trims and page faults are in that time, other processes' use of the core is not), and a
tag pass 5 ms: the decisions a dedicated core would make, whatever else runs on the machine.
Modelled costs are the same from run to run; they do not grow with the window and the decoded
tokens as real updates do (subd run, 4 channels: a cut update 0.2-0.3 s of CPU, not 0.14 s).
``subd bench gpu --device cpu --naive-streams 4`` measures the same path in real time (noisy
on a shared machine).

Reported, over all channels: words, the viewer-visible latency of each committed word (its
first tick's publication minus its end) at p50/p95/max, words shown after their own tick by
cause (subd.bench.gpu_report.late_cause: ``unseen`` Whisper had left the word out of the
previous result, ``due`` it was due there but not heard out, ``deferred`` the planner left it to
this result, which came after its tick's fetch), updates and how many on the full input,
round trips, deadline misses and fallbacks. Served: 0 misses, 0 fallbacks, p95 within D + 0.3 s.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import numpy as np

from subd.bench.cputimed import CpuTimed
from subd.clock import FakeClock
from subd.types import SAMPLE_RATE_HZ

NS_PER_MS = 1_000_000
TAG_MODEL_NS = 5_000_000  # a tag pass (subd bench quality's modelled one)
VISIBLE_SLACK_MS = 300


class _Costs(CpuTimed):
    """Fake-clock duration of a channel's request to the shared recogniser: its update's
    modelled per span, or its CPU time; attach, detach and finish cost nothing (not measured)."""

    def cost_ns(self, request, cpu_ns: int) -> int:
        inner = getattr(request, "request", None)
        if inner is None or not hasattr(inner, "commit_until_ns"):
            return 0
        return super().cost_ns(inner, cpu_ns, request.channel)


class _HeldClock(FakeClock):
    """A fake clock that does not move while the recogniser's process is working: its
    settling waits for the answer, so an update's real run takes no fake time (its CPU time
    is then slept on the clock)."""

    def __init__(self, start_ns: int) -> None:
        super().__init__(start_ns=start_ns)
        self.free = asyncio.Event()
        self.free.set()

    async def settle(self) -> None:
        await super().settle()
        while not self.free.is_set():
            await self.free.wait()
            await super().settle()


class _InProcess:
    """The daemon's recogniser process as the shared worker's worker, on the held clock:
    each channel's update lasts the CPU time it took there (RecogniseResult.cpu_ns)."""

    name = "recognise"

    def __init__(self, worker, clock) -> None:
        self.worker, self.clock = worker, clock
        self.busy_since_ns = None

    async def call(self, request, now_ns: int = 0):
        self.clock.free.clear()
        try:
            result = await self.worker.call(request, now_ns)
        finally:
            self.clock.free.set()
        cpu_ns = getattr(result, "cpu_ns", None)
        if cpu_ns is None or not hasattr(getattr(request, "request", None), "commit_until_ns"):
            return result  # attach, detach, finish: no time
        await self.clock.sleep_until(self.clock.now_ns() + cpu_ns, precise=False)
        return dataclasses.replace(result, duration_ns=cpu_ns)

    async def close(self, timeout_s: float = 5.0) -> None:
        await self.worker.close(timeout_s)


class _Channel:
    """One channel's view of the shared worker that also counts its late words by cause."""

    def __init__(self, worker, stats: dict) -> None:
        self.worker, self.stats = worker, stats
        self.pipeline = None
        self.previous: tuple = ((), None)  # last result's tentative words, its deadline
        self.rounds_ms: list[float] = []
        self.runs_ms: dict[bool, list[float]] = {False: [], True: []}  # decoded updates' own

    @property
    def busy_since_ns(self):
        return self.worker.busy_since_ns

    @property
    def shared(self):  # the planner's cue: a recogniser shared with other channels
        return self.worker.shared

    async def call(self, request, now_ns: int = 0):
        from subd.bench.gpu_report import late_cause

        result = await self.worker.call(request, now_ns)
        p = self.pipeline
        done_ns = p.clock.now_ns()
        self.rounds_ms.append((done_ns - now_ns) / NS_PER_MS)
        if result.decoded and hasattr(request, "full_span"):
            self.runs_ms[request.full_span].append(result.duration_ns / NS_PER_MS)
        grid = p.grid
        for w in result.hypothesis.committed:
            k = max(0, grid.first_due_at_or_after(grid.t0_ns + w.end_ns) - 3)
            while grid.audio_end_ns(k) < w.end_ns:
                k += 1
            if done_ns > grid.due_ns(k) - grid.lookahead_ns:  # after its tick's fetch
                why = late_cause(w, (done_ns - grid.t0_ns) / 1e9, *self.previous)
                self.stats[why] = self.stats.get(why, 0) + 1
        until = getattr(request, "commit_until_ns", None)
        self.previous = (result.hypothesis.tentative, until)
        return result


class _Shown:
    """Observer: each committed word's viewer-visible latency (fake clock: publication = T(k))."""

    def __init__(self) -> None:
        self.pipeline = None
        self.visible_ms: list[float] = []

    def on_hypothesis(self, result, now_ns: int) -> None:
        pass

    def on_publish(self, state, sent_ns: int) -> None:
        t0 = self.pipeline.grid.t0_ns
        for tw in state.committed:
            self.visible_ms.append((sent_ns - t0 - tw.word.end_ns) / NS_PER_MS)


async def simulate(n: int, library: np.ndarray, args, cfg, files: list | None = None) -> dict:
    from subd.history import AudioHistory
    from subd.pipeline.scheduler import Pipeline, TickSettings
    from subd.service.build import recognizer_spec
    from subd.service.multiplex import MultiplexHost
    from subd.service.stages import SharedWorker
    from subd.sources.live import FileSource
    from subd.workers.hosts import FactorySpec, TagHost
    from subd.workers.process import InlineWorker, ProcessWorker

    rec_cfg = cfg.recognizer
    t0_ns = 10**12
    preload = FactorySpec("subd.service.supervisor:shared_engine", {"model": rec_cfg.model})
    process = args.update_ns is None  # CPU time, measured in the daemon's recogniser process
    if process:
        clock = _HeldClock(t0_ns)
        worker = ProcessWorker("recognise", FactorySpec("subd.service.supervisor:MultiplexHost",
                                                        {"preload": preload}))
        await worker.start(rec_cfg.start_timeout_s)
        shared = SharedWorker(_InProcess(worker, clock))
    else:
        clock = FakeClock(start_ns=t0_ns)
        host = _Costs(MultiplexHost(preload), args.update_ns)
        shared = SharedWorker(InlineWorker("recognise", host, clock, lambda r: host.last_ns))
    spec = recognizer_spec(rec_cfg.model, "", **rec_cfg.window_options())
    rng = np.random.default_rng(args.seed)
    n_samples = int(args.duration_s * SAMPLE_RATE_HZ)
    stats: dict[str, int] = {}
    channels, shown = [], []

    async def channel(i: int) -> None:
        await clock.sleep_until(t0_ns + int(i * args.ramp_s * 1e9 / max(n, 1)))
        a = int(rng.integers(0, len(library)))  # drawn either way: the same offsets per seed
        if files:  # as a daemon's looping file channels: the file again and again, from its start
            clip = files[i % len(files)]
            audio = np.tile(clip, n_samples // len(clip) + 1)[:n_samples]
        else:
            audio = np.concatenate([library, library])[a : a + n_samples]
        history = AudioHistory(rec_cfg.history_s * SAMPLE_RATE_HZ, shared=process)
        histories.append(history)
        where = {"history_name": history.shm_name} if process else {"history": history}
        cw = await shared.attach(f"c{i}", FactorySpec("subd.workers.hosts:RecogniserHost", {
            "recognizer": spec, "history_capacity": history.capacity, **where}))
        ch, seen = _Channel(cw, stats), _Shown()
        tag = InlineWorker("tag", TagHost(None), clock, lambda r: TAG_MODEL_NS)
        settings = TickSettings(fps=cfg.tick.fps, latency_ms=cfg.tick.latency_ms,
                                lookahead_ms=cfg.tick.lookahead_ms,
                                min_update_ms=rec_cfg.min_update_ms, drain_timeout_s=60,
                                encoder_span=rec_cfg.encoder_span,
                                update_cost_ms=rec_cfg.planned_cost_ms())
        p = Pipeline(clock=clock, settings=settings, source=FileSource(audio, name=f"c{i}"),
                     recogniser=ch, tagger=tag, history=history, observer=seen)
        ch.pipeline = seen.pipeline = p
        channels.append(ch)
        shown.append(seen)
        await p.run()

    histories: list = []
    task = asyncio.ensure_future(asyncio.gather(*(channel(i) for i in range(n))))
    try:
        await clock.run_until_done(task, limit_ns=t0_ns + int((args.ramp_s + args.duration_s
                                                                + 120) * 1e9))
        task.result()
    finally:
        if process:
            await shared.close(5.0)
        for history in histories:
            history.close()
    visible = np.array([v for s in shown for v in s.visible_ms])
    rounds = np.array([r for c in channels for r in c.rounds_ms])
    pipes = [c.pipeline for c in channels]
    return {
        "channels": n, "words": int(visible.size), "late_by_cause": stats,
        "late": int(sum(stats.values())),
        "visible_p50_ms": float(np.percentile(visible, 50)) if visible.size else float("nan"),
        "visible_p95_ms": float(np.percentile(visible, 95)) if visible.size else float("nan"),
        "visible_max_ms": float(visible.max()) if visible.size else float("nan"),
        "updates": int(rounds.size), "full_span": sum(p.planner.n_full for p in pipes),
        "round_p95_ms": float(np.percentile(rounds, 95)) if rounds.size else float("nan"),
        "cut_run_ms": _p50_p90([r for c in channels for r in c.runs_ms[False]]),
        "full_run_ms": _p50_p90([r for c in channels for r in c.runs_ms[True]]),
        "misses": sum(p.counters.deadline_misses for p in pipes),
        "fallbacks": sum(p.counters.fallbacks for p in pipes),
    }


def _p50_p90(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return float(np.percentile(values, 50)), float(np.percentile(values, 90))


def describe(r: dict, latency_ms: int) -> str:
    served = (r["misses"] == 0 and r["fallbacks"] == 0
              and r["visible_p95_ms"] <= latency_ms + VISIBLE_SLACK_MS)
    return (f"N={r['channels']} served={served} words={r['words']} late={r['late']} "
            f"{r['late_by_cause']} visible p50/p95/max {r['visible_p50_ms']:.0f}/"
            f"{r['visible_p95_ms']:.0f}/{r['visible_max_ms']:.0f} ms; updates {r['updates']} "
            f"({r['full_span']} on the full input), own run p50/p90 cut {r['cut_run_ms'][0]:.0f}/"
            f"{r['cut_run_ms'][1]:.0f} ms, full {r['full_run_ms'][0]:.0f}/"
            f"{r['full_run_ms'][1]:.0f} ms, round trip p95 {r['round_p95_ms']:.0f} ms; "
            f"deadline misses {r['misses']}, fallbacks {r['fallbacks']}")


def run(args) -> int:
    from subd.bench.gpu_sim import load_library
    from subd.bench.quality import update_ms
    from subd.config import config_from_dict, load_config

    cfg = load_config(args.config) if args.config else config_from_dict({"sinks": {"enabled": []}})
    args.update_ns = update_ms(args)  # (full, cut) ns, or None: CPU time
    library, _ = load_library(Path(args.clips) if args.clips else None)
    costs = (f"modelled: full input {args.update_ms.split(',')[0]} ms, cut span "
             f"{args.update_ms.split(',')[1]} ms" if args.update_ms
             else "their CPU time in the daemon's recogniser process")
    print(f"serial recogniser shared by N channels, fake clock, updates last {costs}; "
          f"model {cfg.recognizer.model}, D {cfg.tick.latency_ms} ms, A "
          f"{cfg.tick.lookahead_ms} ms, update every {cfg.recognizer.min_update_ms} ms of new "
          f"audio, encoder span {cfg.recognizer.encoder_span}; {args.duration_s} s of speech "
          f"per channel, starts {args.ramp_s} s apart in all", flush=True)
    files = None
    if args.files:
        from subd.sources.decode import load_audio

        files = [load_audio(Path(f)) for f in args.files.split(",")]
    for n in (int(x) for x in args.streams.split(",")):
        print(describe(asyncio.run(simulate(n, library, args, cfg, files)),
                       cfg.tick.latency_ms), flush=True)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("serial", help="channels sharing the daemon's serial recogniser "
                                              "(CPU), on a fake clock")
    p.add_argument("--streams", default="4", help="channel counts, e.g. 1,2,4")
    p.add_argument("--duration-s", type=float, default=30.0)
    p.add_argument("--ramp-s", type=float, default=2.0, help="the channels' starts spread over")
    p.add_argument("--update-ms", default="450,140",
                   help="FULL,CUT: an update's fake-clock duration on the full input and on the "
                        "cut span (tiny.en int8, one idle core); '': its CPU time in the "
                        "daemon's recogniser process")
    p.add_argument("--clips", default=None, help="16 kHz mono WAV clips (default: LibriVox)")
    p.add_argument("--files", default="",
                   help="F1,F2,...: channel i loops file i (mod their number) from its start, "
                        "as `subd run` file channels with loop = true (default: the clips)")
    p.add_argument("--config", default=None, help="daemon configuration (D, A, cadence)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)
