"""``subd bench livefile``: the cost of writing one cue to a live SRT file, early and late.

Each committed cue is one append and one fdatasync (subd.sinks.files), so the cost per cue must
not grow with the file. The bench writes cues through the sink's own writer: around cue 10 and
around cue N (default 100 000) it times each cue with fdatasync, as the daemon does; the cues in
between are written the same way but without fdatasync (``--fill-fsync`` to sync them too), which
changes how long the run takes, not the file. For contrast it also times one rewrite of the
whole file at cue N, which is what writing a cue used to cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from subd.sinks.files import FileSinkConfig, SRTSink
from subd.types import Cue

NS_PER_MS = 1_000_000
WINDOW = 200  # cues timed around each mark


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("livefile", help="live SRT write time per cue at cue 10 and N")
    p.add_argument("--cues", type=int, default=100_000, help="the late mark N")
    p.add_argument("--dir", help="where to write (default: a temporary directory)")
    p.add_argument("--fill-fsync", action="store_true",
                   help="fdatasync every cue between the marks too (slow)")
    p.set_defaults(func=run)


def cue(i: int) -> Cue:
    start_ns = i * 2_000 * NS_PER_MS
    return Cue(i, start_ns, start_ns + 1_800 * NS_PER_MS,
               (f"cue number {i} of a long running", "live caption stream."), committed=True)


def timed(sink: SRTSink, first: int, n: int) -> list[float]:
    out = []
    for i in range(first, first + n):
        t0 = time.perf_counter_ns()
        sink._append(cue(i))  # the writer thread's own step: one write, one fdatasync
        out.append((time.perf_counter_ns() - t0) / 1e6)
    return out


def summary(ms: list[float]) -> str:
    ms = sorted(ms)
    return (f"median {statistics.median(ms):.3f} ms, p95 {ms[int(0.95 * (len(ms) - 1))]:.3f} ms, "
            f"max {ms[-1]:.3f} ms")


def bench(directory: Path, n_cues: int, fill_fsync: bool) -> dict[str, list[float]]:
    synced = SRTSink(FileSinkConfig(directory=str(directory), rotate_bytes=0, rotate_s=0))
    filler = SRTSink(FileSinkConfig(directory=str(directory), rotate_bytes=0, rotate_s=0,
                                    fsync=fill_fsync))
    early_first = 1
    early = timed(synced, early_first, WINDOW)
    late_first = max(1 + WINDOW, n_cues - WINDOW // 2)
    # the filler appends to the same file (its own descriptor, O_APPEND) up to the late mark
    filler._open_file()
    filler._file_n = synced._file_n
    for i in range(early_first + WINDOW, late_first):
        filler._append(cue(i))
    filler._close_file()
    synced._file_n = late_first - 1
    synced._file_bytes = os.path.getsize(synced.path)
    late = timed(synced, late_first, WINDOW)
    data = synced.path.read_bytes()
    rewrite = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        with open(directory / "rewrite.srt", "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        rewrite.append((time.perf_counter_ns() - t0) / 1e6)
    synced._close_file()
    return {"early": early, "late": late, "rewrite": rewrite, "bytes": [len(data)]}


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="subd-livefile-", dir=args.dir) as tmp:
        t0 = time.monotonic()
        r = bench(Path(tmp), args.cues, args.fill_fsync)
        took_s = time.monotonic() - t0
    early, late = statistics.median(r["early"]), statistics.median(r["late"])
    print(f"live SRT, one append + fdatasync per cue ({WINDOW} cues timed at each mark; "
          f"file {r['bytes'][0] / 1e6:.1f} MB at the end; run {took_s:.0f} s)")
    late_first = max(1 + WINDOW, args.cues - WINDOW // 2)
    print(f"  cues 1-{WINDOW} (cue 10):   {summary(r['early'])}")
    print(f"  cues {late_first:,d}-{late_first + WINDOW - 1:,d} (cue {args.cues:,d}): "
          f"{summary(r['late'])}")
    print(f"  late/early median: {late / early:.2f}x")
    print(f"  (one whole-file rewrite + fsync at cue {args.cues:,d}, the old cost per cue: "
          f"median {statistics.median(r['rewrite']):.1f} ms)")
    return 0
