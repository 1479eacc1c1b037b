"""``subd bench soak``: ≥ 30 min of audio through the pipeline as fast as it allows.

The clip is looped to ``--minutes`` of audio and fed to the recogniser worker process in
``--step-ms`` pieces, each as soon as the previous update returned (no pacing), decided as the
daemon at ``--latency-ms`` decides them, on the ``--span`` encoder input, with the tag
stage behind it in its own process (a tag pass overlaps the next update, as in the daemon).
Prints the resident memory of the processes and the committed-word latency p95 —
audio-timeline latency (fed audio end − word end) plus the update's compute time — at audio
minute 2 and at the end, and the growth between them (target ≤ 2 %). Like is compared with like:
the clip is padded with silence to a whole number of steps, marks fall on loop boundaries, and
each p95 is over the same whole loops of audio (≥ 1 minute) before its mark, so both marks see
the same words at the same update phases; only what grew with time can differ (a minute of
different speech moved p95 by ±6 %). The end mark is the last loop before the end-of-stream
flush. The two parts are printed
apart too: the audio-timeline part is what the recogniser's context does (it would grow if the
window or the prompt did), the compute part also moves with whatever else the machine runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

import numpy as np

from subd.bench.fanout import rss_mb
from subd.errors import UserError
from subd.tasks import start_task


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("soak", help="memory and latency over ≥ 30 min of audio")
    p.add_argument("--clip", help="speech file to loop (default: a LibriVox test clip)")
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--step-ms", type=int, default=200, help="audio per recogniser update")
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--latency-ms", type=int, default=2000,
                   help="decide words as the daemon at this D does (deadline mode: each update "
                        "commits the words ending D - A - two update costs before its audio "
                        "end); 0: the recogniser's own agreement policy")
    p.add_argument("--span", choices=("full", "cut"), default="full",
                   help="encoder input: Whisper's whole 30 s (the daemon's choice at D = 2 s "
                        "on this project's 2-core machine) or the cut span")
    p.add_argument("--device", default="cpu",
                   help="cpu: the daemon's serial recogniser process (its CPU default); cuda "
                        "or cuda:N: its batched recogniser process on that GPU, as `subd run` "
                        "with [recognizer] device starts it (its GPU memory is printed too)")
    p.add_argument("--batched", action="store_true",
                   help="the batched recogniser process on the CPU too ([recognizer] batched "
                        "= \"on\")")
    p.set_defaults(func=run)


def p95(values: list[tuple[int, float]], since: int) -> float:
    """p95 of the values stamped (audio sample fed, value) at or after ``since`` (nan if none)."""
    recent = [v for fed, v in values if fed >= since]
    return float(np.percentile(recent, 95)) if recent else float("nan")


async def soak(args: argparse.Namespace, audio: np.ndarray) -> list[dict]:
    from subd.history import AudioHistory
    from subd.pipeline.deadline import UpdatePlanner
    from subd.pipeline.ticks import TickGrid
    from subd.service.daemon import recognizer_spec
    from subd.types import SAMPLE_RATE_HZ
    from subd.workers.hosts import (
        FactorySpec,
        FinishRequest,
        TagRequest,
        UpdateRequest,
        resolve_tagger,
    )
    from subd.workers.process import ProcessWorker

    history = AudioHistory(40 * SAMPLE_RATE_HZ, shared=True)
    host = FactorySpec("subd.workers.hosts:RecogniserHost", {
        "recognizer": recognizer_spec(args.model), "history_capacity": history.capacity,
        "history_name": history.shm_name})
    tag = ProcessWorker("tag", FactorySpec("subd.workers.hosts:TagHost",
                                           {"tagger": resolve_tagger("auto")}))
    if args.device == "cpu" and not args.batched:
        rec = ProcessWorker("recognise", host)
        await asyncio.gather(rec.start(), tag.start())
        stage, rec_pid = rec, rec._proc.pid  # noqa: SLF001
    else:  # the daemon's batched recogniser stage, one process, this channel attached to it
        stage = await batched_stage(args.model, args.device)
        await tag.start()
        rec = await stage.attach("soak", host)
        rec_pid = stage.shards[0].worker.pid
    step = args.step_ms * SAMPLE_RATE_HZ // 1000
    audio = np.concatenate([audio, np.zeros(-len(audio) % step, audio.dtype)])
    loop = len(audio)  # the input repeats, at the same update phases, every loop
    window = -(-60 * SAMPLE_RATE_HZ // loop) * loop  # whole loops, ≥ 1 minute
    first_mark = max(window, -(-2 * 60 * SAMPLE_RATE_HZ // loop) * loop)
    last_mark = max(first_mark + loop, int(args.minutes * 60 * SAMPLE_RATE_HZ) // loop * loop)
    total = last_mark + step  # the final step flushes the stream, after the last mark
    fed = 0
    # (audio fed, value): committed latency of each word, its audio-timeline part only, and
    # the compute time of each update
    latencies: list[tuple[int, float]] = []
    audio_lat: list[tuple[int, float]] = []
    computes: list[tuple[int, float]] = []
    marks: list[dict] = []
    next_mark = first_mark
    n_tagged = 0
    tagging: asyncio.Future | None = None  # the tag pass in flight (overlaps the next update)
    # the daemon's planner decides each update's deadline; unpaced, "now" is the audio fed
    planner = UpdatePlanner(args.span, args.step_ms)
    grid = TickGrid.create("30", 0, args.latency_ms, 150) if args.latency_ms else None
    t_start = time.monotonic()
    while fed < total:
        end = min(total, fed + step)
        for a in range(fed, end, audio.shape[0]):
            pos = a % audio.shape[0]
            n = min(end - a, audio.shape[0] - pos)
            history.write(a, audio[pos:pos + n])
        fed = end
        final = fed >= total
        plan = planner.plan(grid, fed * 62_500) if args.latency_ms and not final else None
        result = await rec.call(FinishRequest(fed) if final else UpdateRequest(
            fed, plan and plan.commit_until_ns, full_span=bool(plan and plan.full_span)),
            time.monotonic_ns())
        if plan is not None and result.decoded:
            planner.record(plan, result.duration_ns)
        hyp = result.hypothesis
        compute_ms = result.duration_ns / 1e6
        for w in hyp.committed:
            timeline_ms = (fed * 62_500 - w.end_ns) / 1e6
            audio_lat.append((fed, timeline_ms))
            latencies.append((fed, timeline_ms + compute_ms))
        computes.append((fed, compute_ms))
        if tagging is not None:
            await tagging  # the previous pass ran while the recogniser did this update
        tagging = start_task(tag.call(TagRequest(
            k=0, first_idx=n_tagged, committed=hyp.committed, tentative=hyp.tentative,
            audio_end_ns=hyp.audio_end_ns, flush=final)), "bench:tag")
        n_tagged += len(hyp.committed)
        if fed == next_mark:
            since = fed - window + 1
            await asyncio.sleep(0.05)  # the workers trim their heaps after answering
            marks.append({"audio_min": fed / SAMPLE_RATE_HZ / 60,
                          "rss_main_mb": rss_mb(os.getpid()),
                          "rss_recogniser_mb": rss_mb(rec_pid),
                          "gpu_recogniser_mb": gpu_mb(rec_pid),
                          "rss_tagger_mb": rss_mb(tag._proc.pid),  # noqa: SLF001
                          "committed_p95_ms": p95(latencies, since),
                          "audio_timeline_p95_ms": p95(audio_lat, since),
                          "update_compute_p95_ms": p95(computes, since),
                          "realtime_factor": (fed / SAMPLE_RATE_HZ)
                          / max(1e-9, time.monotonic() - t_start)})
            print("  minute {audio_min:6.1f}: RSS main {rss_main_mb:.0f} MB, recogniser "
                  "{rss_recogniser_mb:.0f} MB (GPU {gpu_recogniser_mb:.0f} MB), tagger "
                  "{rss_tagger_mb:.0f} MB; committed p95 "
                  "{committed_p95_ms:.0f} ms (audio timeline {audio_timeline_p95_ms:.0f} ms,"
                  " update compute {update_compute_p95_ms:.0f} ms); {realtime_factor:.1f}x real"
                  " time"
                  .format(**marks[-1]), flush=True)
            five = -(-5 * 60 * SAMPLE_RATE_HZ // loop) * loop
            next_mark = last_mark if fed + five > last_mark and fed < last_mark else fed + five
    if tagging is not None:
        await tagging
    await asyncio.gather(stage.close(), tag.close())
    history.close()
    return marks


async def batched_stage(model: str, device: str):
    """``subd run``'s batched recogniser stage for ``[recognizer] device = device``."""
    import dataclasses

    from subd.config import config_from_dict
    from subd.gpu.device import place
    from subd.service.sharding import batched_recogniser

    placement = place(device, "auto")
    cfg = config_from_dict({"sinks": {"enabled": []}}).recognizer
    cfg = dataclasses.replace(cfg, model=model, device=placement.device,
                              precision=placement.precision, gpu_processes=1)
    stage = batched_recogniser(cfg, cuda=placement.cuda)
    await stage.start(600)
    return stage


