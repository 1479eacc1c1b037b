"""Live windows of many streams at once: ``WhisperEngine.transcribe_window``, batched.

The streaming policy (subd/recognise/streaming.py) decides per stream what to decode: the
window, the previous-text prompt, the committed prefix to force, the token budget, the encoder
span, the language. :class:`WindowEngine` runs them for many streams together and hands each
stream the :class:`~subd.models.engine.WindowResult` the single-stream engine would:

* front end and encoder batched over the windows that share an encoder span (the span depends
  on the window's length; windows of one span bucket share one encoder call);
* decoding batched on the static-cache engine (``models.batched``), with the committed prefix
  forced per row: the prefix goes through the prompt pass with the prompt and counts as
  already generated (the timestamp rules see it, the loop guard does not, as in ``decode_window``);
  on CUDA the step chunks replay captured graphs and the host reads one "all done" flag per
  chunk, one chunk late;
* the temperature fallback and the retry without the prefix re-decode only the rows concerned;
* word timings from the alignment heads: one decoder pass for a chunk of rows, the attention
  matrices on the device, one DTW sweep for all rows (models.dtw; on CUDA on the device), then the
  single-stream code's word grouping (script-aware), duration and segment-end rules.

Greedy results equal the single-stream engine's row by row in float32 (tests/test_batched_
policy.py); in float16 on CUDA a near-tie can flip a token (documented in the bench output)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from subd.kernels.mel import WINDOW_FRAMES
from subd.kernels.mel_gpu import n_frames_for
from subd.models.alignment import within_segments
from subd.models.batched import BatchedEngine, bucket, to_host, window_config
from subd.models.batched_align import align_rows
from subd.models.batched_decode import StepShape, cross_fill, prefill
from subd.models.decoding import (
    DecodeOptions,
    DecodeResult,
    compression_ratio,
    periodic_tail_start,
    steps_recorded,
)
from subd.models.engine import (
    FULL_SPAN,
    MAX_PROMPT_TOKENS,
    WINDOW_SAMPLES,
    EncoderSpan,
    FallbackPolicy,
    WhisperEngine,
    WindowResult,
)
from subd.models.loading import LoadedModel


@dataclass(frozen=True, slots=True)
class WindowJob:
    """One stream's decode, as the policy asks ``transcribe_window`` for it."""

    audio: np.ndarray
    previous: list[int] | None
    policy: FallbackPolicy
    options: DecodeOptions
    prefix: tuple[int, ...] = ()
    retry_without_prefix: Callable[[], bool] | None = None
    span: EncoderSpan = FULL_SPAN
    language: str | None = None


@dataclass(frozen=True, slots=True)
class _Row:
    prompt: list[int]  # previous text + start of transcript
    sot_index: int
    prefix: tuple[int, ...]
    max_new: int  # tokens to decode after the prefix
    cont: bool = False  # its first token continues the prefix (DecodeOptions.continue_prefix)


