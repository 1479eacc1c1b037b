"""The live-stream simulation behind ``subd bench gpu``: N streams, Poisson arrivals, real time.

Each stream plays the real clips, looped, from a random offset, in real time. Once a stream has
``first_ms`` of audio it asks for its first update, then one every ``first_retry_ms`` until one
gives text (the first caption), then one every ``update_ms``. An update
decodes the last ``window_s`` of the stream's audio (a bounded window, as the streaming
recogniser keeps), with no prompt unless ``prompt_tokens`` is set.
Every update goes through ``GpuScheduler``; here a round runs one batch (naive serving: one
update; the batched server uses ``gpu_stream``'s continuous batching); a result later than its
deadline is a *miss*; an update the scheduler degrades publishes the fallback (counted).
"""

from __future__ import annotations

import threading
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from subd.bench.quality_sets import POCKETSPHINX
from subd.errors import UserError
from subd.gpu.scheduler import CostModel, GpuScheduler, Update

CLIP_DIRS = (POCKETSPHINX / "librivox", Path(".benchdata/librivox"))

SAMPLE_RATE_HZ = 16_000
NS_PER_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class SimConfig:
    n_streams: int
    duration_s: float = 15.0  # after the last arrival has had time to start
    ramp_s: float = 3.0  # arrivals: a Poisson process of rate n_streams / ramp_s
    first_ms: int = 1000  # audio needed before the first update
    update_ms: int = 1000
    first_retry_ms: int = 100  # while a stream has shown nothing, its next update comes this soon
    window_s: float = 8.0
    # the previous update's text lies *inside* the next overlapping window, so it is a bad
    # prompt (Whisper then skips or repeats it, and the fallback re-decodes): off by default
    prompt_tokens: int = 0
    admit_every_ms: int = 0  # continuous batching: least time between admissions (0: none)
    # ... except for streams with no caption yet, admitted this often (0: at the next chunk)
    first_admit_every_ms: int = 0
    first_budget_ms: int = 300  # time to first caption allowed after the first update is ready
    budget_ms: int = 1000  # an update's deadline after its audio is complete
    max_rows: int = 2048
    seed: int = 0


@dataclass(frozen=True, slots=True)
class SimResult:
    n_streams: int
    n_updates: int
    n_misses: int
    n_degraded: int
    n_superseded: int
    p95_ttfc_ms: float
    p95_update_ms: float
    n_first_captions: int
    gpu_util_pct: float  # nvidia-smi's sampled utilisation over the run (nan without CUDA)
    busy_pct: float  # share of wall time inside GPU rounds
    mean_batch: float
    sample_texts: tuple[str, ...]
    host_note: str = ""  # where the serving loop's wall time went (continuous batching only)

    @property
    def served(self) -> bool:
        return self.n_misses == 0 and self.n_degraded == 0 and self.n_first_captions > 0


# run_round(stream_ids, offsets, samples heard, prompts) -> (texts, token lists), blocking:
# stream s's audio is library[(offsets[s] + i) % len(library)] for i < heard[s]
RoundFn = Callable[[np.ndarray, np.ndarray, np.ndarray, list[list[int] | None]],
                   tuple[list[str], list[list[int]]]]