def gpu_mb(pid: int) -> float:
    """GPU memory the driver holds for process ``pid`` in MB (nan without a GPU or nvidia-smi)."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return float("nan")
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid):
            return float(fields[1])
    return float("nan")


def run(args: argparse.Namespace) -> int:
    from subd.bench.realtime import default_clip
    from subd.sources.decode import load_audio

    if args.minutes < 3:
        raise UserError("--minutes must be at least 3 (the first mark is at minute 2)")
    clip = Path(args.clip) if args.clip else default_clip()[0]
    audio = load_audio(clip)
    print(f"soak: {clip.name} looped to {args.minutes:.0f} min, {args.step_ms} ms per update")
    marks = asyncio.run(soak(args, audio))
    first, last = marks[0], marks[-1]
    gpu = ("gpu_recogniser_mb",) if args.device != "cpu" else ()
    for key in ("rss_main_mb", "rss_recogniser_mb", *gpu, "rss_tagger_mb", "committed_p95_ms",
                "audio_timeline_p95_ms", "update_compute_p95_ms"):
        growth = (last[key] - first[key]) / first[key] * 100 if first[key] else float("nan")
        print(f"{key:22s} minute {first['audio_min']:.1f}: {first[key]:8.1f}   "
              f"minute {last['audio_min']:.1f}: {last[key]:8.1f}   "
              f"growth {growth:+.1f} %")
    return 0
