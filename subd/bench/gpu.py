"""``subd bench gpu``: how many live streams one GPU serves with no deadline misses.

Runs the live-stream simulation for growing N with the batched engine served by continuous
batching (``gpu_stream``: GPU front end, encoder batched over the updates admitted together,
graph-captured decode chunks over every decode slot, rows joining and leaving between chunks,
stragglers compacted into the smallest graph bucket, one deadline-aware scheduler choosing
what to admit; ``--batching rounds`` keeps blocking rounds), then the same simulation served naively
(one update at a time, unbatched, the host waiting on every decode step, features on the CPU:
how peers serve; if the smallest N given fails, it is halved until one is served), and
prints the largest N each serves with 0 misses,
p95 time to first caption, p95 update latency, GPU utilisation and the ratio.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from subd.bench.gpu_sim import (  # noqa: F401 - load_library: re-exported for the tests
    SimConfig,
    SimResult,
    load_library,
    simulate,
)
from subd.errors import UserError
from subd.gpu.scheduler import CostModel

BENCH_TEMPERATURES = (0.0, 0.2, 0.4)  # capped fallback; all keep the prompt (≤ 0.5)
MAX_NEW_TOKENS = 96



class RoundServer:
    """``--batching rounds``: one blocking round per scheduler plan (features, encoder, decode
    until the batch's longest row is done, fallback re-decodes), as the first version served.
    Audio goes through the same device rings as continuous batching (``StreamAudio``)."""

    def __init__(self, engine, library: np.ndarray, n_streams: int, window_s: float,
                 n_frames: int):
        from subd.bench.gpu_stream import StreamAudio

        self.engine, self.n_frames = engine, n_frames
        self.audio = StreamAudio(engine, library, n_streams, window_s)

    def __call__(self, ids, offsets, heard, prompts):
        eng = self.engine
        win, length = self.audio.windows(ids, offsets, heard)
        feats = eng.encode(eng.features(win, length, self.n_frames))
        results = eng.decode_with_fallback(feats, prompts, _policy(), _options())
        ts, pol = eng.special.timestamp_begin, _policy()
        texts = ["" if (r.no_speech_prob > pol.no_speech_threshold
                        and r.avg_logprob < pol.logprob_threshold) else eng.text(r)
                 for r in results]
        return texts, [list(r.text_tokens(ts)) for r in results]


class NaiveServer:
    """One update at a time: CPU features, batch-1 encoder, a host sync at every decode step."""

    def __init__(self, loaded, library: np.ndarray, window_s: float, n_frames: int, device):
        import torch

        from subd.models.engine import WhisperEngine

        self.torch = torch
        model = loaded.model
        gpu = dataclasses.replace(loaded, model=_half_copy(model, device))
        self.engine = WhisperEngine(gpu, threads=None)
        self.device, self.n_frames = device, n_frames
        self.window = int(window_s * 16_000)
        self.lib, self.n_lib = np.concatenate([library, library[: self.window]]), len(library)

    def __call__(self, ids, offsets, heard, prompts):
        from subd.kernels.mel import pad_or_trim_frames

        torch, eng = self.torch, self.engine
        texts, tokens = [], []
        ts = eng.tokenizer.special.timestamp_begin
        for off, h, prompt in zip(offsets, heard, prompts, strict=True):
            n = int(min(h, self.window))
            a = int((off + h - n) % self.n_lib)
            mel = eng.features(self.lib[a : a + n])
            with torch.inference_mode():
                feats = eng.model.encoder(pad_or_trim_frames(mel, self.n_frames)[None].to(
                    self.device))
            r = eng.decode_with_fallback(feats, prompt, _policy(), _options())
            texts.append("" if _policy().silent(r) else eng.tokenizer.decode(
                r.text_tokens(ts)).strip())
            tokens.append(list(r.text_tokens(ts)))
        return texts, tokens


def _half_copy(model, device):
    import copy

    import torch

    from subd.models.whisper import layer_norms_to

    return layer_norms_to(copy.deepcopy(model).to(device, torch.float16).eval(), torch.float16)


def _policy():
    from subd.models.engine import FallbackPolicy

    return FallbackPolicy(temperatures=BENCH_TEMPERATURES, max_fallback_tokens=MAX_NEW_TOKENS)


def _options():
    from subd.models.decoding import DecodeOptions

    return DecodeOptions(max_new_tokens=MAX_NEW_TOKENS)


def calibrate(cost: CostModel, run_round, max_rows: int, n_lib: int, log,
              prompt_tokens: int = 0, latency_ns=lambda: None) -> None:
    """Time steady-state rounds (1 s of new audio per row, prompts from the previous round) at
    a few batch sizes before any stream is live, so the scheduler starts from real costs."""
    rng = np.random.default_rng(1)
    sizes = [n for n in (8, 64, 256, 512, 1024, 2048) if n <= max_rows] or [1, 1, 1]
    for size in sizes:
        ids = np.arange(size)
        offsets = rng.integers(0, n_lib, size=size)
        heard = np.full(size, 9 * 16_000, dtype=np.int64) + rng.integers(0, 16_000, size=size)
        _, prompts = run_round(ids, offsets, heard, [None] * size)  # warm-up, fills the rings
        took = []
        for k in (1, 2):  # the faster of two: one-off first-use costs are not round costs
            t0 = time.monotonic_ns()
            run_round(ids, offsets, heard + k * 16_000,
                      [p[-prompt_tokens:] if prompt_tokens else None for p in prompts])
            # a continuous-batching server reports its typical row's latency; a round server's
            # round takes as long as its slowest row
            typical = latency_ns()
            took.append(time.monotonic_ns() - t0 if typical is None else typical)
        cost.calibrate(size, min(took))
    log("calibrated latency of an isolated batch (typical row): " + ", ".join(
        f"{n} rows {cost.predict_ns(n) / 1e6:.0f} ms" for n in sorted(set(sizes))))


def search(label: str, counts: list[int], make_server, base: SimConfig, n_lib: int,
           log) -> tuple[SimResult | None, list[SimResult]]:
    """Run growing N until one is not served; the last served one is the answer.

    ``make_server(n)`` gives a ``StreamServer`` (continuous batching) or a round function
    (one blocking round per scheduler plan, as naive serving runs)."""
    from subd.bench.gpu_stream import StreamServer, simulate_stream

    best, trials = None, []
    cost = CostModel()  # learned across the trials of one server, as a running server would
    first = make_server(max(counts))
    if isinstance(first, StreamServer):
        calibrate(cost, first.run_round, base.max_rows, n_lib, log, base.prompt_tokens,
                  lambda: first.median_latency_ns)
    else:
        calibrate(cost, first, base.max_rows, n_lib, log, base.prompt_tokens)

    def trial(n: int) -> SimResult:
        cfg = dataclasses.replace(base, n_streams=n)
        server = first if n == max(counts) else make_server(n)
        if isinstance(server, StreamServer):
            res = simulate_stream(cfg, n_lib, server, cost)
        else:
            res = simulate(cfg, n_lib, server, cost)
        trials.append(res)
        log(f"{label} N={n:5d} served={res.served!s:5s} updates={res.n_updates:6d} "
            f"misses={res.n_misses:5d} degraded={res.n_degraded:5d} "
            f"p95_ttfc={res.p95_ttfc_ms:7.1f}ms p95_update={res.p95_update_ms:7.1f}ms "
            f"gpu_util={res.gpu_util_pct:5.1f}% busy={res.busy_pct:5.1f}% "
            f"mean_batch={res.mean_batch:7.1f} first_captions={res.n_first_captions}/{n}"
            + (f"; {res.host_note}" if res.host_note else ""))
        return res

    for n in sorted(counts):
        res = trial(n)
        if not res.served:
            break
        best = res
    n = min(counts) // 2
    while best is None and n >= 1:  # even the smallest N failed: halve it until one is served
        res = trial(n)
        best = res if res.served else None
        n //= 2
    return best, trials


def run(args) -> int:
    if args.policy == "daemon":  # the daemon's own recogniser code (subd.bench.gpu_policy)
        from subd.bench.gpu_shards import run as run_daemon_policy

        return run_daemon_policy(args)
    import torch

    from subd.bench.gpu_checks import front_end_and_transcript_checks, warm_engine
    from subd.bench.gpu_report import TrialLog
    from subd.bench.gpu_stream import StreamServer
    from subd.models.batched import BatchedEngine, EngineConfig
    from subd.models.portable import load_weights

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("no CUDA device: subd bench gpu needs an NVIDIA GPU (or --device cpu)")
    # cuDNN's attention builds a plan per new shape (hundreds of ms): batch sizes and prompt
    # lengths change every round, so use the flash / memory-efficient kernels instead
    torch.backends.cuda.enable_cudnn_sdp(False)
    library, clips = load_library(args.clips)
    loaded = load_weights(args.model)
    log = TrialLog(args.log)

    counts = [int(x) for x in args.streams.split(",")]
    naive_counts = [int(x) for x in args.naive_streams.split(",")]
    max_rows = min(max(counts), args.max_rows)
    base = SimConfig(n_streams=1, duration_s=args.duration_s, ramp_s=args.ramp_s,
                     update_ms=args.update_ms, first_retry_ms=args.first_retry_ms,
                     window_s=args.window_s,
                     first_budget_ms=args.first_budget_ms, budget_ms=args.budget_ms,
                     max_rows=max_rows, prompt_tokens=args.prompt_tokens)
    log(f"model {loaded.name}; device {args.device} "
        f"{torch.cuda.get_device_name() if args.device == 'cuda' else ''}; window "
        f"{args.window_s}s padded to {args.frames} frames; update every {args.update_ms} ms; "
        f"deadlines: first caption {args.first_budget_ms} ms, update {args.budget_ms} ms")
    log(f"simulated: N live streams of real speech (the clips looped, random offsets), Poisson "
        f"arrivals over {args.ramp_s} s, audio arriving in real time and uploaded as it is "
        f"needed; an update decodes the last {args.window_s} s (greedy, fallback "
        f"temperatures {BENCH_TEMPERATURES}); a stream with no caption yet updates every "
        f"{args.first_retry_ms} ms" + (
            " once its previous update is back, greedy only (a looped or repetitive result "
            "shows nothing: the stream retries with more audio)"
            if args.batching == "continuous" else "")
        + "; not simulated: network, VAD, tagging, publishing")
    t0 = time.monotonic()
    cfg = EngineConfig(max_rows=max_rows, max_new_tokens=MAX_NEW_TOKENS,
                       chunk_steps=args.chunk_steps, encoder_rows=args.encoder_rows,
                       ctx_buckets=(32, 64, 96, 128, 192, 448))
    engine = BatchedEngine(loaded, device=args.device, config=cfg)
    for line in front_end_and_transcript_checks(loaded, engine, clips, args.frames):
        log(line)
    warm_engine(engine, args.frames, args.prompt_tokens, int(args.window_s * 16_000))
    log(f"engine ready and graphs captured in {time.monotonic() - t0:.1f} s")
    if args.batching == "rounds":
        def make_server(n):
            return RoundServer(engine, library, n, args.window_s, args.frames)
    else:
        def make_server(n):
            return StreamServer(engine, library, n, args.window_s, args.frames, _policy(),
                                _options())
    best, _ = search(f"batched ({args.batching})", counts, make_server,
                     dataclasses.replace(base, admit_every_ms=args.admit_every_ms,
                                         first_admit_every_ms=args.first_admit_every_ms),
                     len(library), log)
    naive_base = dataclasses.replace(base, max_rows=1)
    naive_server = NaiveServer(loaded, library, args.window_s, args.frames, engine.device)
    naive, _ = search("naive", naive_counts, lambda n: naive_server, naive_base, len(library),
                      log)
    n_b = best.n_streams if best else 0
    n_n = naive.n_streams if naive else 0
    log("")
    log(f"largest N with 0 deadline misses: batched {n_b}, naive {n_n}; "
        f"ratio {n_b / n_n if n_n else float('inf'):.1f}x")
    for name, r in (("batched", best), ("naive", naive)):
        if r:
            log(f"  {name}: p95 time to first caption {r.p95_ttfc_ms:.1f} ms, p95 update "
                f"latency {r.p95_update_ms:.1f} ms, GPU utilisation {r.gpu_util_pct:.1f}% "
                f"(nvidia-smi), busy {r.busy_pct:.1f}% of wall time, mean batch "
                f"{r.mean_batch:.1f}")
    ok_n = best is not None and n_b >= 2000 and best.p95_ttfc_ms <= 300
    log(f"targets: >= 2000 streams with 0 misses and p95 time to first caption <= 300 ms: "
        f"{'met' if ok_n else 'not met'}; >= 20x naive: "
        f"{'met' if n_n and n_b / n_n >= 20 else 'not met'} (time to first caption counts from "
        f"the moment a stream has {base.first_ms} ms of audio)")
    if best and best.sample_texts:
        log(f"  sample caption: {best.sample_texts[0]!r}")
    log.close()
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("gpu", help="live streams served by one GPU vs naive serving")
    p.add_argument("--model", default="tiny.en", help="packaged name, model path or fp16 copy")
    p.add_argument("--clips", type=Path, default=None, help="folder of 16 kHz WAV clips")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--streams", default="250,500,1000,2000,3000,4000")
    p.add_argument("--naive-streams", default="1,2,4,8,16,32")
    p.add_argument("--duration-s", type=float, default=12.0)
    p.add_argument("--ramp-s", type=float, default=3.0)
    p.add_argument("--lead-s", default="auto",
                   help="--policy daemon: seconds every channel streams before its updates "
                        "count (auto: [recognizer] trim_after_ms + 3 s, when its window and "
                        "prompt have stopped growing)")
    p.add_argument("--update-ms", type=int, default=1000)
    p.add_argument("--first-retry-ms", type=int, default=100,
                   help="update cadence of a stream that has shown no caption yet")
    p.add_argument("--window-s", type=float, default=8.0)
    p.add_argument("--frames", type=int, default=3000, choices=(1000, 1500, 2000, 3000))
    p.add_argument("--first-budget-ms", type=int, default=300)
    p.add_argument("--budget-ms", type=int, default=1000)
    p.add_argument("--batching", default="continuous", choices=("continuous", "rounds"),
                   help="rows joining/leaving the decode batch between chunks (H200, "
                        "2026-11-30: 2000 streams, 0 misses), or whole blocking rounds "
                        "(250 streams)")
    p.add_argument("--admit-every-ms", type=int, default=100,
                   help="continuous: admit pending updates at most this often (0: every "
                        "chunk); fewer, larger admissions cost less host time")
    p.add_argument("--first-admit-every-ms", type=int, default=25,
                   help="continuous: but admit streams with no caption yet this often")
    p.add_argument("--chunk-steps", type=int, default=8)
    p.add_argument("--encoder-rows", type=int, default=128)
    p.add_argument("--prompt-tokens", type=int, default=0,
                   help="previous text given as the prompt (0: none)")
    p.add_argument("--max-rows", type=int, default=2048, help="largest batch in one round")
    p.add_argument("--log", type=Path, default=None, help="also write the lines here")
    p.add_argument("--policy", default="daemon", choices=("daemon", "simple"),
                   help="daemon: the recogniser code subd run runs (policy, cadence, VAD, "
                        "word timings; subd.bench.gpu_policy); simple: one update per "
                        "--update-ms over the last --window-s, no prompt (the first bench)")
    from subd.bench.gpu_policy import register_args

    register_args(p)
    p.set_defaults(func=run)


if __name__ == "__main__":  # the same command without the CLI's other modules' dependencies
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="subd bench")
    register(parser.add_subparsers())
    ns = parser.parse_args(["gpu", *sys.argv[1:]])
    sys.exit(ns.func(ns))
