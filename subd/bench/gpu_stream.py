"""The batched side of ``subd bench gpu``: live streams served with continuous batching.

Same workload as ``gpu_sim`` (N streams, Poisson arrivals, real clips looped, one update per
``update_ms`` of audio, first updates retried every ``first_retry_ms`` until a caption shows),
but the GPU work is not cut into rounds: every loop the scheduler admits the most urgent pending
updates into free decode slots (audio upload, features and encoder for just those, then their
prompt prefill), one chunk of decode steps runs for every slot, and the updates the previous
chunk finished are published. A result's time is when the host has its text.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from subd.bench.gpu_sim import (
    NS_PER_MS,
    SAMPLE_RATE_HZ,
    SimConfig,
    SimResult,
    UtilSampler,
    arrivals,
    p95,
)
from subd.gpu.scheduler import CostModel, GpuScheduler, Plan, Update
from subd.models.batched import bucket
from subd.models.batched_continuous import ContinuousDecoder, Request


def tokens_for(seconds: float) -> int:
    """Token cap of an update over ``seconds`` of audio: speech rarely passes 6 tokens a second
    (timestamps included), so a short first window that starts to loop stops long before the
    96-token cap that an 8 s window needs."""
    return int(16 + 10 * np.ceil(seconds))


class StreamAudio:
    """Per-stream audio rings on the device; each admission uploads only the audio that is new
    since the stream's last one (through pinned memory)."""

    def __init__(self, engine, library: np.ndarray, n_streams: int, window_s: float):
        import torch

        self.torch, self.engine = torch, engine
        self.window = int(window_s * SAMPLE_RATE_HZ)
        self.ring_len = self.window + 5 * SAMPLE_RATE_HZ
        self.lib = np.concatenate([library, library[: self.ring_len]])
        self.n_lib = len(library)
        dev = engine.device
        # one spare column per row: the padding of a short row's upload is written there
        self.ring = torch.zeros(n_streams, self.ring_len + 1, device=dev)
        self.uploaded = np.zeros(n_streams, dtype=np.int64)
        self.cols = torch.arange(self.ring_len, device=dev)

    def windows(self, ids: np.ndarray, offsets: np.ndarray, heard: np.ndarray):
        """The last ``window`` samples heard by each stream: ([B, window], lengths [B])."""
        torch, eng = self.torch, self.engine
        up = self.uploaded[ids]
        up = np.where(heard < up, 0, up)  # a stream that starts over re-uploads its window
        new = np.minimum(heard - up, self.ring_len)
        start = heard - new
        width = int(max(new.max(), 1))
        # a fresh pinned block per admission (from torch's caching host allocator, which
        # reuses a block only once its copy has run): the previous admission's upload may
        # still be queued behind a decode chunk
        host = torch.empty(len(ids), width, pin_memory=eng.cuda)
        hn = host.numpy()
        for b in range(len(ids)):
            a = int((offsets[b] + start[b]) % self.n_lib)
            hn[b, : new[b]] = self.lib[a : a + new[b]]
        self.uploaded[ids] = heard
        stride = self.ring_len + 1
        with torch.inference_mode(), eng._on("features"):
            dev = eng.device
            rows = host.to(dev, non_blocking=True)
            meta = torch.from_numpy(np.stack([ids, start, new, heard])).pin_memory() \
                if eng.cuda else torch.from_numpy(np.stack([ids, start, new, heard]))
            sid_t, start_t, new_t, heard_t = meta.to(dev, non_blocking=True)
            cols = self.cols[None, :width]
            where = (start_t[:, None] + cols) % self.ring_len
            where = torch.where(cols < new_t[:, None], where, self.ring_len)  # spare column
            self.ring.view(-1)[(sid_t[:, None] * stride + where).view(-1)] = rows.reshape(-1)
            length = heard_t.clamp(max=self.window)
            wc = self.cols[None, : self.window]
            src = ((heard_t - length)[:, None] + wc) % self.ring_len
            win = torch.where(wc < length[:, None], self.ring[sid_t[:, None], src], 0.0)
        return win, length


