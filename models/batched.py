"""Batched Whisper engine: many streams' windows per call, on the GPU (or the CPU for tests).

* Front end: ``kernels.mel_gpu.log_mel_batch`` on rows uploaded through a pinned host buffer.
* Encoder: batched across streams in chunks, on windows trimmed to a frame bucket the caller
  picks (3000 frames = the full 30 s, which is what the single-stream engine always uses).
* Decoder: static key/value cache (``batched_decode.DecodeBuffers``), per-row prompt lengths,
  the timestamp rules and loop guard on the device, and on CUDA one graph per
  (row bucket, audio length, context bucket, greedy/sampled) holding ``chunk_steps`` steps.
* Streams: the upload+features, the encoder and the decoder each run on their own CUDA stream,
  ordered by events, so the next batch's upload and features overlap the current decode.

Greedy results equal ``WhisperEngine.decode`` row by row (same rules, same loop guard); the
sampled fallback draws on the device (Philox in the fused selection on CUDA), so its samples
differ from the CPU engine's.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import numpy as np
import torch

from subd.kernels.mel_gpu import log_mel_batch
from subd.models.batched_decode import (
    BatchRules,
    DecodeBuffers,
    StepShape,
    cross_fill,
    decode_step,
    prefill,
)
from subd.models.decoding import DecodeOptions, DecodeResult, compression_ratio
from subd.models.engine import DEFAULT_OPTIONS, DEFAULT_POLICY, MAX_PROMPT_TOKENS, FallbackPolicy
from subd.models.loading import LoadedModel
from subd.models.whisper import layer_norms_to

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096)
CTX_BUCKETS = (32, 64, 96, 128, 192, 256, 448)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_rows: int = 256
    max_new_tokens: int = 224
    chunk_steps: int = 8  # decode steps per graph replay; the host looks once per chunk
    encoder_rows: int = 128  # rows per encoder call (bounds activation memory)
    graphs: bool = True  # CUDA graphs for the step chunks (ignored on the CPU)
    row_buckets: tuple[int, ...] = ROW_BUCKETS  # batch sizes a graph is captured for
    ctx_buckets: tuple[int, ...] = CTX_BUCKETS  # self-attention lengths likewise


def buffer_width(config: EngineConfig) -> int:
    """Tokens the decode buffers hold a row: the new tokens and one graph chunk past them."""
    return config.max_new_tokens + config.chunk_steps + 1


def window_config(dims, max_rows: int) -> EngineConfig:
    """The window engine's (models.batched_window): its new tokens are the forced prefix and
    the decoded ones, up to the whole text context."""
    return EngineConfig(max_rows=max_rows, max_new_tokens=dims.n_text_ctx,
                        encoder_rows=min(128, max_rows))


def bucket(n: int, buckets: tuple[int, ...]) -> int:
    for b in buckets:
        if b >= n:
            return b
    return n


class BatchedEngine:
    def __init__(self, loaded: LoadedModel, device: str = "cuda",
                 dtype: torch.dtype = torch.float16, config: EngineConfig | None = None):
        config = config or EngineConfig()
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.dtype = dtype if self.cuda else torch.float32
        self.config = config
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.special = loaded.tokenizer.special
        self.sot_sequence = loaded.tokenizer.sot_sequence("en")
        model = copy.deepcopy(loaded.model).to(self.device, self.dtype).eval()
        self.model = layer_norms_to(model, self.dtype)  # they normalise in float32
        dims = model.dims
        self.n_mels = dims.n_mels
        width = buffer_width(config)
        self.buf = DecodeBuffers(model.decoder, config.max_rows, dims.n_audio_ctx, width,
                                 dtype=self.dtype, device=self.device)
        self._rules: dict[tuple, BatchRules] = {}
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._eager_once: set[tuple] = set()
        self._pool = torch.cuda.graph_pool_handle() if self.cuda else None
        self.streams = {s: torch.cuda.Stream(self.device) for s in ("features", "encode",
                                                                     "decode")} if self.cuda else {}
        self._pinned: torch.Tensor | None = None
        self._flags = torch.zeros(2, dtype=torch.bool, pin_memory=self.cuda)
        self.n_graph_replays = 0

    # ---- streams -------------------------------------------------------------------------
    def _on(self, stage: str, after: str | None = None):
        if not self.cuda:
            return contextlib.nullcontext()
        s = self.streams[stage]
        s.wait_stream(self.streams[after] if after else torch.cuda.current_stream(self.device))
        return torch.cuda.stream(s)

    def _join(self, stage: str) -> None:
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.streams[stage])

    # ---- front end + encoder -------------------------------------------------------------
    def upload(self, audios: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy rows of audio to the device through one pinned buffer: ([B, S], lengths [B])."""
        lengths = [len(a) for a in audios]
        s = max(lengths) if lengths else 0
        host = torch.empty(len(audios), s, dtype=torch.float32, pin_memory=self.cuda)
        rows = host.numpy()  # rows copied in numpy, and only the padding zeroed
        for i, a in enumerate(audios):
            rows[i, : len(a)] = a
            rows[i, len(a) :] = 0.0
        with self._on("features"):
            dev = host.to(self.device, non_blocking=True)
            lens = torch.tensor(lengths, dtype=torch.long).to(self.device, non_blocking=True)
        return dev, lens

    @torch.inference_mode()
    def features(self, audio: torch.Tensor, lengths: torch.Tensor, n_frames: int) -> torch.Tensor:
        """Device rows [B, S] -> log-mel [B, n_mels, n_frames] (on the features stream)."""
        with self._on("features"):
            return log_mel_batch(audio, lengths, n_frames, self.n_mels)

    @torch.inference_mode()
    def encode(self, mel: torch.Tensor) -> torch.Tensor:
        """[B, n_mels, F] -> [B, F/2, D] in chunks of ``encoder_rows`` (on the encode stream)."""
        with self._on("encode", after="features"):
            if self.cuda:  # made on the features stream: not to be reused before this reads it
                mel.record_stream(self.streams["encode"])
            step = self.config.encoder_rows
            parts = [self.model.encoder(mel[i : i + step]) for i in range(0, mel.shape[0], step)]
            return torch.cat(parts) if len(parts) > 1 else parts[0]

    # ---- decoder -------------------------------------------------------------------------
    def build_prompt(self, previous: list[int] | None) -> tuple[list[int], int]:
        prompt: list[int] = []
        if previous:
            prompt = [self.special.sot_prev, *previous[-MAX_PROMPT_TOKENS:]]
        return prompt + self.sot_sequence, len(prompt)

    def _rules_for(self, options: DecodeOptions) -> BatchRules:
        key = (options.max_initial_timestamp_s, options.loop_min_repeats, options.loop_min_tokens)
        if key not in self._rules:
            self._rules[key] = BatchRules(self.special, options, self.loaded.suppress_tokens,
                                          self.model.dims.n_vocab, self.device,
                                          tuple(self.loaded.tokenizer.mark_ids))
        return self._rules[key]

    def _chunk(self, rules: BatchRules, shape: StepShape, sample: bool) -> None:
        for _ in range(self.config.chunk_steps):
            decode_step(self.model.decoder, rules, self.buf, shape, sample)

    def _replay(self, rules: BatchRules, shape: StepShape, sample: bool) -> None:
        if not (self.cuda and self.config.graphs):
            self._chunk(rules, shape, sample)
            return
        key = (shape, sample, id(rules))
        graph = self._graphs.get(key)
        if graph is None:
            if key not in self._eager_once:  # first use runs eagerly: lazy handles, autotuning
                self._eager_once.add(key)
                self._chunk(rules, shape, sample)
                return
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=self.streams["decode"]):
                self._chunk(rules, shape, sample)  # recorded, not run: replayed just below
            self._graphs[key] = graph
        graph.replay()
        self.n_graph_replays += 1

    def warm(self, shape: StepShape, options: DecodeOptions = DEFAULT_OPTIONS,
             sample: bool = False) -> None:
        """Capture the graph for ``shape`` ahead of time (on rows marked done; state is reset
        by every decode)."""
        with torch.inference_mode(), self._on("decode"):
            rules = self._rules_for(options)
            self.buf.done[: shape.n_rows] = True
            for _ in range(2):
                self._replay(rules, shape, sample)
        self._join("decode")
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def run_steps(self, rules: BatchRules, shape: StepShape, sample: bool, new_max: int) -> int:
        """Decode chunks of steps until every row is done or ``new_max`` steps are taken (the
        first came from the prefill); return the steps taken. On CUDA the host reads the done
        flag of the chunk before the one just queued, so it never waits on the step it launched,
        and it waits asleep (:func:`wait`)."""
        n_steps, k, prev_ev = 1, 0, None
        while n_steps < new_max:
            self._replay(rules, shape, sample)
            n_steps += self.config.chunk_steps
            if not self.cuda:
                if bool(self.buf.all_done):
                    break
                continue
            self._flags[k % 2].copy_(self.buf.all_done, non_blocking=True)
            ev = torch.cuda.Event(blocking=True)
            ev.record(self.streams["decode"])
            if prev_ev is not None:
                wait(prev_ev)
                if bool(self._flags[(k - 1) % 2]):
                    break
            prev_ev, k = ev, k + 1
        return n_steps

    @torch.inference_mode()
    def decode(self, audio_features: torch.Tensor, previous: list[list[int] | None],
               options: DecodeOptions = DEFAULT_OPTIONS) -> list[DecodeResult]:
        """Greedy (temperature 0) or sampled decoding of one window per row of [B, T, D]."""
        out: list[DecodeResult] = []
        cap = self.config.max_rows
        for i in range(0, audio_features.shape[0], cap):
            out += self._decode_rows(audio_features[i : i + cap], previous[i : i + cap], options)
        return out

    def _decode_rows(self, feats: torch.Tensor, previous: list[list[int] | None],
                     options: DecodeOptions) -> list[DecodeResult]:
        n, t = feats.shape[0], feats.shape[1]
        built = [self.build_prompt(p) for p in previous]
        n_ctx_model = self.model.dims.n_text_ctx
        max_new = [min(options.max_new_tokens, self.config.max_new_tokens, n_ctx_model - len(p))
                   for p, _ in built]
        p_max = max(len(p) for p, _ in built)
        rows = bucket(n, self.config.row_buckets) if self.cuda else n
        rows = min(rows, self.config.max_rows)
        ctx = min(bucket(p_max + max(max_new) + 1, self.config.ctx_buckets), n_ctx_model)
        shape = StepShape(rows, t, ctx)
        rules = self._rules_for(options)
        sample = options.temperature > 0
        host_prompts = torch.full((rows, p_max), self.special.eot, dtype=torch.long)
        plen = torch.ones(rows, dtype=torch.long)
        sot = torch.zeros(rows, dtype=torch.long)
        host_prompts[:, 0] = self.sot_sequence[0]
        for b, (p, s) in enumerate(built):
            host_prompts[b, : len(p)] = torch.tensor(p)
            plen[b], sot[b] = len(p), s
        new = torch.zeros(rows, dtype=torch.long)
        new[:n] = torch.tensor(max_new)
        buf, dev = self.buf, self.device
        with self._on("decode", after="encode"):
            cross_fill(self.model.decoder, buf, feats, 0)
            buf.plen[:rows] = plen.to(dev, non_blocking=True)
            buf.max_new[:rows] = new.to(dev, non_blocking=True)
            for name in ("n_gen", "last_tok", "prev_tok", "runs"):
                getattr(buf, name)[:rows].zero_()
            buf.last_stamp[:rows] = -1
            buf.done[:rows] = torch.arange(rows, device=dev) >= n
            buf.looped[:rows] = False
            buf.out_lp[:rows].zero_()
            buf.temperature[:rows] = options.temperature
            no_speech = prefill(self.model.decoder, buf, host_prompts.to(dev), plen.to(dev),
                                sot.to(dev), shape, self.special.no_speech)
            rules.select(buf, rows, sample)
            n_steps = self.run_steps(rules, shape, sample, max(max_new))
            host = to_host([x[:n] for x in (buf.out_tok[:, :n_steps], buf.out_lp[:, :n_steps],
                                            buf.n_gen, buf.looped, no_speech)])
        tok, lp, n_gen, looped, nsp = host
        return [self._result(tok[b, : n_gen[b]].tolist(), float(lp[b].sum()), float(nsp[b]),
                             options.temperature, bool(looped[b])) for b in range(n)]

    def _result(self, tokens: list[int], sum_lp: float, no_speech: float, temperature: float,
                looped: bool) -> DecodeResult:
        text = self.tokenizer.decode([t for t in tokens if t < self.special.timestamp_begin])
        return DecodeResult(tuple(tokens), sum_lp, sum_lp / (len(tokens) + 1), no_speech,
                            temperature, compression_ratio(text), looped)

    # ---- whole windows -------------------------------------------------------------------
    def transcribe(self, audios: list[np.ndarray], previous: list[list[int] | None] | None = None,
                   *, n_frames: int = 3000, policy: FallbackPolicy = DEFAULT_POLICY,
                   options: DecodeOptions = DEFAULT_OPTIONS) -> list[DecodeResult]:
        """Windows (≤ 30 s each) -> one DecodeResult per row, with the capped fallback."""
        previous = previous or [None] * len(audios)
        audio, lengths = self.upload(audios)
        feats = self.encode(self.features(audio, lengths, n_frames))
        return self.decode_with_fallback(feats, previous, policy, options)

    def decode_with_fallback(self, feats: torch.Tensor, previous: list[list[int] | None],
                             policy: FallbackPolicy = DEFAULT_POLICY,
                             options: DecodeOptions = DEFAULT_OPTIONS) -> list[DecodeResult]:
        results: list[DecodeResult | None] = [None] * feats.shape[0]
        todo = list(range(feats.shape[0]))
        for i, temperature in enumerate(policy.temperatures):
            prev = [previous[r] if temperature <= 0.5 else None for r in todo]
            with self._on("decode", after="encode"):  # feats come from the encode stream
                rows = feats if len(todo) == feats.shape[0] else feats.index_select(
                    0, torch.tensor(todo, device=feats.device))
            todo = policy.to_retry(todo, self.decode(rows, prev, policy.attempt(options, i)),
                                   results)
            if not todo:
                break
        return [r for r in results if r is not None]

    def text(self, result: DecodeResult) -> str:
        return self.tokenizer.decode(result.text_tokens(self.special.timestamp_begin)).strip()


