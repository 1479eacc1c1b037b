"""`subd bench transcribe`: our engine's real-time factor against faster-whisper int8.

Each engine runs in its own child process (so its peak RSS is its own) on the same clip with the
same thread count: one warm-up pass, then the median of ``--repeats`` timed passes.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox")
ENGINES = ("ours-fp32", "ours-int8", "faster-whisper-int8")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("transcribe", help="real-time factor vs faster-whisper int8")
    p.add_argument("--clip", help="audio file (default: the LibriVox test clips joined, ~25 s)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default="tiny.en")
    p.set_defaults(func=run)


def _default_clip() -> Path:
    import soundfile as sf

    wavs = sorted(LIBRIVOX.glob("*.wav"))
    if not wavs:
        from subd.errors import UserError

        raise UserError("no clip given and pocketsphinx-testdata is not installed (use --clip)")
    audio = np.concatenate([sf.read(w, dtype="float32")[0] for w in wavs])
    out = Path(tempfile.gettempdir()) / "subd_bench_librivox.wav"
    sf.write(out, audio, 16000)
    return out


def _worker(kind: str, clip: str, threads: int, repeats: int, model: str) -> dict:
    import torch

    from subd.sources.decode import load_audio

    torch.set_num_threads(threads)
    audio = load_audio(clip)
    duration_s = len(audio) / 16000
    if kind.startswith("ours"):
        from subd.models.engine import WhisperEngine
        from subd.recognise.offline import Transcriber

        engine = WhisperEngine.load(model, threads=threads, quantize=kind == "ours-int8")
        tr = Transcriber(engine)

        def once() -> str:
            return " ".join(s.text for s in tr.transcribe_blocks([audio]))
    else:
        from faster_whisper import WhisperModel

        from subd.models.loading import PACKAGED, _package_dir

        pin = PACKAGED[model].weights[0]
        path = _package_dir(pin.package, PACKAGED[model].pip_name) / Path(pin.relpath).parent
        fw = WhisperModel(str(path), device="cpu", compute_type="int8", cpu_threads=threads)

        def once() -> str:
            segs, _ = fw.transcribe(audio, beam_size=1, best_of=1, word_timestamps=True)
            return " ".join(s.text.strip() for s in segs)

    text = once()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "kind": kind,
        "seconds": seconds,
        "rtf": seconds / duration_s,
        "audio_s": duration_s,
        "rss_mb": rss_mb,
        "text": text,
    }


def run(args: argparse.Namespace) -> int:
    clip = Path(args.clip) if args.clip else _default_clip()
    results = {}
    for kind in ENGINES:
        cmd = [
            sys.executable,
            "-m",
            "subd.bench.transcribe",
            kind,
            str(clip),
            str(args.threads),
            str(args.repeats),
            args.model,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(f"{kind}: failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        results[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
    if not results:
        return 1
    audio_s = next(iter(results.values()))["audio_s"]
    print(
        f"clip: {clip} ({audio_s:.1f} s), threads={args.threads}, model={args.model}, "
        f"median of {args.repeats} after a warm-up; word timestamps on for all"
    )
    print(f"{'engine':<22}{'seconds':>9}{'RTF':>8}{'peak RSS MB':>13}")
    for kind, r in results.items():
        print(f"{kind:<22}{r['seconds']:>9.3f}{r['rtf']:>8.3f}{r['rss_mb']:>13.0f}")
    ref = results.get("faster-whisper-int8")
    if ref:
        for kind in ("ours-fp32", "ours-int8"):
            if kind in results:
                ratio = results[kind]["seconds"] / ref["seconds"]
                print(f"ratio {kind} / faster-whisper-int8 time: {ratio:.2f}x (target ≤ 1.2x)")
    for kind, r in results.items():
        print(f"  {kind}: {r['text'][:100]}")
    return 0


if __name__ == "__main__":
    kind, clip, threads, repeats, model = sys.argv[1:6]
    print(json.dumps(_worker(kind, clip, int(threads), int(repeats), model)))