class StreamServer:
    """Audio rings + encoder + a ``ContinuousDecoder``; results as (key, text, text tokens)."""

    def __init__(self, engine, library: np.ndarray, n_streams: int, window_s: float,
                 n_frames: int, policy, options):
        import torch

        self.torch, self.engine, self.n_frames, self.policy = torch, engine, n_frames, policy
        self.audio = StreamAudio(engine, library, n_streams, window_s)
        self.decoder = ContinuousDecoder(engine, policy, options)

    def admit(self, ids, offsets, heard, prompts, keys, greedy_only=None) -> None:
        """Start decoding the rows' windows. ``greedy_only[b]``: row b gets one greedy attempt
        and no temperature fallback; a looped or repetitive result then has no text (a stream
        with no caption yet retries with more audio sooner than a fallback chain would end)."""
        eng = self.engine
        win, length = self.audio.windows(ids, offsets, heard)
        # the front end and encoder see only bucketed batch sizes: every new size would cost a
        # new cuFFT plan and cuDNN convolution plan (milliseconds each) on the live path
        g = len(ids)
        pad = (bucket(g, eng.config.row_buckets) if eng.cuda else g) - g
        if pad > 0:  # on the stream that wrote the windows (the default stream would not wait
            # for it: the padded copy then read stale audio, 2026-11-30)
            with self.torch.inference_mode(), eng._on("features"):
                win = self.torch.nn.functional.pad(win, (0, 0, 0, pad))
                length = self.torch.nn.functional.pad(length, (0, pad))
        feats = eng.encode(eng.features(win, length, self.n_frames))[:g]
        seconds = np.minimum(heard, self.audio.window) / SAMPLE_RATE_HZ
        once = greedy_only if greedy_only is not None else [False] * g
        self.decoder.admit(feats, [
            Request(k, tuple(p) if p else None, tokens_for(s), 1 if o else None)
            for k, p, s, o in zip(keys, prompts, seconds, once, strict=True)])

    def iterate(self) -> list[tuple[object, str, list[int]]]:
        eng, pol = self.engine, self.policy
        ts = eng.special.timestamp_begin
        out = []
        for f in self.decoder.iterate():
            r = f.result
            silent = pol.silent(r)
            # a greedy-only row (live decoding is greedy, as subd/recognise/streaming.py
            # decodes) shows nothing if it looped or repeats itself; a low average
            # log-probability alone, which most 1 s windows have, does not hide it
            # (2026-11-30: hiding those sent 40 % of first captions to a second update).
            # A full fallback chain shows its last attempt.
            capped = not f.accepted and f.n_attempts < len(pol.temperatures)
            junk = r.looped or r.compression_ratio > pol.compression_ratio_threshold
            text = "" if silent or (capped and junk) else eng.text(r)
            out.append((f.key, text, r.text_tokens(ts)))
        return out

    def run_round(self, ids, offsets, heard, prompts):
        """All rows at once, waiting for every one (calibration); ``median_latency_ns`` is then
        the typical row's latency, which is what the scheduler's cost model predicts here (the
        slowest row, with its fallback re-decodes, delays no other row)."""
        got, i, t0 = {}, 0, time.monotonic_ns()
        took = []
        while i < len(ids) or self.decoder.n_busy or len(got) < len(ids):
            take = min(len(ids) - i, self.decoder.n_free)
            if take:
                j = slice(i, i + take)
                self.admit(ids[j], offsets[j], heard[j], prompts[j], list(range(i, i + take)))
                i += take
            for k, t, tok in self.iterate():
                got[k] = (t, tok)
                took.append(time.monotonic_ns() - t0)
        self.median_latency_ns = int(np.median(took))
        return [got[k][0] for k in range(len(ids))], [got[k][1] for k in range(len(ids))]


_EMPTY = Plan((), (), 0)


def simulate_stream(cfg: SimConfig, n_library: int, server: StreamServer,
                    cost: CostModel | None = None,
                    clock_ns: Callable[[], int] = time.monotonic_ns) -> SimResult:
    with UtilSampler() as util:
        return _run(cfg, n_library, server, cost or CostModel(), clock_ns, util)


