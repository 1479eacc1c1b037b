"""Streaming several channels in lock step (a fixed cadence: reproducible), for the tests of
the batched recogniser on the CPU and on CUDA."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

from subd.bench.realtime import LIBRIVOX_DIR
from subd.types import AudioChunk

CLIP_DIRS = (LIBRIVOX_DIR, Path(".benchdata/librivox"))


def clip_files() -> list[Path]:
    for d in CLIP_DIRS:
        files = sorted(d.glob("*.wav"))
        if files:
            return files
    return []


def read_wav(path: Path) -> np.ndarray:
    """16 kHz mono 16-bit WAV -> float32 (the standard library only: it runs where soundfile
    is not installed, e.g. the GPU machine)."""
    with wave.open(str(path)) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    return pcm.astype(np.float32) / 32768.0


def stream_in_steps(recognizers, audios, run_step, step_s: float = 1.0) -> list[list[str]]:
    """Feed every channel ``step_s`` of its audio, then one update each (``run_step`` gets
    the channels' ``update`` methods and returns their hypotheses), to the end; then finish.
    Returns each channel's committed words."""
    step = int(step_s * 16_000)
    longest = max(len(a) for a in audios)
    committed: list[list[str]] = [[] for _ in recognizers]
    for end in range(step, longest + step, step):
        for rec, audio in zip(recognizers, audios, strict=True):
            lo = end - step
            if lo < len(audio):
                rec.accept(AudioChunk(lo, np.asarray(audio[lo:min(end, len(audio))])))
        for i, hyp in enumerate(run_step([rec.update for rec in recognizers])):
            committed[i] += [w.text for w in hyp.committed]
    for i, hyp in enumerate(run_step([rec.finish for rec in recognizers])):
        committed[i] += [w.text for w in hyp.committed]
    return committed


def serial(calls):
    return [c() for c in calls]


def together(shared):
    """``run_step`` for a BatchingEngine: every channel's request in one batch."""

    def run_step(calls):
        out = shared.run(calls)
        failed = [v for ok, v in out if not ok]
        if failed:
            raise failed[0]
        return [v for _, v in out]

    return run_step