class UtilSampler:
    """torch.cuda.utilization() (NVML) every 100 ms in a thread; mean over the samples."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> UtilSampler:
        try:
            import torch

            if not torch.cuda.is_available():
                return self
            torch.cuda.utilization()
        except Exception:  # noqa: BLE001 - no NVML: report nan, the bench still runs
            return self

        def loop() -> None:
            while not self._stop.wait(0.1):
                self.samples.append(float(torch.cuda.utilization()))

        self._thread = threading.Thread(target=loop, name="gpu-util", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def mean(self) -> float:
        return float(np.mean(self.samples)) if self.samples else float("nan")


def p95(values: list[float]) -> float:
    return float(np.percentile(values, 95)) if values else float("nan")


def simulate(cfg: SimConfig, n_library: int, run_round: RoundFn, cost: CostModel | None = None,
             clock_ns: Callable[[], int] = time.monotonic_ns) -> SimResult:
    util = UtilSampler().__enter__()  # before the clock starts: it may import torch
    try:
        return _run(cfg, n_library, run_round, cost, clock_ns, util)
    finally:
        util.__exit__(None, None, None)


def arrivals(cfg: SimConfig, n_library: int, clock_ns: Callable[[], int]):
    """Poisson stream arrivals over ``ramp_s`` at random library offsets: (rng, n, start_ns,
    offset, next_ready, seq, shown, prompts, end_ns), shared by both simulations."""
    rng = np.random.default_rng(cfg.seed)
    n = cfg.n_streams
    gaps = rng.exponential(cfg.ramp_s / n, size=n)
    t0 = clock_ns() + 50 * NS_PER_MS
    start_ns = t0 + (np.cumsum(gaps) * 1e9).astype(np.int64)
    offset = rng.integers(0, n_library, size=n)
    next_ready = start_ns + cfg.first_ms * NS_PER_MS
    seq = np.zeros(n, dtype=np.int64)
    shown = np.zeros(n, dtype=bool)
    prompts: list[list[int] | None] = [None] * n
    end_ns = int(start_ns.max()) + int(cfg.duration_s * 1e9)
    return rng, n, start_ns, offset, next_ready, seq, shown, prompts, end_ns


def _run(cfg: SimConfig, n_library: int, run_round: RoundFn, cost: CostModel | None,
         clock_ns: Callable[[], int], util: UtilSampler) -> SimResult:
    rng, n, start_ns, offset, next_ready, seq, shown, prompts, end_ns = arrivals(
        cfg, n_library, clock_ns)
    sched = GpuScheduler(cost or CostModel(), cfg.max_rows,
                         max_round_ns=cfg.first_budget_ms * NS_PER_MS // 2)
    ttfc, upd = [], []
    n_updates = n_misses = 0
    busy_ns = 0
    batches: list[int] = []
    samples: list[str] = []
    wall0 = clock_ns()
    while (now := clock_ns()) < end_ns:
        for s in np.nonzero(next_ready <= now)[0]:
            ready = int(next_ready[s])
            budget = cfg.budget_ms if shown[s] else cfg.first_budget_ms
            sched.submit(Update(int(s), ready, ready + budget * NS_PER_MS, not shown[s],
                                int(seq[s])))
            seq[s] += 1
            next_ready[s] += (cfg.update_ms if shown[s] else cfg.first_retry_ms) * NS_PER_MS
        plan = sched.plan(now)
        if not plan.batch:
            time.sleep(0.001)
            continue
        ids = np.array([u.stream_id for u in plan.batch])
        ready = np.array([u.ready_ns for u in plan.batch], dtype=np.int64)
        heard = (ready - start_ns[ids]) * SAMPLE_RATE_HZ // 10**9  # audio the update covers
        t_start = clock_ns()
        texts, tokens = run_round(ids, offset[ids], heard, [prompts[s] for s in ids])
        t_end = clock_ns()
        sched.done(plan, t_end - t_start)
        busy_ns += t_end - t_start
        batches.append(len(ids))
        for u, text, toks in zip(plan.batch, texts, tokens, strict=True):
            n_updates += 1
            n_misses += t_end > u.deadline_ns
            if cfg.prompt_tokens > 0:  # previous text as the prompt (off by default)
                prompts[u.stream_id] = toks[-cfg.prompt_tokens :] or prompts[u.stream_id]
            if not shown[u.stream_id] and text:
                shown[u.stream_id] = True
                next_ready[u.stream_id] = u.ready_ns + cfg.update_ms * NS_PER_MS
                first_ready = int(start_ns[u.stream_id]) + cfg.first_ms * NS_PER_MS
                ttfc.append((t_end - first_ready) / NS_PER_MS)
            elif u.seq > 0 and shown[u.stream_id]:
                upd.append((t_end - u.ready_ns) / NS_PER_MS)
            if text and len(samples) < 3 and u.seq >= 3:
                samples.append(text)
    wall = clock_ns() - wall0
    return SimResult(
        n_streams=n, n_updates=n_updates, n_misses=int(n_misses), n_degraded=sched.n_degraded,
        n_superseded=sched.n_superseded, p95_ttfc_ms=p95(ttfc), p95_update_ms=p95(upd),
        n_first_captions=int(shown.sum()), gpu_util_pct=util.mean,
        busy_pct=100.0 * busy_ns / max(wall, 1), mean_batch=float(np.mean(batches or [0])),
        sample_texts=tuple(samples))


def load_library(clip_dir: Path | None) -> tuple[np.ndarray, list[np.ndarray]]:
    dirs = [clip_dir] if clip_dir else [d for d in CLIP_DIRS if d.is_dir()][:1]
    files = sorted(f for d in dirs for f in d.glob("*.wav"))
    if not files:
        raise UserError("no clips: give --clips DIR with 16 kHz mono 16-bit WAV files")
    clips = []
    for f in files:
        try:
            with wave.open(str(f)) as w:
                if w.getframerate() != 16_000 or w.getnchannels() != 1 or w.getsampwidth() != 2:
                    raise UserError(f"{f}: not 16 kHz mono 16-bit WAV")
                pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
        except (OSError, wave.Error, EOFError) as exc:
            raise UserError(f"{f}: unreadable WAV ({exc})") from None
        clips.append(pcm.astype(np.float32) / 32768.0)
    gap = np.zeros(4000, dtype=np.float32)  # 0.25 s between clips
    return np.concatenate([x for c in clips for x in (c, gap)]), clips
