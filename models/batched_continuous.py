"""Iteration-level ("continuous") batching over the batched engine's static decode buffers.

A round-based batch decodes until its *longest* row is done: with windows of ~30 tokens and a
few rows that run to the 96-token cap, most row-steps of a round are spent on rows that already
finished, and a stream that arrives mid-round waits for the whole round. Here every row of the
static buffers is a *slot*: a request joins at the next chunk boundary (its cross-attention
keys/values and prompt prefill are written into a free slot), the chunk graph steps every slot,
and a row leaves as soon as it is done. A row that needs the temperature fallback is re-admitted
into its own slot (its audio keys/values are still there) at the next temperature, so one bad
row delays no other row.

A chunk steps every row up to the highest occupied slot (rounded up to a graph bucket), so
when rows leave, the survivors above the bucket their number needs are moved down into free
slots (their caches and state copied on the device): 20 stragglers of a 2048-row group are
stepped as a 32-row batch, not as 2048 rows.

The host never waits for the chunk it just queued: after queuing chunk k it reads the done
flags and tokens of chunk k-1 (copied to pinned memory behind it), so the GPU always has work.
Greedy rows give exactly ``BatchedEngine.decode``'s tokens (same buffers, rules and steps).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import torch

from subd.models.batched import BatchedEngine, bucket
from subd.models.batched_decode import StepShape, prefill
from subd.models.decoding import DecodeOptions, DecodeResult
from subd.models.engine import DEFAULT_OPTIONS, DEFAULT_POLICY, FallbackPolicy


@dataclass(frozen=True, slots=True)
class Request:
    key: object  # the caller's handle, returned with the result
    previous: tuple[int, ...] | None = None  # text tokens before the window (the prompt)
    max_new_tokens: int | None = None  # this request's own cap (e.g. by its audio's length)
    max_attempts: int | None = None  # fewer temperatures than the policy's (1: greedy only)


@dataclass(frozen=True, slots=True)
class Finished:
    key: object
    result: DecodeResult
    n_attempts: int  # 1 + fallback re-decodes
    accepted: bool = True  # passed the fallback checks (or silent); False: attempts ran out


@dataclass(slots=True)
class _Slot:
    index: int  # its row in the buffers (moves when the batch is compacted)
    request: Request
    attempt: int  # index into the policy's temperatures
    admitted_iter: int  # first iteration whose snapshot covers this attempt
    plen: int
    max_new: int
    steps_queued: int = 0


class _Gathered:
    """Some rows of DecodeBuffers as a compact batch that ``BatchRules.select`` can update."""

    READ = ("logits", "n_gen", "last_tok", "prev_tok", "last_stamp", "done", "looped", "runs",
            "out_tok", "out_lp", "out_mark", "max_new", "temperature", "tokens_in", "n_forced",
            "cont")
    WRITTEN = ("n_gen", "last_tok", "prev_tok", "last_stamp", "done", "looped", "runs",
               "out_tok", "out_lp", "out_mark", "tokens_in")

    def __init__(self, buf, ix: torch.Tensor):
        for name in self.READ:
            setattr(self, name, getattr(buf, name).index_select(0, ix))
        self.all_done = torch.zeros((), dtype=torch.bool, device=ix.device)
        self.rng_seed = buf.rng_seed  # shared: gathered rows draw from the same counter
        # teacher forcing (bench gpu's capacity mode), read by BatchRules.select
        self.forced = None if buf.forced is None else buf.forced.index_select(0, ix)

    def scatter_back(self, buf, ix: torch.Tensor) -> None:
        for name in self.WRITTEN:
            getattr(buf, name).index_copy_(0, ix, getattr(self, name))


class ContinuousDecoder:
    def __init__(self, engine: BatchedEngine, policy: FallbackPolicy = DEFAULT_POLICY,
                 options: DecodeOptions = DEFAULT_OPTIONS):
        self.engine, self.policy, self.options = engine, policy, options
        self.buf = engine.buf
        cap = engine.config.max_rows
        self._free = list(range(cap))  # a heap: the lowest free slot first keeps rows packed
        self._slots: list[_Slot | None] = [None] * cap
        self._retry: list[int] = []  # slots to re-admit at their next temperature
        self._n_audio: int | None = None
        dev, pin = engine.device, engine.cuda
        self.no_speech = torch.zeros(cap, dtype=torch.float32, device=dev)
        width = self.buf.out_tok.shape[1]
        # two snapshots of the per-row outcome in pinned host memory: written behind chunk k,
        # read while chunk k+1 runs
        self._snap = [dict(done=torch.zeros(cap, dtype=torch.bool, pin_memory=pin),
                           looped=torch.zeros(cap, dtype=torch.bool, pin_memory=pin),
                           n_gen=torch.zeros(cap, dtype=torch.long, pin_memory=pin),
                           lp=torch.zeros(cap, dtype=torch.float32, pin_memory=pin),
                           nsp=torch.zeros(cap, dtype=torch.float32, pin_memory=pin),
                           tok=torch.zeros(cap, width, dtype=torch.long, pin_memory=pin))
                      for _ in range(2)]
        # (iteration, rows, event, the slots' owners then): compaction may move rows between
        # a snapshot and its harvest, so results are matched by owner, not by row
        self._pending: tuple | None = None
        self.iteration = 0
        self.n_chunks = 0
        self.buf.done.fill_(True)  # unoccupied rows are stepped as finished rows
        self.active_row_steps = 0  # rows occupied x steps run (for the mean batch figure)
        self.stepped_row_steps = 0  # rows stepped (the graph bucket) x steps
        self.n_moved = 0  # rows moved down by compaction

    # ---- capacity ------------------------------------------------------------------------
    @property
    def n_free(self) -> int:
        return len(self._free)

    @property
    def n_busy(self) -> int:
        return len(self._slots) - len(self._free)

    def _top(self) -> int:
        return max((i for i, s in enumerate(self._slots) if s is not None), default=-1) + 1

    def _rows(self) -> int:
        top = self._top()
        if not self.engine.cuda or not top:
            return top
        return min(bucket(top, self.engine.config.row_buckets), self.engine.config.max_rows)

    # ---- compaction ----------------------------------------------------------------------
    PER_ROW = ("tokens_in", "plen", "max_new", "n_gen", "last_tok", "prev_tok", "last_stamp",
               "done", "looped", "runs", "out_tok", "out_lp", "out_mark", "temperature")

    def _compact(self) -> None:
        """Move rows above the bucket that the busy count needs into free slots below it."""
        eng, buf = self.engine, self.buf
        busy, top = self.n_busy, self._top()
        if not busy:
            return
        buckets = eng.config.row_buckets if eng.cuda else tuple(range(1, top + 1))
        target = bucket(busy, buckets)
        if bucket(top, buckets) <= target:
            return
        movers = [i for i in range(target, top) if self._slots[i] is not None]
        holes = [i for i in range(target) if self._slots[i] is None][: len(movers)]
        moves = torch.tensor([movers, holes], dtype=torch.long)
        n_ctx = eng.model.dims.n_text_ctx
        reach = max(self._slots[i].plen + self._slots[i].steps_queued + 1 for i in movers)
        ctx = min(bucket(reach, eng.config.ctx_buckets), n_ctx)
        t = self._n_audio
        with torch.inference_mode(), eng._on("decode"):
            src, dst = self._up(moves)
            for name in self.PER_ROW:
                x = getattr(buf, name)
                x[dst] = x[src]
            self.no_speech[dst] = self.no_speech[src]
            for x, width in ((buf.self_k, ctx), (buf.self_v, ctx), (buf.cross_k, t),
                             (buf.cross_v, t)):
                x[:, dst, :, :width] = x[:, src, :, :width]
            buf.done[src] = True  # vacated rows are stepped as finished rows
        for a, b in zip(movers, holes, strict=True):
            slot = self._slots[a]
            slot.index, self._slots[b], self._slots[a] = b, slot, None
        moved = dict(zip(movers, holes, strict=True))
        self._retry = [moved.get(i, i) for i in self._retry]
        self._free = [i for i, s in enumerate(self._slots) if s is None]
        heapq.heapify(self._free)
        self.n_moved += len(movers)

    # ---- admission -----------------------------------------------------------------------
    def admit(self, feats: torch.Tensor, requests: list[Request]) -> None:
        """Requests with encoder output ``feats`` [G, T, D] (G ≤ n_free) join the batch."""
        if len(requests) > self.n_free:
            raise ValueError(f"{len(requests)} requests for {self.n_free} free slots")
        if self._n_audio is None:
            self._n_audio = feats.shape[1]
        elif feats.shape[1] != self._n_audio:
            raise ValueError("every request of one decoder must have the same audio length")
        slots = [heapq.heappop(self._free) for _ in requests]
        for s, r in zip(slots, requests, strict=True):
            self._slots[s] = _Slot(s, r, 0, self.iteration, 0, 0)
        self._start(slots, feats)

    def _start(self, slots: list[int], feats: torch.Tensor | None) -> None:
        """Reset the rows' state and prefill their prompts (attempt and request from _slots)."""
        eng, buf = self.engine, self.buf
        n_ctx = eng.model.dims.n_text_ctx
        temps, built = [], []
        for s in slots:
            slot = self._slots[s]
            t = self.policy.temperatures[slot.attempt]
            prev = slot.request.previous if t <= 0.5 else None
            prompt, sot = eng.build_prompt(list(prev) if prev else None)
            cap = self.policy.attempt(self.options, slot.attempt).max_new_tokens
            if slot.request.max_new_tokens is not None:
                cap = min(cap, slot.request.max_new_tokens)
            slot.plen = len(prompt)
            slot.max_new = min(cap, eng.config.max_new_tokens, n_ctx - len(prompt))
            slot.admitted_iter, slot.steps_queued = self.iteration, 0
            temps.append(t)
            built.append((prompt, sot))
        n, p_max = len(slots), max(len(p) for p, _ in built)
        # one host block, one copy: slots, prompt lengths, sot positions, caps, prompts
        packed = np.full((4 + p_max, n), eng.special.eot, dtype=np.int64)
        packed[0] = slots
        packed[1] = [len(p) for p, _ in built]
        packed[2] = [s for _, s in built]
        packed[3] = [self._slots[s].max_new for s in slots]
        for b, (p, _) in enumerate(built):
            packed[4 : 4 + len(p), b] = p
        with torch.inference_mode(), eng._on("decode", after="encode"):
            if feats is not None and eng.cuda:  # made on the encode stream, read here (later)
                feats.record_stream(eng.streams["decode"])
            dev = self._up(torch.from_numpy(packed))
            ix, plen, sot, max_new = dev[0], dev[1], dev[2], dev[3]
            prompts = dev[4:].t()
            buf.plen[ix] = plen
            buf.max_new[ix] = max_new
            buf.temperature[ix] = self._up(torch.tensor(temps, dtype=torch.float32))
            for name in ("n_gen", "last_tok", "prev_tok", "runs", "out_lp"):
                getattr(buf, name)[ix] = 0
            buf.last_stamp[ix] = -1
            buf.done[ix] = False
            buf.looped[ix] = False
            shape = StepShape(n, self._n_audio, 0)
            self.no_speech[ix] = prefill(eng.model.decoder, buf, prompts, plen, sot, shape,
                                         eng.special.no_speech, slots=ix, audio=feats)
            # the first token from the prefill's logits, chosen on the new rows alone (gathered,
            # so admitting a few rows costs the same in a batch of 8 or of 2048)
            rows = _Gathered(buf, ix)
            eng._rules_for(self.options).select(rows, n, any(t > 0 for t in temps))
            rows.scatter_back(buf, ix)

    def _up(self, host: torch.Tensor) -> torch.Tensor:
        """Host -> device without waiting for the queued chunk (a pageable copy may wait)."""
        if not self.engine.cuda:
            return host
        return host.pin_memory().to(self.engine.device, non_blocking=True)

    # ---- the step loop -------------------------------------------------------------------
    def iterate(self) -> list[Finished]:
        """Queue one chunk of decode steps for every occupied slot; return the requests that the
        previous chunk finished (their slots are free for the next admission)."""
        eng = self.engine
        self._compact()
        if self._retry:
            retry, self._retry = self._retry, []
            self._start(retry, None)
        rows = self._rows()
        queued = None
        if rows:
            busy = [s for s in self._slots[:rows] if s is not None]
            k = eng.config.chunk_steps
            reach = max(s.plen + min(s.steps_queued + k, s.max_new) + 1 for s in busy)
            ctx = min(bucket(reach, eng.config.ctx_buckets), eng.model.dims.n_text_ctx)
            sample = any(self.policy.temperatures[s.attempt] > 0 for s in busy)
            with torch.inference_mode(), eng._on("decode"):
                eng._replay(eng._rules_for(self.options), StepShape(rows, self._n_audio, ctx),
                            sample)
                for s in busy:
                    s.steps_queued += k
                self.n_chunks += 1
                self.active_row_steps += len(busy) * k
                self.stepped_row_steps += rows * k
                queued = self._snapshot(rows)
        eng._join("decode")
        done = self._harvest()
        self._pending = queued
        self.iteration += 1
        return done

    def drain(self) -> list[Finished]:
        """Iterate until every admitted request has finished (for calibration and tests)."""
        out: list[Finished] = []
        while self.n_busy or self._pending is not None:
            out += self.iterate()
        return out

    def _snapshot(self, rows: int) -> tuple:
        buf, snap = self.buf, self._snap[self.iteration % 2]
        for name, src in (("done", buf.done), ("looped", buf.looped), ("n_gen", buf.n_gen),
                          ("nsp", self.no_speech)):
            snap[name][:rows].copy_(src[:rows], non_blocking=True)
        snap["lp"][:rows].copy_(buf.out_lp[:rows].sum(dim=1), non_blocking=True)
        snap["tok"][:rows].copy_(buf.out_tok[:rows], non_blocking=True)
        ev = None
        if self.engine.cuda:
            ev = torch.cuda.Event(blocking=True)  # waited for asleep (batched.wait)
            ev.record(self.engine.streams["decode"])
        return self.iteration, rows, ev, tuple(self._slots[:rows])

    def _harvest(self) -> list[Finished]:
        if self._pending is None:
            return []
        it, rows, ev, owners = self._pending
        if ev is not None:
            ev.synchronize()
        # numpy views of the pinned snapshot: element reads without torch's per-call overhead
        snap = {k: v.numpy() for k, v in self._snap[it % 2].items()}
        done = snap["done"][:rows].nonzero()[0].tolist()
        out: list[Finished] = []
        pol = self.policy
        retrying = set(self._retry)
        for s in done:
            slot = owners[s]
            if slot is None or self._slots[slot.index] is not slot or slot.admitted_iter > it \
                    or slot.index in retrying:
                continue  # a free slot, or a newer attempt than this snapshot shows
            n_gen = int(snap["n_gen"][s])
            res = self.engine._result(snap["tok"][s, :n_gen].tolist(), float(snap["lp"][s]),
                                      float(snap["nsp"][s]),
                                      pol.temperatures[slot.attempt], bool(snap["looped"][s]))
            silent, bad = pol.silent(res), pol.failed(res)
            limit = min(len(pol.temperatures), slot.request.max_attempts or len(pol.temperatures))
            if bad and not silent and slot.attempt + 1 < limit:
                slot.attempt += 1
                self._retry.append(slot.index)
                retrying.add(slot.index)
                continue
            out.append(Finished(slot.request.key, res, slot.attempt + 1, silent or not bad))
            self._slots[slot.index] = None
            heapq.heappush(self._free, slot.index)
        return out
