"""Checks ``subd bench gpu`` prints before timing: the GPU front end and the batched engine
against the CPU engine on the real clips, and the graph warm-up before the clock starts."""

from __future__ import annotations

import numpy as np
import torch

from subd.kernels.mel import log_mel, pad_or_trim_frames
from subd.kernels.mel_gpu import log_mel_batch
from subd.models.batched import BatchedEngine, EngineConfig, bucket
from subd.models.batched_decode import StepShape


def front_end_and_transcript_checks(loaded, engine: BatchedEngine, clips: list[np.ndarray],
                                    n_frames: int = 3000) -> list[str]:
    from subd.models.engine import WhisperEngine

    lines = []
    audio, lengths = engine.upload(clips)
    with torch.inference_mode():
        mel = log_mel_batch(audio, lengths, 3000, engine.n_mels).cpu()
    err = max(float((mel[i] - pad_or_trim_frames(log_mel(c))).abs().max())
              for i, c in enumerate(clips))
    lines.append(f"front end: max |GPU - CPU| log-mel = {err:.2e} over {len(clips)} clips")
    cpu = WhisperEngine(loaded, threads=None)
    ts = cpu.tokenizer.special.timestamp_begin
    ref = [cpu.decode_with_fallback(cpu.encode(cpu.features(c)), None) for c in clips]
    exact = BatchedEngine(loaded, device=str(engine.device), dtype=torch.float32,
                          config=EngineConfig(max_rows=8))
    for name, eng in (("fp32", exact), ("fp16", engine)):
        got = eng.transcribe(clips)
        same = sum(a.text_tokens(ts) == b.text_tokens(ts) for a, b in zip(ref, got, strict=True))
        lines.append(f"batched {name} engine: {same}/{len(clips)} greedy transcripts identical "
                     f"to the CPU engine")
    if n_frames < 3000:  # the trimmed encoder input the bench serves with
        got = engine.transcribe(clips, n_frames=n_frames)
        same = sum(a.text_tokens(ts) == b.text_tokens(ts) for a, b in zip(ref, got, strict=True))
        lines.append(f"batched fp16 engine, windows trimmed to {n_frames} frames: {same}/"
                     f"{len(clips)} transcripts identical to the CPU engine's full 30 s window")
        for a, b in zip(ref, got, strict=True):
            if a.text_tokens(ts) != b.text_tokens(ts):
                lines.append(f"  full: {engine.tokenizer.decode(a.text_tokens(ts)).strip()!r}")
                lines.append(f"  trim: {engine.text(b)!r}")
    del exact
    return lines


def warm_engine(engine: BatchedEngine, n_frames: int, prompt_tokens: int = 0,
                window_samples: int | None = None) -> None:
    """Capture every graph the bench can need (each row bucket, each context bucket a row can
    reach, greedy and sampled), so no capture happens while streams are live."""
    cfg = engine.config
    t = n_frames // 2
    sizes = sorted({min(bucket(n, cfg.row_buckets), cfg.max_rows)
                    for n in range(1, cfg.max_rows + 1)}) if engine.cuda else []
    prompt = len(engine.sot_sequence) + (prompt_tokens + 1 if prompt_tokens else 0)
    reach = bucket(prompt + cfg.max_new_tokens + 1, cfg.ctx_buckets)
    for rows in sizes:
        for ctx in (c for c in cfg.ctx_buckets if c <= reach):
            engine.warm(StepShape(rows, t, ctx))
            engine.warm(StepShape(rows, t, ctx), sample=True)
    # the front end and encoder at every batch bucket (cuFFT and cuDNN plans are per shape)
    samples = window_samples or n_frames * 160  # the width of the windows the server cuts
    for rows in sizes or [1]:
        audio = torch.zeros(rows, samples, device=engine.device)
        lengths = torch.full((rows,), samples, dtype=torch.long, device=engine.device)
        engine.encode(engine.features(audio, lengths, n_frames))
    if engine.cuda:
        torch.cuda.synchronize()
