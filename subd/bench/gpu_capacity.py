"""Capacity mode of ``subd bench gpu --capacity SIZE``: the work of a model whose weights cannot
reach the machine, with RANDOM weights of its size.

Every channel runs the daemon's policy; what answers its windows (``--capacity-decisions``):

* ``transcript`` (the default, the issue's definition): the clips' transcript, the real model's
  offline reading of them made once before the trials (subd.bench.gpu_transcript). The real
  model does no work in the trials; the random model does a deployed model's whole work.
* ``model``: the real model (the bench's ``--model``, tiny.en on the GPU machine) decodes every
  window too, and its captions, word times and decisions are used. Its work is extra (a large
  model would not need it), so the capacity found is a lower bound.

Each batch of windows is run, as the same batch, through a randomly initialised model of SIZE
(large-v3-turbo: 32 encoder layers, 4 decoder layers, d = 1280, 128 mel bins, 51 866 tokens):

* the same audio, front end and encoder span per window (128 mel bins, the window's bucket);
* the same prompt and forced prefix, then decoding *teacher-forced* with the answer's tokens
  for that window (``DecodeBuffers.forced``): every step runs the whole decoder and the
  vocabulary projection and the token rules, and the row stops where the answer does, so each
  update decodes as many tokens as were written for that audio;
* the word-timing pass: one decoder pass over the text with the alignment heads' attention and
  its alignment matrix on the device; from a transcript also the token probabilities, the DTW
  and the words (WindowEngine's own pass; with ``model`` that host work is the real model's).

With ``model`` the random model's encoder is queued before the real model's work and runs
beside it (on CUDA, on its own streams); its decoding and word-timing pass follow, as they need
the real tokens. A channel's result comes back only after the random model's work for its
batch. The random model's own choices are never used. Tokens are counted in the real model's
tokenizer (the prompt's start-of-transcript sequence too: 1 token for tiny.en, 3 in a
multilingual model). A temperature fallback or retry without the prefix is replayed once, as
the final decode only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import torch

from subd.kernels.mel import WINDOW_FRAMES
from subd.kernels.mel_gpu import n_frames_for
from subd.models.batched_align import alignment_pass
from subd.models.batched_window import WindowEngine, WindowJob
from subd.models.engine import WINDOW_SAMPLES
from subd.models.loading import LoadedModel
from subd.models.whisper import Whisper, WhisperDims
from subd.service.batching import BatchedMultiplexHost

SIZES = {
    "large-v3-turbo": WhisperDims(n_mels=128, n_audio_ctx=1500, n_audio_state=1280,
                                  n_audio_head=20, n_audio_layer=32, n_vocab=51866,
                                  n_text_ctx=448, n_text_state=1280, n_text_head=20,
                                  n_text_layer=4),
    "large-v3": WhisperDims(n_mels=128, n_audio_ctx=1500, n_audio_state=1280, n_audio_head=20,
                            n_audio_layer=32, n_vocab=51866, n_text_ctx=448,
                            n_text_state=1280, n_text_head=20, n_text_layer=32),
    # the same shapes at a size the CPU tests run (128 mel bins, the v3 vocabulary)
    "test": WhisperDims(n_mels=128, n_audio_ctx=1500, n_audio_state=64, n_audio_head=2,
                        n_audio_layer=2, n_vocab=51866, n_text_ctx=448, n_text_state=64,
                        n_text_head=2, n_text_layer=2),
}
INIT_STD = 0.02  # weights ~ N(0, 0.02): activations stay finite in float16 through 32 layers


def random_model(size: str, real: LoadedModel, seed: int = 0) -> LoadedModel:
    """A Whisper of ``size`` with random weights, given ``real``'s tokenizer (its token ids are
    what gets forced; the larger vocabulary's extra logits are computed and never chosen)."""
    dims = SIZES[size]
    if dims.n_vocab < real.model.dims.n_vocab:
        raise ValueError(f"{size}: its vocabulary is smaller than the real model's")
    gen = torch.Generator().manual_seed(seed)
    model = Whisper(dims)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:  # matrices, convolutions, embeddings (the encoder's positions are
                # fixed sinusoids, a buffer)
                p.normal_(0.0, INIT_STD, generator=gen)
    n = dims.n_text_layer
    heads = tuple((layer, h) for layer in range(n // 2, n) for h in range(dims.n_text_head))
    return LoadedModel(name=f"{size} (random weights)", model=model.eval(),
                       tokenizer=real.tokenizer, alignment_heads=heads,
                       suppress_tokens=real.suppress_tokens, source="random")


class CapacityWindows:
    """What the batching engine calls (``transcribe``, ``single``, ``tokenizer``, ``warm``):
    the real engine's results, after the random model of the capacity size did the same work."""

    def __init__(self, real, big: WindowEngine) -> None:
        # real: the real model's WindowEngine, or subd.bench.gpu_transcript.TranscriptWindows
        self.real, self.big = real, big
        # answers from a transcript: the random model also does the word timings' host work
        # (DTW, the words), which the real model's words did otherwise
        self.full_timings = not isinstance(real, WindowEngine)
        self.single = real.single
        self.tokenizer = real.tokenizer
        eng = big.batched
        eng.buf.forced = torch.full_like(eng.buf.out_tok, -1)
        self.n_rows_replayed = 0
        self.n_tokens_forced = 0
        self.n_short = 0

    def summary(self) -> str:
        own = getattr(self.real, "summary", None)
        return (f"random model: {self.n_rows_replayed} windows decoded, "
                f"{self.n_tokens_forced} tokens teacher-forced, {self.n_short} rows stopped "
                f"short of their transcript" + (f"; {own()}" if own else ""))

    @property
    def batched(self):
        return self.real.batched

    def warm(self) -> None:
        self.real.warm()
        self.big.warm()

    def transcribe(self, jobs: list[WindowJob]) -> list:
        """The real engine's results, after the random model did the same work. The random
        model's encoder needs no transcript: it is queued first, on that engine's own CUDA
        streams, and runs while the real model works; its decoding and word-timing pass, which
        need the real tokens, follow. The real model's work is capacity mode's own (a large
        model's deployment would not run it), so overlapping it keeps the figures closer to
        the large model's own: that model's work is all done, in its order, before any channel
        hears back."""
        cap = self.big.batched.config.max_rows
        groups: dict[int, list[int]] = {}
        frames = []
        for i, job in enumerate(jobs):  # the real engine's encoder buckets
            n = min(n_frames_for(min(len(job.audio), WINDOW_SAMPLES)) - 1, WINDOW_FRAMES)
            frames.append(n)
            groups.setdefault(job.span.frames(n), []).append(i)
        encoded = [(enc_frames, part, self._encode([jobs[i] for i in part], enc_frames))
                   for enc_frames, idx in sorted(groups.items())
                   for part in (idx[lo : lo + cap] for lo in range(0, len(idx), cap))]
        out = self.real.transcribe(jobs)
        for _, part, feats in encoded:
            done = [k for k, i in enumerate(part) if not isinstance(out[i], BaseException)]
            if done:
                self._replay(feats if len(done) == len(part) else self._take(feats, done),
                             [(jobs[part[k]], out[part[k]], frames[part[k]]) for k in done])
        big = self.big.batched
        big._join("encode")
        big._join("decode")
        return out

    @torch.inference_mode()
    def _encode(self, jobs: list[WindowJob], enc_frames: int) -> torch.Tensor:
        eng = self.big.batched
        audio, lengths = eng.upload([job.audio[:WINDOW_SAMPLES] for job in jobs])
        return eng.encode(eng.features(audio, lengths, enc_frames))

    @torch.inference_mode()
    def _take(self, feats: torch.Tensor, rows: list[int]) -> torch.Tensor:
        eng = self.big.batched
        with eng._on("decode", after="encode"):
            return feats.index_select(0, torch.tensor(rows, device=feats.device))

    @torch.inference_mode()
    def _replay(self, feats: torch.Tensor, items: list) -> None:
        big = self.big
        sp = self.tokenizer.special
        rows, forced = [], []
        for job, res, _ in items:
            prefix = job.prefix if res.prefix_used else ()
            tokens = list(res.decode.tokens)
            rows.append(big._row(job.previous, prefix, max(1, len(tokens) - len(prefix) + 1),
                                 job.language))
            forced.append(tokens + [sp.eot])
        options = replace(items[0][0].options, temperature=0.0)
        got = big._decode(feats, rows, options, teacher=forced)
        self.n_rows_replayed += len(items)
        self.n_tokens_forced += sum(len(r.tokens) for r in got)
        # rows where the random model did not run the whole transcript (its loop guard)
        self.n_short += sum(len(r.tokens) < len(res.decode.tokens)
                            for r, (_, res, _) in zip(got, items, strict=True))
        big.batched._join("encode")  # the word-timing pass runs on the current stream
        big.batched._join("decode")
        texts = [res.decode.text_tokens(sp.timestamp_begin) for _, res, _ in items]
        if self.full_timings:  # what a deployed model does: WindowEngine's own pass
            known = [sum(1 for t in job.prefix if t < sp.timestamp_begin) if res.prefix_used
                     else 0 for job, res, _ in items]
            speech = [k for k, (_, res, _) in enumerate(items) if res.is_speech]
            big._align(feats, speech, [items[k][0] for k in speech],
                       [texts[k] for k in speech], [items[k][2] for k in speech],
                       [known[k] for k in speech])
            return
        self._align(feats, [k for k, t in enumerate(texts) if t], texts,
                    [frames for _, _, frames in items])

    def _align(self, feats: torch.Tensor, todo: list[int], texts: list[list[int]],
               frames: list[int]) -> None:
        """The word-timing pass's device work (models.batched_align.alignment_pass, no token
        probabilities); waited for, so that it is done before the channels hear back."""
        _, mats = alignment_pass(self.big, feats, todo, [None] * len(todo),
                                 [texts[k] for k in todo], [frames[k] for k in todo],
                                 [len(texts[k]) for k in todo])
        if mats:
            float(torch.stack([m.sum() for m in mats]).sum())


def capacity_windows(real: WindowEngine, size: str, device: str, dtype: torch.dtype,
                     max_rows: int) -> CapacityWindows:
    """``real`` (the batching engine's windows) paired with a random model of ``size``."""
    loaded = random_model(size, real.single.loaded)
    big = WindowEngine(loaded, device, dtype, max_rows=max_rows)
    return CapacityWindows(real, big)


def describe_size(size: str) -> str:
    d = dataclasses.asdict(SIZES[size])
    return (f"{size}: {d['n_audio_layer']} encoder layers, {d['n_text_layer']} decoder layers, "
            f"d = {d['n_audio_state']}, {d['n_mels']} mel bins, {d['n_vocab']} tokens")


class CapacityHost(BatchedMultiplexHost):
    """The batched recogniser process's host (subd.service.batching.BatchedMultiplexHost) with
    a random model of ``capacity``'s size added to its every batch: what each of the bench's
    recogniser processes runs in capacity mode."""

    def __init__(self, model: str = "tiny.en", device: str = "auto", precision: str = "auto",
                 max_rows: int = 256, threads: int = 0, share: float = 1.0,
                 capacity: str = "large-v3-turbo", decisions: str = "transcript",
                 clips: str = "", transcript: list | None = None) -> None:
        from subd.gpu.device import place, rows_on_device, torch_dtype

        super().__init__(model, device, precision, max_rows, threads, share)
        if decisions == "transcript":  # every window answered from the clips' transcript
            from pathlib import Path

            from subd.bench.gpu_sim import load_library
            from subd.bench.gpu_transcript import TranscriptWindows, library_transcript

            library, _ = load_library(Path(clips) if clips else None)
            real = self.engine.windows
            if transcript is None:  # not made by the bench (subd.bench.gpu_shards.run)
                transcript = library_transcript(real.single, library)
            self.engine.windows = TranscriptWindows(real, library, transcript)
        elif decisions != "model":
            raise ValueError(f"capacity decisions: 'transcript' or 'model', not {decisions!r}")
        placement = place(device, precision)
        dtype = torch_dtype(placement.precision if placement.cuda else "fp32")
        if placement.cuda:  # what is left of this process's share after the real model
            with torch.device("meta"):
                shape = Whisper(SIZES[capacity])
            max_rows = rows_on_device(shape, dtype, placement.device, share, max_rows, capacity)
        self.engine.windows = capacity_windows(self.engine.windows, capacity, placement.device,
                                               dtype, max_rows if placement.cuda else 16)
        if placement.cuda:  # compile and capture now, not in the first trial
            self.engine.windows.big.warm()
