"""``subd bench chaos --minutes N``: the real daemon under injected faults, and what it cost.

The daemon (``subd run``, real model, CRF tagger process, one SSE fan-out worker) runs two
channels: ``file`` loops a LibriVox clip, ``push`` takes the same kind of speech over HTTP push
at real time. Every ``--every-s`` (randomised ±30 %) one fault, in turn (``--kinds`` picks):

* ``recogniser-kill`` / ``tagger-kill``: SIGKILL the stage process;
* ``recogniser-hang``: SIGSTOP it (found hung, killed, respawned);
* ``fanout-kill``: SIGKILL the SSE fan-out worker (its clients reconnect);
* ``file-dropout``: the file channel's file vanishes for 10 s;
* ``push-pause``: the pusher stops for 1.5 watchdog intervals;
* ``disk-full``: the file channel's SRT directory (a tmpfs) is filled for 20 s;
* ``slow-clients``: 20 SSE clients that never read connect (and stay);
* ``sighup``: the latency changes by a SIGHUP reload, and back at the next one.

Reported: recovery time per kind of fault (from the fault, or the end of its condition for a
dropout, a pause or a full disk, until a word spoken after it arrives over SSE on every affected
channel; it includes D, the configured latency, and the model reload for a stage fault),
committed cues lost (each closed cue sent over SSE must be in the channel's SRT files),
deadline misses outside the recovery windows (from the daemon's events logs), RSS growth from
minute 2 to the end, daemon exits and the longest watchdog silence (systemd's ``WatchdogSec`` is
10 s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pysrt

from subd.bench.chaos_rig import (
    CLIP_A,
    CLIP_B,
    LATENCY_MS,
    WATCHDOG_S,
    Daemon,
    Notify,
    Pusher,
    Reader,
    config_text,
    idle_clients,
)
from subd.bench.netutil import free_port, get_json

KINDS = ("recogniser-kill", "tagger-kill", "push-pause", "recogniser-hang", "fanout-kill",
         "file-dropout", "disk-full", "slow-clients", "sighup")
CHANNELS = ("file", "push")
AFFECTS = {"push-pause": ("push",), "file-dropout": ("file",), "disk-full": ("file",),
           "fanout-kill": CHANNELS, "slow-clients": ("file",)}
RECOVERY_LIMIT_S = 120.0  # a fault not recovered from by then counts as not recovered


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("chaos", help="the real daemon under injected faults")
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--every-s", type=float, default=40.0, help="mean time between faults")
    p.add_argument("--seed", type=int, default=18)
    p.add_argument("--keep", help="keep the work directory here (logs, files)")
    p.add_argument("--kinds", type=kinds_arg, default=KINDS, metavar="KIND,...",
                   help="inject only these kinds of fault, in turn (default: all): "
                        + ", ".join(KINDS))
    # the daemon's default (no spare): a stage fault waits for a model load
    p.add_argument("--spare", dest="spare", action="store_true",
                   help="a loaded spare process per stage ([recognizer] spare_process = true)")
    p.add_argument("--no-spare", dest="spare", action="store_false", help=argparse.SUPPRESS)
    p.set_defaults(func=run, spare=False)


def kinds_arg(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"unknown fault kind {', '.join(unknown) or '(none given)'}; known: "
            + ", ".join(KINDS))
    return kinds


class Chaos:
    def __init__(self, work: Path, args: argparse.Namespace) -> None:
        self.work, self.args = work, args
        self.rng = random.Random(args.seed)
        shutil.copy(CLIP_A, work / "file.wav")
        self.tmpfs = self._mount_tmpfs(work / "srt-file")
        self.port = free_port()
        self.notify = Notify(work / "notify.sock")
        self.daemon = Daemon(work, self.port, self.notify.path, args.spare)
        # kind, when it began, when its condition ended (recovery counts from there), channels
        self.faults: list[tuple[str, float, float, tuple[str, ...]]] = []
        self.disk_full: list[tuple[float, float]] = []
        self.sockets: list = []
        self.latency_ms = LATENCY_MS

    @staticmethod
    def _mount_tmpfs(directory: Path) -> bool:
        directory.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(directory)],
                              capture_output=True)
        return done.returncode == 0

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            self.daemon.check()
            try:
                if all(get_json(self.port, "/healthz")["channels"][c]["last_tick"]
                       for c in CHANNELS):
                    return
            except (OSError, KeyError, ValueError):
                pass
            time.sleep(0.5)
        raise RuntimeError("the daemon did not start")

    # -- faults ---------------------------------------------------------------------------

    def inject(self, kind: str) -> None:
        now = time.monotonic()
        lasts_s = {"file-dropout": 10.0, "push-pause": 1.5 * WATCHDOG_S, "disk-full": 20.0}
        d = self.daemon
        if kind in ("recogniser-kill", "recogniser-hang", "tagger-kill"):
            pid = d.stage_pid("tag" if kind == "tagger-kill" else "recognise")
            if pid is None:
                return
            os.kill(pid, signal.SIGSTOP if kind == "recogniser-hang" else signal.SIGKILL)
        elif kind == "fanout-kill":
            for pid in d.fanout_pids():
                os.kill(pid, signal.SIGKILL)
        elif kind == "file-dropout":
            (self.work / "file.wav").rename(self.work / "file.wav.away")
            self.later.append((now + 10, lambda: (self.work / "file.wav.away").rename(
                self.work / "file.wav")))
        elif kind == "push-pause":
            self.pusher.pause(1.5 * WATCHDOG_S)
        elif kind == "disk-full":
            if not self.tmpfs:
                return
            filler = self.work / "srt-file" / "filler"
            free = shutil.disk_usage(filler.parent).free
            filler.write_bytes(b"\0" * max(free - 512, 0))
            self.disk_full.append((now, now + 20))
            self.later.append((now + 20, filler.unlink))
        elif kind == "slow-clients":
            self.sockets += idle_clients(self.port, "file", 20)
        elif kind == "sighup":
            self.latency_ms = 2600 if self.latency_ms == LATENCY_MS else LATENCY_MS
            d.config.write_text(config_text(self.work, self.port, self.latency_ms, d.spare))
            d.proc.send_signal(signal.SIGHUP)
        self.faults.append((kind, now, now + lasts_s.get(kind, 0.0),
                            AFFECTS.get(kind, CHANNELS)))

    def run(self) -> dict:
        self.pusher = Pusher(self.port, CLIP_B)
        self.readers = {c: Reader(self.port, c) for c in CHANNELS}
        self.later: list = []
        self.wait_ready()
        for r in self.readers.values():
            r.reconnects = 0  # (they tried while the model loaded)
        t0 = time.monotonic()
        end = t0 + self.args.minutes * 60
        next_fault = t0 + 60  # a minute of calm first
        rss: list[tuple[float, float]] = []
        last_rss = 0.0
        i = 0
        while time.monotonic() < end:
            now = time.monotonic()
            self.daemon.check()
            for when, action in [x for x in self.later if x[0] <= now]:
                self.later.remove((when, action))
                action()
            if now >= next_fault:
                self.inject(self.args.kinds[i % len(self.args.kinds)])
                i += 1
                next_fault = now + self.args.every_s * self.rng.uniform(0.7, 1.3)
            if now - last_rss >= 10:
                rss.append((now - t0, self.daemon.rss_mb()))
                last_rss = now
            time.sleep(0.2)
        for _, action in self.later:
            action()
        time.sleep(3)  # the last cues reach SSE
        end_at = time.monotonic()
        code = self.daemon.stop()
        for r in self.readers.values():
            r.close()
        self.pusher.close()
        return self.report(t0, end_at, rss, code)

    # -- figures --------------------------------------------------------------------------

    def recovery_s(self, at: float, channels: tuple[str, ...]) -> float:
        """Until a word spoken after the fault arrives on every channel (inf: never)."""
        worst = 0.0
        for c in channels:
            r = self.readers[c]
            # the audio captured at the fault: the last tick's audio end, plus D
            before = [t for t in r.words if t[0] <= at]
            spoken_ns = (max(s for _, s in before) if before else 0)
            after = [t for t, s in r.words if t > at and s > spoken_ns + LATENCY_MS * 10**6]
            worst = max(worst, (after[0] - at) if after else float("inf"))
        return worst

    def cues_lost(self, channel: str) -> tuple[int, int]:
        sent = self.readers[channel].cues
        in_srt: set[tuple[int, str]] = set()
        for path in (self.work / f"srt-{channel}").glob("live*.srt"):
            for s in pysrt.open(str(path), error_handling=pysrt.ERROR_RAISE):
                in_srt.add((s.start.ordinal, s.text))
        missing = [c for c in sent.values() if c not in in_srt]
        # a cue that closed while the disk was full is counted apart
        return len(missing), len(sent)

    def misses_outside(self, windows: list[tuple[float, float]]) -> tuple[int, int]:
        n_miss = n = 0
        for c in CHANNELS:
            path = self.work / f"{c}.jsonl"
            for line in path.read_text().splitlines():
                rec = json.loads(line)
                if rec.get("type") != "tick":
                    continue
                due_s = rec["due_ns"] / 1e9
                if any(a <= due_s <= b for a, b in windows):
                    continue
                n += 1
                n_miss += rec["sent_ns"] - rec["due_ns"] > 16_666_667  # half a period at 30 fps
        return n_miss, n

    def report(self, t0: float, end_at: float, rss: list[tuple[float, float]], code: int) -> dict:
        by_kind: dict[str, list[float]] = {}
        windows = []
        for kind, began, ended, channels in self.faults:
            rec = self.recovery_s(ended, channels)
            by_kind.setdefault(kind, []).append(rec)
            windows.append((began, ended + (rec if rec != float("inf") else RECOVERY_LIMIT_S)))
        lost = {c: self.cues_lost(c) for c in CHANNELS}
        misses, n_ticks = self.misses_outside(windows)
        later = [m for t, m in rss if t >= 120]
        growth = (later[-1] / later[0] - 1) * 100 if len(later) >= 2 else float("nan")
        return {"minutes": (end_at - t0) / 60, "spare": self.args.spare,
                "recovery_s": by_kind, "lost": lost,
                "misses": (misses, n_ticks), "rss": rss, "rss_growth_pct": growth,
                "exits": self.daemon.exits, "final_exit_code": code,
                "watchdog_longest_gap_s": self.notify.longest_gap_s(end_at),
                "disk_full_injected": self.tmpfs,
                "reconnects": {c: r.reconnects for c, r in self.readers.items()}}

    def close(self) -> None:
        for s in self.sockets:
            s.close()
        self.notify.close()
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.work / "srt-file")], capture_output=True)


def pct(values: list[float], q: float) -> float:
    finite = [v for v in values if v != float("inf")]
    if len(finite) < len(values):
        return float("inf")
    return float(np.percentile(values, q)) if values else float("nan")


def print_report(r: dict) -> None:
    print(f"chaos: {r['minutes']:.1f} min, 2 channels (file loop, HTTP push), D = "
          f"{LATENCY_MS} ms, watchdog {WATCHDOG_S} s, spare stage processes: "
          f"{'yes' if r['spare'] else 'no'}")
    print("recovery (fault or its end -> a word spoken after it arrives over SSE; includes D):")
    for kind, values in r["recovery_s"].items():
        print(f"  {kind:16s} n={len(values):2d}  p50 {pct(values, 50):6.1f} s  "
              f"p95 {pct(values, 95):6.1f} s  max {max(values):6.1f} s")
    for c, (missing, sent) in r["lost"].items():
        print(f"committed cues lost, {c}: {missing} of {sent} sent over SSE missing from the SRT")
    if not r["disk_full_injected"]:
        print("  (disk-full not injected: no tmpfs could be mounted here)")
    misses, n = r["misses"]
    print(f"deadline misses outside recovery windows: {misses} of {n} ticks")
    first = next((m for t, m in r["rss"] if t >= 120), float("nan"))
    print(f"RSS (daemon + children): {first:.0f} MB at minute 2, {r['rss'][-1][1]:.0f} MB at "
          f"the end: {r['rss_growth_pct']:+.2f} %")
    print(f"daemon exits: {len(r['exits'])} {r['exits'] or ''}; SIGTERM at the end: exit "
          f"{r['final_exit_code']}")
    print(f"longest watchdog silence: {r['watchdog_longest_gap_s']:.1f} s "
          f"(fires past {WATCHDOG_S} s)")
    print(f"SSE reader reconnects: {r['reconnects']}")


def run(args: argparse.Namespace) -> int:
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="subd-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    chaos = Chaos(work, args)
    try:
        result = chaos.run()
    finally:
        chaos.close()
    print_report(result)
    (work / "chaos.json").write_text(json.dumps(result, default=str, indent=1))
    print(f"(work directory: {work})")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0