class WindowEngine:
    """Batched ``transcribe_window`` over one model on one device."""

    def __init__(self, loaded: LoadedModel, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, *, max_rows: int = 64,
                 quantize: bool = False, language: str = "en"):
        # the token buffers hold the prefix and the new tokens: up to the whole text context
        config = window_config(loaded.model.dims, max_rows)
        self.batched = BatchedEngine(loaded, device=device, dtype=dtype, config=config)
        if quantize:  # CPU int8, as the single-stream live engine runs
            from subd.models.engine import quantize_linears

            self.batched.model = quantize_linears(self.batched.model)
        # the single-stream engine over the same weights: word timings and language detection
        self.single = WhisperEngine(dataclasses.replace(loaded, model=self.batched.model),
                                    language=language)
        self.tokenizer = loaded.tokenizer
        self.n_rows_decoded = 0
        self.n_decode_calls = 0

    def warm(self, seconds: tuple[float, ...] = (1.0, 6.0), rows: tuple[int, ...] = (1, 4)
             ) -> None:
        """Run a few windows of noise before any channel is live: on CUDA the first use of a
        shape compiles the fused selection kernel (Triton: 17 s on the H200, measured), plans
        the FFT and convolutions and captures step graphs; a daemon that left that to its first
        channels showed their first words ~10 s late."""
        rng = np.random.default_rng(0)
        sp = self.tokenizer.special
        prefix = (sp.timestamp_begin, *self.tokenizer.encode(" and then"))
        prompt = self.tokenizer.encode(" Earlier words.")
        for n in rows:
            for s in seconds:
                audio = [rng.standard_normal(int(s * 16_000)).astype(np.float32) * 0.05
                         for _ in range(n)]
                jobs = [WindowJob(a, prompt if i % 2 else None, FallbackPolicy((0.0,)),
                                  replace(DecodeOptions(), max_new_tokens=32),
                                  prefix if i % 2 else (), None, EncoderSpan(2000, 4000))
                        for i, a in enumerate(audio)]
                self.transcribe(jobs)
                self.transcribe(jobs)  # a shape's second use is the one captured

    # ---- the policy's entry point ------------------------------------------------------------
    def transcribe(self, jobs: list[WindowJob]) -> list[WindowResult | BaseException]:
        """One result per job, in order; a job whose own callback failed gets its exception."""
        out: list[WindowResult | BaseException | None] = [None] * len(jobs)
        groups: dict[int, list[int]] = {}
        frames = []
        for i, job in enumerate(jobs):
            n = min(len(job.audio), WINDOW_SAMPLES)
            frames.append(min(n_frames_for(n) - 1, WINDOW_FRAMES))
            groups.setdefault(job.span.frames(frames[-1]), []).append(i)
        cap = self.batched.config.max_rows
        for enc_frames, idx in sorted(groups.items()):
            for lo in range(0, len(idx), cap):
                part = idx[lo : lo + cap]
                got = self._windows([jobs[i] for i in part], [frames[i] for i in part],
                                    enc_frames)
                for i, r in zip(part, got, strict=True):
                    out[i] = r
        return out  # type: ignore[return-value]

    def _windows(self, jobs: list[WindowJob], frames: list[int], enc_frames: int
                 ) -> list[WindowResult | BaseException]:
        eng = self.batched
        audio, lengths = eng.upload([j.audio[:WINDOW_SAMPLES] for j in jobs])
        feats = eng.encode(eng.features(audio, lengths, enc_frames))
        results = self._with_fallback(feats, jobs, [j.prefix for j in jobs])
        used = [bool(j.prefix) for j in jobs]
        ts = self.tokenizer.special.timestamp_begin
        errors: dict[int, BaseException] = {}
        redo = []
        for b, (job, res) in enumerate(zip(jobs, results, strict=True)):
            n_prefix = sum(1 for t in job.prefix if t < ts)
            if job.prefix and job.retry_without_prefix is not None \
                    and len(res.text_tokens(ts)) <= n_prefix:
                try:
                    if job.retry_without_prefix():
                        redo.append(b)
                except Exception as exc:  # noqa: BLE001 - that stream's failure, not the batch's
                    errors[b] = exc
        if redo:
            sub = self.take_rows(feats, redo)
            again = self._with_fallback(sub, [jobs[b] for b in redo], [()] * len(redo))
            for b, res in zip(redo, again, strict=True):
                results[b], used[b] = res, False
        eng._join("encode")
        eng._join("decode")
        speech = [b for b, (job, res) in enumerate(zip(jobs, results, strict=True))
                  if b not in errors and not job.policy.silent(res)]
        words = self._align(feats, speech, [jobs[b] for b in speech],
                            [results[b].text_tokens(ts) for b in speech],
                            [frames[b] for b in speech],
                            [sum(1 for t in jobs[b].prefix if t < ts) if used[b] else 0
                             for b in speech],
                            [results[b].marks_after_text(ts) for b in speech])
        out: list[WindowResult | BaseException] = []
        for b, res in enumerate(results):
            if b in errors:
                out.append(errors[b])
            elif b in words:
                out.append(WindowResult(res, tuple(within_segments(words[b], res.tokens, ts)),
                                        True, used[b]))
            else:
                out.append(WindowResult(res, (), False, used[b]))
        return out

    # ---- word timings ----------------------------------------------------------------------
    def _align(self, feats: torch.Tensor, rows: list[int], jobs: list[WindowJob],
               texts: list[list[int]], frames: list[int], known: list[int],
               marks_after: list[list] | None = None) -> dict[int, list]:
        return align_rows(self, feats, rows, jobs, texts, frames, known, marks_after)

    def sot(self, language: str | None) -> list[int]:
        """The start-of-transcript tokens of a row in ``language`` (None: the engine's own)."""
        if language is not None and self.tokenizer.multilingual:
            return self.tokenizer.sot_sequence(language)
        return list(self.single.sot_sequence)

    def take_rows(self, feats: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """Rows ``rows`` of encoder output ``feats``, taken on the decode stream."""
        eng = self.batched
        with eng._on("decode", after="encode"):  # feats come from the encode stream
            return feats.index_select(0, torch.tensor(rows, device=feats.device))

    # ---- decoding --------------------------------------------------------------------------
    def _with_fallback(self, feats: torch.Tensor, jobs: list[WindowJob],
                       prefixes: list[tuple[int, ...]]) -> list[DecodeResult]:
        """Each job decoded under its own fallback policy: jobs whose policy and shared
        options (temperature, suppression rules, loop limits) agree decode as one batch, each
        row with its own token budget and prefix. A stalled channel's fallback, or another
        language's, must not change its neighbours' greedy readings (the CPU path's)."""
        results: list[DecodeResult | None] = [None] * len(jobs)
        groups: dict[tuple, list[int]] = {}
        for r, job in enumerate(jobs):
            shared = replace(job.options, max_new_tokens=0, continue_prefix=False)
            groups.setdefault((job.policy, shared), []).append(r)
        for (policy, _), idx in groups.items():
            sub = feats if len(idx) == len(jobs) else self.take_rows(feats, idx)
            got = self._fallback_group(sub, [jobs[r] for r in idx], [prefixes[r] for r in idx],
                                       policy)
            for r, res in zip(idx, got, strict=True):
                results[r] = res
        return results  # type: ignore[return-value]

    def _fallback_group(self, feats: torch.Tensor, jobs: list[WindowJob],
                        prefixes: list[tuple[int, ...]], policy: FallbackPolicy
                        ) -> list[DecodeResult]:
        results: list[DecodeResult | None] = [None] * len(jobs)
        todo = list(range(len(jobs)))
        for i, temperature in enumerate(policy.temperatures):
            rows, opts = [], []
            for r in todo:
                o = policy.attempt(jobs[r].options, i)
                opts.append(o)
                previous = jobs[r].previous if temperature <= 0.5 else None
                rows.append(self._row(previous, prefixes[r], o.max_new_tokens,
                                      jobs[r].language, o.continue_prefix))
            sub = feats if len(todo) == len(jobs) else self.take_rows(feats, todo)
            # opts[0]: every row's temperature and rules are the group's (per-row budget and
            # prefix continuation travel in ``rows``)
            todo = policy.to_retry(todo, self._decode(sub, rows, opts[0]), results)
            if not todo:
                break
        return results  # type: ignore[return-value]

    def _row(self, previous: list[int] | None, prefix: tuple[int, ...], max_new: int,
             language: str | None, cont: bool = False) -> _Row:
        sp = self.tokenizer.special
        before = [sp.sot_prev, *previous[-MAX_PROMPT_TOKENS:]] if previous else []
        prompt = before + self.sot(language)
        n_ctx = self.batched.model.dims.n_text_ctx
        return _Row(prompt, len(before), prefix,
                    max(0, min(max_new, n_ctx - len(prompt) - len(prefix))), cont)

    @torch.inference_mode()
    def _decode(self, feats: torch.Tensor, rows: list[_Row], options: DecodeOptions,
                teacher: list[list[int]] | None = None) -> list[DecodeResult]:
        """``teacher``: each row's transcript (prefix included, then end-of-text) forced into
        ``buf.forced`` whatever the weights say (subd bench gpu --capacity)."""
        eng, sp = self.batched, self.tokenizer.special
        buf, dev, cfg = eng.buf, eng.device, eng.config
        n, t = feats.shape[0], feats.shape[1]
        full = [r.prompt + list(r.prefix) for r in rows]
        p_max = max(len(f) for f in full)
        m_max = max(1, max(len(r.prefix) for r in rows))
        new_max = max(r.max_new for r in rows)
        n_rows = min(bucket(n, cfg.row_buckets) if eng.cuda else n, cfg.max_rows)
        ctx = min(bucket(p_max + new_max + 1, cfg.ctx_buckets), eng.model.dims.n_text_ctx)
        shape = StepShape(n_rows, t, ctx)
        rules = eng._rules_for(options)
        sample = options.temperature > 0
        prompts = torch.full((n_rows, p_max), sp.eot, dtype=torch.long)
        prompts[:, 0] = rows[0].prompt[0]
        plen = torch.ones(n_rows, dtype=torch.long)
        sot = torch.zeros(n_rows, dtype=torch.long)
        forced = torch.zeros(n_rows, dtype=torch.long)
        max_new = torch.zeros(n_rows, dtype=torch.long)
        head = torch.zeros(n_rows, m_max, dtype=torch.long)
        last = torch.zeros(n_rows, dtype=torch.long)
        prev = torch.zeros(n_rows, dtype=torch.long)
        stamp = torch.full((n_rows,), -1, dtype=torch.long)
        for b, (r, f) in enumerate(zip(rows, full, strict=True)):
            prompts[b, : len(f)] = torch.tensor(f)
            plen[b], sot[b], m = len(f), r.sot_index, len(r.prefix)
            forced[b], max_new[b] = m, m + r.max_new
            if m:  # the prefix counts as generated: the rules continue after it
                head[b, :m] = torch.tensor(r.prefix)
                last[b] = r.prefix[-1]
                prev[b] = r.prefix[-2] if m >= 2 else 0
                stamps = [x for x in r.prefix if x >= sp.timestamp_begin]
                stamp[b] = stamps[-1] if stamps else -1
        with eng._on("decode", after="encode"):
            cross_fill(eng.model.decoder, buf, feats, 0)
            for name in ("runs", "out_lp"):
                getattr(buf, name)[:n_rows].zero_()
            buf.out_tok[:n_rows, :m_max] = head.to(dev, non_blocking=True)
            buf.n_gen[:n_rows] = forced.to(dev, non_blocking=True)
            buf.n_forced[:n_rows] = buf.n_gen[:n_rows]
            buf.cont[:n_rows] = torch.tensor([r.cont for r in rows]
                                             + [False] * (n_rows - n)).to(dev, non_blocking=True)
            buf.max_new[:n_rows] = max_new.to(dev, non_blocking=True)
            buf.last_tok[:n_rows] = last.to(dev, non_blocking=True)
            buf.prev_tok[:n_rows] = prev.to(dev, non_blocking=True)
            buf.last_stamp[:n_rows] = stamp.to(dev, non_blocking=True)
            buf.done[:n_rows] = torch.arange(n_rows, device=dev) >= n
            buf.looped[:n_rows] = False
            buf.temperature[:n_rows] = options.temperature
            if buf.forced is not None:  # -1: the model chooses
                want = torch.full((n_rows, buf.forced.shape[1]), -1, dtype=torch.long)
                for b, seq in enumerate(teacher or ()):
                    want[b, : len(seq)] = torch.tensor(seq[: buf.forced.shape[1]])
                buf.forced[:n_rows] = want.to(dev, non_blocking=True)
            plen_dev = plen.to(dev)
            no_speech = prefill(eng.model.decoder, buf, prompts.to(dev), plen_dev,
                                sot.to(dev), shape, sp.no_speech)
            # steps place token j of the transcript at position plen + j: the prefix is part
            # of the transcript, not of the prompt
            buf.plen[:n_rows] = plen_dev - buf.n_forced[:n_rows]
            rules.select(buf, n_rows, sample)
            eng.run_steps(rules, shape, sample, new_max)
            width = min(buf.out_tok.shape[1], int(max_new.max()) + 1)
            host = to_host([x[:n] for x in (buf.out_tok[:, :width], buf.out_lp[:, :width],
                                            buf.n_gen, buf.looped, no_speech,
                                            buf.out_mark[:, :width])])
            buf.n_forced[:n_rows].zero_()  # the engine's other decoders force nothing
        tok, lp, n_gen, looped, nsp, marks = host
        self.n_decode_calls += 1
        self.n_rows_decoded += n
        return [self._result(r, tok[b, : n_gen[b]].tolist(), float(lp[b].sum()), float(nsp[b]),
                             options.temperature, bool(looped[b]), marks[b])
                for b, r in enumerate(rows)]

    def _result(self, row: _Row, tokens: list[int], sum_lp: float, no_speech: float,
                temperature: float, looped: bool, marks: torch.Tensor) -> DecodeResult:
        """``marks`` [width, 2]: the row's (p('.'), p(',')) by column (BatchRules.select)."""
        ts = self.tokenizer.special.timestamp_begin
        m = len(row.prefix)
        n_new = len(tokens) - m
        capped = not looped and row.max_new > 0 and n_new >= row.max_new
        if capped:  # out of budget: cut a repeating tail, as decode_window does
            keep = periodic_tail_start([min(x, ts) for x in tokens[m:]])
            if keep is not None:
                tokens, looped = tokens[: m + keep], True
        text = self.tokenizer.decode([x for x in tokens if x < ts])
        steps = marks[m : m + steps_recorded(len(tokens) - m, capped, looped)].tolist()
        return DecodeResult(tuple(tokens), sum_lp, sum_lp / (n_new + 1), no_speech, temperature,
                            compression_ratio(text), looped, capped,
                            tuple((a, b) for a, b in steps), m)
