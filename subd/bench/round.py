"""`subd bench round`: where one batched recogniser round's time goes, stage by stage.

The batched recogniser (``models.batched_window.WindowEngine``, what the daemon runs on CUDA)
decodes many channels' live windows as one round: audio up to the device, log-mel, encoder,
decoding (prompt, forced prefix, graph-replayed steps), then the word-timing pass (decoder pass
with the alignment heads, DTW). This bench builds rounds of ``--rows`` windows cut from real
speech, the daemon's kind of job (3.5-6 s windows, a prompt, every other row a forced prefix,
the cut encoder span), and times:

* the round as it runs (no synchronisation added: what a channel waits for);
* the same rounds with the device synchronised around each stage, so that each stage's time is
  its own: upload, features, encode, decode, align, and the host work between them;
* with ``--profile``, torch.profiler's kernel and host-call tables over a few rounds.

On the CPU it runs too (the stages' own times, no device to wait for). Figures are for a quiet
machine; the stage split shows where a change to the round would pay (MEASUREMENTS, "The GPU
recogniser waits asleep; where a round's time goes").
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

STAGES = (("batched", "upload"), ("batched", "features"), ("batched", "encode"),
          ("windows", "_with_fallback"), ("windows", "_align"))
STAGE_NAMES = {"_with_fallback": "decode", "_align": "align"}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("round", help="one batched recogniser round, stage by stage")
    p.add_argument("--model", default="tiny.en", help="packaged name, checkpoint or compact copy")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--precision", default="auto", help="auto (fp16 on CUDA, fp32 on the CPU), "
                   "fp32, fp16, bf16")
    p.add_argument("--rows", type=int, default=44, help="windows a round (default 44: the mean "
                   "batch of 128 tiny.en channels a process at D = 2 s)")
    p.add_argument("--rounds", type=int, default=5, help="rounds timed each way (default 5)")
    p.add_argument("--clips", type=Path, default=None, help="folder of 16 kHz WAV clips "
                   "(default: pocketsphinx-testdata's LibriVox)")
    p.add_argument("--profile", action="store_true", help="print torch.profiler's tables")
    p.set_defaults(func=run)


def _jobs(tok, clips: list, rows: int, rng) -> list:
    from subd.models.batched_window import WindowJob
    from subd.models.decoding import DecodeOptions
    from subd.models.engine import EncoderSpan, FallbackPolicy

    prompt = tok.encode(" He might even have been made amiable himself, and then")
    prefix = (tok.special.timestamp_begin, *tok.encode(" and then"))
    out = []
    for i in range(rows):
        audio = clips[i % len(clips)]
        n = int(rng.uniform(3.5, 6.0) * 16_000)
        start = int(rng.integers(0, max(1, len(audio) - n)))
        out.append(WindowJob(audio[start : start + n], prompt, FallbackPolicy((0.0,)),
                             replace(DecodeOptions(), max_new_tokens=26),
                             prefix if i % 2 else (), None, EncoderSpan(2000, 2000)))
    return out


def _timed(engine: Any, sync) -> dict[str, float]:
    """Wrap each stage of ``engine`` (a WindowEngine) in synchronised timers; seconds by name."""
    spent: dict[str, float] = {}
    for owner, name in STAGES:
        obj = engine.batched if owner == "batched" else engine
        inner = getattr(obj, name)
        key = STAGE_NAMES.get(name, name)

        def timed(*a, _inner=inner, _key=key, **k):
            sync()
            t0 = time.perf_counter()
            try:
                return _inner(*a, **k)
            finally:
                sync()
                spent[_key] = spent.get(_key, 0.0) + time.perf_counter() - t0

        setattr(obj, name, timed)
    return spent


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from subd.bench.gpu_sim import load_library
    from subd.errors import UserError
    from subd.gpu.device import place, resolve_device, torch_dtype
    from subd.gpu.serve import load_weights
    from subd.models.batched_window import WindowEngine

    if args.rows < 1 or args.rounds < 1:
        raise UserError("--rows and --rounds must be at least 1")
    cpu = resolve_device(args.device, "--device") == "cpu"
    # the batched engine runs float32 on the CPU (int8 is the serial engine's)
    placement = place(args.device, "fp32" if cpu and args.precision == "auto" else args.precision)
    if placement.precision == "int8":
        raise UserError("subd bench round: int8 is the CPU's serial engine; use fp32 here")
    if placement.cuda:
        torch.backends.cuda.enable_cudnn_sdp(False)  # as the daemon's recogniser process

    def sync() -> None:
        if placement.cuda:
            torch.cuda.synchronize(placement.device)

    _, clips = load_library(args.clips)
    loaded = load_weights(args.model)
    engine = WindowEngine(loaded, placement.device, torch_dtype(placement.precision),
                          max_rows=max(64, args.rows))
    if placement.cuda:
        engine.warm()
    rng = np.random.default_rng(0)
    batches = [_jobs(loaded.tokenizer, clips, args.rows, rng) for _ in range(2 * args.rounds + 2)]
    for jobs in batches[:2]:  # new shapes: first use eager, second captured
        engine.transcribe(jobs)
    sync()
    t0 = time.perf_counter()
    for jobs in batches[2 : 2 + args.rounds]:
        engine.transcribe(jobs)
    sync()
    free_ms = 1000 * (time.perf_counter() - t0) / args.rounds
    spent = _timed(engine, sync)
    t0 = time.perf_counter()
    for jobs in batches[2 + args.rounds :]:
        engine.transcribe(jobs)
    sync()
    split_ms = 1000 * (time.perf_counter() - t0) / args.rounds
    stages = {k: 1000 * v / args.rounds for k, v in spent.items()}
    where = f"{placement.device} ({placement.precision})"
    print(f"subd bench round: {args.rows} windows a round of {args.model} on {where}, "
          f"{args.rounds} rounds each way")
    print(f"round as it runs: {free_ms:.1f} ms")
    print(f"round with each stage synchronised: {split_ms:.1f} ms = "
          + ", ".join(f"{k} {v:.1f}" for k, v in stages.items())
          + f", host between them {split_ms - sum(stages.values()):.1f} ms")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        kinds = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if placement.cuda else [])
        with profile(activities=kinds) as prof:
            for jobs in batches[2 : 2 + min(3, args.rounds)]:
                engine.transcribe(jobs)
            sync()
        table = prof.key_averages()
        if placement.cuda:
            print(table.table(sort_by="self_cuda_time_total", row_limit=20,
                              max_name_column_width=60))
        print(table.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))
    return 0