def wait(event: torch.cuda.Event | None = None) -> None:
    """Block this thread until the current stream's work so far (or ``event``) is done,
    asleep: an event made with ``blocking=True`` yields the core, where a plain one, and the
    synchronous copies back, spin on it (8 recogniser processes under MPS kept 8 cores at
    100 % that way, waiting on the GPU)."""
    if event is None:
        event = torch.cuda.Event(blocking=True)
        event.record()
    event.synchronize()


def to_host(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Device tensors -> CPU tensors (pinned on CUDA), copied on the current stream and
    waited for asleep (:func:`wait`); CPU tensors are returned as they are."""
    if not tensors or tensors[0].device.type != "cuda":
        return [t.cpu() for t in tensors]
    out = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
    for host, dev in zip(out, tensors, strict=True):
        host.copy_(dev, non_blocking=True)
    wait()
    return out


def read_back(tensors: list[torch.Tensor]) -> list[np.ndarray]:
    """Tensors of one dtype on one device -> numpy arrays of their shapes, in one copy."""
    if not tensors:
        return []
    flat = to_host([torch.cat([t.reshape(-1) for t in tensors])])[0].numpy()
    out, at = [], 0
    for t in tensors:
        out.append(flat[at : at + t.numel()].reshape(tuple(t.shape)))
        at += t.numel()
    return out
