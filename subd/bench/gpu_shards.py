"""``subd bench gpu --policy daemon``: the daemon's batched recogniser stage, as ``subd run``
builds it, driven the way the daemon's channels drive it.

The batched side is :func:`subd.service.sharding.batched_recogniser` from the configuration's
``[recognizer]`` (``gpu_processes`` shards, each a real worker process with its own batched
engine, supervised, fed through :class:`~subd.service.batching.BatchingSharedWorker`'s queue):
each channel attaches a recogniser host on its own shared-memory audio history, as the daemon's
channels do, and one asyncio task per channel sends an ``UpdateRequest`` whenever
``min_update_ms`` of new audio is in and its previous answer is back (as subd.pipeline.scheduler
does), with the deadline and encoder span from its own UpdatePlanner on its tick grid. What the
trials count, and the naive baseline (one request at a time, in this process), are
subd.bench.gpu_policy's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time

import numpy as np

from subd.bench.gpu_policy import (
    NS_PER_MS,
    NS_PER_S,
    VISIBLE_SLACK_MS,
    Setup,
    Trial,
    describe,
    lead_trial,
)
from subd.types import SAMPLE_RATE_HZ


def _cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) a process has used so far; 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid or 'self'}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _raise_open_files() -> None:
    """Each channel's shared-memory history holds a file descriptor, here and in its
    recogniser process: a thousand channels pass the usual soft limit of 1024 (a daemon that
    size needs the same, e.g. systemd's LimitNOFILE)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass  # as it was: a trial past it says "Too many open files"


async def simulate_shards(label: str, rec, spec: tuple, library: np.ndarray, n: int,
                          setup: Setup) -> tuple[Trial, str]:
    """One trial of ``n`` channels on the sharded recogniser ``rec``; (trial, host CPU line)."""
    from subd.bench.gpu_report import account
    from subd.bench.gpu_sim import UtilSampler
    from subd.history import AudioHistory
    from subd.pipeline.deadline import UpdatePlanner
    from subd.pipeline.ticks import TickGrid
    from subd.workers.hosts import FactorySpec, UpdateRequest

    trial = Trial(label, n, setup.latency_ms)
    offsets = np.random.default_rng(0).integers(0, len(library), size=n)
    sent = np.zeros(n, dtype=np.int64)
    histories = [AudioHistory(40 * SAMPLE_RATE_HZ, shared=True) for _ in range(n)]
    try:
        workers = await asyncio.gather(*(rec.attach(f"c{i}", FactorySpec(
            "subd.workers.hosts:RecogniserHost", {
                "recognizer": FactorySpec(*spec), "history_capacity": h.capacity,
                "history_name": h.shm_name})) for i, h in enumerate(histories)))
        d_ns, a_ns = setup.latency_ms * NS_PER_MS, setup.lookahead_ms * NS_PER_MS
        min_new = setup.min_update_ms * SAMPLE_RATE_HZ // 1000
        shown = np.zeros(n, dtype=bool)
        previous: list[tuple] = [((), None)] * n
        t0 = time.monotonic_ns() + 50 * NS_PER_MS
        start = t0 + (np.arange(n) * setup.ramp_s * NS_PER_S / max(n, 1)).astype(np.int64)
        count_ns, end_ns = setup.counting(t0)
        lead = lead_trial(trial)

        def feed(i: int, end: int) -> None:  # what ingest does: the audio into the history
            lo = int(sent[i])
            while lo < end:
                a = int((offsets[i] + lo) % len(library))
                take = min(end - lo, len(library) - a)
                histories[i].write(lo, library[a : a + take])
                lo += take
            sent[i] = end

        async def channel(i: int) -> None:
            # shared: as the daemon's pipeline plans on its recogniser's ChannelWorker
            planner = UpdatePlanner(setup.encoder_span, setup.min_update_ms, shared=True)
            grid = TickGrid.create(setup.fps, int(start[i]), setup.latency_ms,
                                   setup.lookahead_ms)
            while (now := time.monotonic_ns()) < end_ns:
                heard = max(0, (now - int(start[i])) * SAMPLE_RATE_HZ // NS_PER_S)
                if heard - sent[i] < min_new:  # sleep until enough new audio is in
                    wake = int(start[i]) + (int(sent[i]) + min_new) * NS_PER_S // SAMPLE_RATE_HZ
                    await asyncio.sleep((min(wake, end_ns) - now + 100_000) / 1e9)
                    continue
                feed(i, heard)
                plan = planner.plan(grid, now)
                try:
                    res, ok = await workers[i].call(UpdateRequest(
                        heard, plan.commit_until_ns, full_span=plan.full_span,
                        due_ns=plan.due_ns, first_caption=not shown[i]), now), True
                except Exception as exc:  # noqa: BLE001 - counted as a failed update
                    res, ok = exc, False
                done = time.monotonic_ns()
                into = trial if now >= count_ns else lead
                into.round_ms.append((done - now) / NS_PER_MS)
                account(into, i, ok, res, now, done, int(start[i]), planner, plan, shown,
                        previous, d_ns, a_ns)

        items0, batches0 = rec.n_items, rec.n_batches
        pids = [s.worker.pid for s in rec.shards]
        cpu0, shard0, wall0 = _cpu_s(None), [_cpu_s(p) for p in pids], time.monotonic()
        with UtilSampler() as util:
            await asyncio.gather(*(channel(i) for i in range(n)))
        wall = time.monotonic() - wall0
        shard_cpu = [_cpu_s(p) - c for p, c in zip(pids, shard0, strict=True)]
        driver = 100 * (_cpu_s(None) - cpu0) / wall
        cpu = (f"host CPU over the trial: driver (the daemon side) {driver:.0f} % of a core; "
               f"{len(pids)} recogniser processes "
               f"{', '.join(f'{100 * c / wall:.0f}' for c in shard_cpu)} % of a core; channels "
               f"per process {rec.loads()}")
        n_batches = rec.n_batches - batches0
        trial.batch = [(rec.n_items - items0) / n_batches] if n_batches else []
        trial.gpu_util_pct = util.mean
        trial.offsets, trial.sent = offsets, sent.copy()
    finally:
        await asyncio.gather(*(rec.detach(f"c{i}") for i in range(n)), return_exceptions=True)
        for h in histories:
            h.close()
    return trial, cpu


async def search_shards(label: str, rec, spec: tuple, library, counts: list[int], setup: Setup,
                        log, warm_s: float = 0.0) -> tuple[Trial | None, list[Trial]]:
    """subd.bench.gpu_policy.search on the sharded recogniser: growing N until it no longer
    keeps up; each N first runs ``warm_s`` uncounted (CUDA graphs of its batch sizes)."""
    best, trials = None, []
    for n in sorted(counts):
        if warm_s > 0:
            warm = dataclasses.replace(setup, duration_s=warm_s, lead_s=0.0)
            t, _ = await simulate_shards(f"{label} warm-up (not counted)", rec, spec, library,
                                         n, warm)
            log(describe(t))
        t, cpu = await simulate_shards(label, rec, spec, library, n, setup)
        trials.append(t)
        log(describe(t))
        log(f"  {cpu}")
        if t.served:
            best = t
        if not t.keeps_up:
            break
    keeping = [t.n_channels for t in trials if t.keeps_up]
    log(f"{label}: largest N keeping up (every update within D - A): "
        f"{max(keeping) if keeping else 0}")
    return best, trials


async def batched_trials(rec_cfg, placement, args, spec: tuple, library, counts, setup,
                         log, transcript=None) -> tuple[Trial | None, list[Trial]]:
    """Start the daemon's batched recogniser stage (every shard), run the trials, close it.
    ``transcript``: capacity mode's answers (subd.bench.gpu_transcript), made once here."""
    from subd.service.sharding import batched_recogniser
    from subd.service.stages import StagePolicy

    host_target, extra = "subd.service.batching:BatchedMultiplexHost", {}
    if args.capacity:
        host_target = "subd.bench.gpu_capacity:CapacityHost"
        extra = {"capacity": args.capacity, "decisions": args.capacity_decisions,
                 "clips": str(args.clips or ""), "transcript": transcript}
    rec = batched_recogniser(rec_cfg, cuda=placement.cuda, max_rows=args.max_rows,
                             host_target=host_target, host_extra=extra,
                             policy=StagePolicy(start_timeout_s=rec_cfg.start_timeout_s))
    t0 = time.monotonic()
    try:
        await rec.start(rec_cfg.start_timeout_s)
        log(f"{len(rec.shards)} batched recogniser processes ([recognizer] gpu_processes = "
            f"{rec_cfg.gpu_processes!r}) loaded in {time.monotonic() - t0:.1f} s")
        return await search_shards("batched", rec, spec, library, counts, setup, log,
                                   args.warm_s)
    finally:
        await rec.close(5.0)


def run(args) -> int:
    import torch

    from subd.bench import gpu_policy
    from subd.bench.gpu_report import TrialLog, offline_wer, plot
    from subd.bench.gpu_sim import load_library
    from subd.config import config_from_dict, load_config
    from subd.gpu.device import on_device, place
    from subd.gpu.serve import load_weights
    from subd.models.engine import WhisperEngine
    from subd.pipeline.cadence import update_cadence_ms
    from subd.service.build import recognizer_spec

    # the recogniser's settings only: no sink is built (none may be registered where the
    # bench runs from a copy of the tree, not an installed package)
    cfg = load_config(args.config) if args.config else config_from_dict({"sinks": {"enabled": []}})
    placement = place(args.device, args.precision)
    rec = dataclasses.replace(
        cfg.recognizer, model=args.model, device=placement.device,
        precision=placement.precision,
        gpu_processes=(cfg.recognizer.gpu_processes if args.gpu_processes is None else
                       args.gpu_processes if args.gpu_processes == "auto" else
                       int(args.gpu_processes)))
    rec.validate()
    if placement.cuda:
        torch.backends.cuda.enable_cudnn_sdp(False)  # a plan per new shape: see bench gpu
    # the cadence a channel of the daemon runs at on this device (subd.pipeline.cadence)
    cadence_ms = update_cadence_ms(rec, cfg.tick.latency_ms, cfg.tick.lookahead_ms,
                                   placement.cuda)
    lead_s = (rec.trim_after_ms + 3000) / 1000 if args.lead_s == "auto" else float(args.lead_s)
    setup = Setup(cfg.tick.latency_ms, cfg.tick.lookahead_ms, cadence_ms,
                  args.duration_s, args.ramp_s, cfg.tick.fps, rec.encoder_span, lead_s)
    library, _ = load_library(args.clips)
    log = TrialLog(args.log)

    spec = recognizer_spec(args.model, "", **rec.window_options())
    spec_args = (spec.target, dict(spec.kwargs, model=args.model))
    log(f"daemon policy: model {args.model} on {placement.device} ({placement.precision}"
        f"{', ' + torch.cuda.get_device_name() if placement.cuda else ''}); D "
        f"{setup.latency_ms} ms, A {setup.lookahead_ms} ms, update every "
        f"{setup.min_update_ms} ms of new audio ([recognizer] "
        f"{'gpu_update_ms = ' + repr(rec.gpu_update_ms) if placement.cuda else 'min_update_ms'}"
        f"), encoder span {setup.encoder_span} "
        f"(pad {rec.encoder_pad_ms} ms, bucket {rec.encoder_bucket_ms} ms, trim after "
        f"{rec.trim_after_ms} ms); {setup.duration_s} s per trial after a "
        f"{setup.ramp_s} s ramp and {setup.lead_s} s of every channel's updates not counted "
        f"(--lead-s)")
    capacity = ""
    if args.capacity:
        from subd.bench.gpu_capacity import describe_size

        if args.capacity_decisions == "transcript":
            capacity = (f"CAPACITY MODE, RANDOM WEIGHTS: every batch runs a randomly "
                        f"initialised {describe_size(args.capacity)}, decoding teacher-forced "
                        f"with the clips' transcript ({args.model}'s offline reading, made "
                        f"before the trials) for each window; {args.model} does no work in "
                        f"the trials, the captions are the transcript's words (WER: words the "
                        f"policy lost or changed)")
        else:
            capacity = (f"CAPACITY MODE, RANDOM WEIGHTS: every batch also runs a randomly "
                        f"initialised {describe_size(args.capacity)}, decoding teacher-forced "
                        f"with {args.model}'s tokens for each window (captions, words and WER "
                        f"are {args.model}'s; the figures are the capacity of both together)")
        log(capacity)
    transcript = None
    if args.capacity and args.capacity_decisions == "transcript":  # once, for every process
        from subd.bench.gpu_transcript import library_transcript

        transcript = library_transcript(
            WhisperEngine(on_device(load_weights(args.model), placement)), library)
    counts = [int(x) for x in args.streams.split(",")]
    _raise_open_files()
    best, _ = asyncio.run(batched_trials(rec, placement, args, spec_args, library, counts,
                                         setup, log, transcript))
    # the engine the WER is taken against, and the naive baseline's: in this process
    if args.capacity:  # the same two models, one request at a time
        from subd.bench.gpu_capacity import CapacityHost

        single = CapacityHost(args.model, placement.device, placement.precision,
                              args.max_rows, capacity=args.capacity,
                              decisions=args.capacity_decisions,
                              clips=str(args.clips or ""), transcript=transcript).engine
    else:
        single = WhisperEngine(on_device(load_weights(args.model), placement))
    gpu_policy._NAIVE = single
    naive = None
    if args.naive_streams:
        naive, _ = gpu_policy.search("naive", gpu_policy.naive_host, spec_args,
                                     library, [int(x) for x in args.naive_streams.split(",")],
                                     setup, False, log)
    n_b = best.n_channels if best else 0
    n_n = naive.n_channels if naive else 0
    log("")
    log(f"largest N served (every update back within D - A, words visible within D + "
        f"{VISIBLE_SLACK_MS} ms at p95; D = {setup.latency_ms} ms): batched {n_b}, naive "
        f"{n_n}" + (f"; ratio {n_b / n_n:.1f}x" if n_n else ""))
    if capacity:
        log(capacity)
        log(f"{single.windows.summary()} (the naive baseline's, in this process)")
    engine = getattr(single, "windows", None)
    engine = engine.single if engine is not None else single
    for t in (best, naive):
        if t is not None:
            log(f"  {t.label} at N={t.n_channels}: viewer-visible latency p50 "
                f"{t.pct('visible_ms', 50):.0f} ms, p95 {t.pct('visible_ms', 95):.0f} ms; "
                f"time to first caption p50 {t.pct('ttfc_ms', 50):.0f} ms, p95 "
                f"{t.pct('ttfc_ms', 95):.0f} ms; late updates {t.n_late_updates}, degraded "
                f"{t.n_degraded}, superseded "
                f"0 (one request per channel in flight, as the pipeline sends them); GPU use "
                f"{t.gpu_util_pct:.1f}%; WER vs the same engine offline "
                f"{100 * offline_wer(engine, library, t):.1f}%")
            if t.texts:
                log(f"    channel 0 committed: {' '.join(t.texts.get(0, [])[:30])!r}")
    if args.plot:
        plot(args.plot, best, naive, setup)
        log(f"plot: {args.plot}")
    log.close()
    return 0