def _run(cfg: SimConfig, n_library: int, server: StreamServer, cost: CostModel,
         clock_ns: Callable[[], int], util: UtilSampler) -> SimResult:
    rng, n, start_ns, offset, next_ready, seq, shown, prompts, end_ns = arrivals(
        cfg, n_library, clock_ns)
    # the cost model keeps its calibration (a group's latency alone, by size): once rows share
    # the GPU with the groups in flight, a group's latency says how loaded the GPU is, not what
    # its size costs, and learning it as a size cost made the scheduler degrade updates that
    # would have been served (N=1000: 7701 degraded, 2026-11-30)
    sched = GpuScheduler(cost, cfg.max_rows, max_round_ns=cfg.first_budget_ms * NS_PER_MS // 2)
    attempts = np.zeros(n, dtype=np.int64)  # first-caption updates a stream needed
    in_flight = np.zeros(n, dtype=bool)  # a first-caption update is admitted or pending
    ttfc, upd, samples = [], [], []
    n_updates = n_misses = n_groups = 0
    busy_ns = 0
    dec = server.decoder
    chunks0, steps0, stepped0 = dec.n_chunks, dec.active_row_steps, dec.stepped_row_steps
    last_admit = 0
    spent = [0, 0, 0]  # ns in: scheduling, admission (upload, encoder, prefill), step+harvest
    wall0 = last = clock_ns()
    while (now := clock_ns()) < end_ns:
        if dec.n_busy:
            busy_ns += now - last
        last = now
        # a stream with no caption yet retries only once its update in flight has come back
        # empty (else a slow first update would draw a new one every first_retry_ms)
        for s in np.nonzero((next_ready <= now) & ~in_flight)[0]:
            if not shown[s]:
                late = (now - next_ready[s]) // (cfg.first_retry_ms * NS_PER_MS)
                next_ready[s] += late * cfg.first_retry_ms * NS_PER_MS
                in_flight[s] = True
            ready = int(next_ready[s])
            budget = cfg.budget_ms if shown[s] else cfg.first_budget_ms
            sched.submit(Update(int(s), ready, ready + budget * NS_PER_MS, not shown[s],
                                int(seq[s])))
            seq[s] += 1
            next_ready[s] += (cfg.update_ms if shown[s] else cfg.first_retry_ms) * NS_PER_MS
        # each admission costs the host a few hundred kernel launches whatever its size, so
        # with --admit-every-ms updates gather for a while, unless the GPU has nothing to do;
        # streams with no caption yet wait at most --first-admit-every-ms
        gap = now - last_admit
        due = (not dec.n_busy or gap >= cfg.admit_every_ms * NS_PER_MS
               or (sched.n_first_pending > 0 and gap >= cfg.first_admit_every_ms * NS_PER_MS))
        plan = sched.plan(now, limit=dec.n_free) if due else _EMPTY
        t_plan = clock_ns()
        spent[0] += t_plan - now
        for u in plan.degraded:
            in_flight[u.stream_id] = False
        if plan.batch:
            ids = np.array([u.stream_id for u in plan.batch])
            ready = np.array([u.ready_ns for u in plan.batch], dtype=np.int64)
            heard = (ready - start_ns[ids]) * SAMPLE_RATE_HZ // 10**9
            server.admit(ids, offset[ids], heard, [prompts[s] for s in ids],
                         list(plan.batch), [u.first_caption for u in plan.batch])
            last_admit = now
            n_groups += 1
        t_admit = clock_ns()
        finished = server.iterate()
        t_end = clock_ns()
        spent[1] += t_admit - t_plan
        spent[2] += t_end - t_admit
        for u, text, toks in finished:
            n_updates += 1
            n_misses += t_end > u.deadline_ns
            attempts[u.stream_id] += not shown[u.stream_id]
            in_flight[u.stream_id] = False
            if cfg.prompt_tokens > 0:
                prompts[u.stream_id] = toks[-cfg.prompt_tokens :] or prompts[u.stream_id]
            if not shown[u.stream_id] and text:
                shown[u.stream_id] = True
                next_ready[u.stream_id] = u.ready_ns + cfg.update_ms * NS_PER_MS
                first_ready = int(start_ns[u.stream_id]) + cfg.first_ms * NS_PER_MS
                ttfc.append((t_end - first_ready) / NS_PER_MS)
            elif u.seq > 0 and shown[u.stream_id]:
                upd.append((t_end - u.ready_ns) / NS_PER_MS)
            if text and len(samples) < 3 and not u.first_caption:  # a full window
                samples.append(text)
        if not plan.batch and not dec.n_busy and not finished:
            time.sleep(0.0005)
    wall = clock_ns() - wall0
    steps = (dec.n_chunks - chunks0) * server.engine.config.chunk_steps
    return SimResult(
        n_streams=n, n_updates=n_updates, n_misses=int(n_misses), n_degraded=sched.n_degraded,
        n_superseded=sched.n_superseded, p95_ttfc_ms=p95(ttfc), p95_update_ms=p95(upd),
        n_first_captions=int(shown.sum()), gpu_util_pct=util.mean,
        busy_pct=100.0 * busy_ns / max(wall, 1),
        mean_batch=(dec.active_row_steps - steps0) / max(steps, 1),
        sample_texts=tuple(samples),
        host_note=f"rows stepped per step {(dec.stepped_row_steps - stepped0) / max(steps, 1):.1f}"
        f" (compaction), {n_groups} admissions; first caption: p50 {np.median(ttfc or [0]):.0f}"
        f" ms, {np.mean(attempts[shown] > 1) * 100 if shown.any() else 0:.1f}% of streams "
        "needed more than one update; loop time: " + ", ".join(
            f"{name} {100 * x / max(wall, 1):.0f}%" for name, x in
            zip(("scheduling", "admission", "decode chunk + results"), spent, strict=True)))
