"""``subd bench daemon``: several channels in one ``subd run``, as a user runs them, with each
``[recognizer] cpu_processes`` setting asked for, in the same run.

Each channel is a file source played once in real time: the project's dev and held-out clips
(``subd bench quality``'s sets) joined with 0.25 s gaps, each channel starting at another clip,
so the channels speak at once but not in step. The daemon is ``subd run`` itself, with its
default pipeline (the CRF tagger in its own process) and the SSE sink; its events logs and
``/metrics`` give the figures. Settings alternate within each of ``--runs`` rounds, so a
baseline (``1``: one serial recogniser process for every channel) and the system under test
meet the same machine load.

Per channel: words shown (the publication time of the tick that first carries a word as
committed, minus the word's end; p50, p95, max, and the share within D + 0.3 s), recogniser
updates, and the WER of its committed words against its clips' transcripts. Per run: deadline
misses, fallbacks and degraded ticks (``/metrics``), the publish-time error p99 (the events
logs' ``sent_ns - due_ns``), and the CPU each process of the daemon took while the audio
played (a share of one core).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from subd.bench.fanout import percentile
from subd.bench.netutil import free_port, get_json, wait_until

NS_PER_S = 1_000_000_000
RATE = 16_000
GAP = RATE // 4
START_LIMIT_S = 300.0
SHOWN_SLACK_S = 0.3  # issue 17: every channel's words within D + 0.3 s at p95
COUNTERS = ("deadline_misses", "fallbacks", "degraded_ticks")  # as the log line orders them


def channel_audio(n_channels: int, seconds: float) -> list[tuple[Any, list[str]]]:
    """(audio, reference words) per channel: the dev and held-out clips in turn, channel i
    starting at clip i * len / n, at least ``seconds`` long (whole clips)."""
    import numpy as np

    from subd.bench.quality_sets import SETS, build_set

    clips = [c for name in ("dev", "heldout") for c in build_set(name, SETS[name]).clips]
    gap = np.zeros(GAP, np.float32)
    out = []
    for i in range(n_channels):
        first = i * len(clips) // n_channels
        order, n = [], 0
        for j in range(len(clips)):
            clip = clips[(first + j) % len(clips)]
            order.append(clip)
            n += len(clip.audio) + GAP
            if n >= seconds * RATE:
                break
        audio = np.concatenate([x for c in order for x in (c.audio, gap)])
        out.append((audio, [w for c in order for w in c.words]))
    return out


def _config(port: int, latency_ms: int, processes: str, wavs: list[Path], logs: list[Path],
            model: str, device: str = "auto", update_ms: int | None = None,
            precision: str = "auto", update_cost_ms: int | None = None) -> str:
    value = f'"{processes}"' if processes == "auto" else processes
    cadence = ("" if update_ms is None else
               f"min_update_ms = {update_ms}\ngpu_update_ms = {update_ms}\n")
    if update_cost_ms is not None:
        cadence += f"update_cost_ms = {update_cost_ms}\n"
    channels = "".join(f"""
[channels.c{i}.source]
kind = "file"
path = "{wav}"
loop = false
[channels.c{i}.events]
path = "{log}"
""" for i, (wav, log) in enumerate(zip(wavs, logs, strict=True)))
    return f"""
[recognizer]
model = "{model}"
device = "{device}"
precision = "{precision}"
cpu_processes = {value}
{cadence}[tick]
latency_ms = {latency_ms}
[server]
port = {port}
[sinks]
enabled = ["sse"]
{channels}"""


def _cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) a process has taken; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _updates(metrics: str) -> dict[str, int]:
    """Recognition updates per channel, from ``/metrics``."""
    return {ch: int(float(n)) for ch, n in re.findall(
        r'^subd_stage_duration_seconds_count\{channel="([^"]*)",stage="recognise"\} (\S+)$',
        metrics, re.M)}


def _published(log: str) -> dict[str, dict[str, int]]:
    """Each channel's closing counts, from the daemon's log ("channel c0: published ...")."""
    return {m[0]: dict(zip(("ticks", *COUNTERS), map(int, m[1:]), strict=True))
            for m in re.findall(r"channel (\S+): published (\d+) ticks: (\d+) deadline misses, "
                                r"(\d+) fallbacks, \d+ stale slots, (\d+) degraded", log)}


def _run_once(tmp: Path, args: argparse.Namespace, device: str, processes: str,
              audio: list[tuple[Any, list[str]]], wavs: list[Path]) -> dict[str, Any]:
    from subd.errors import UserError
    from subd.scoring.wer import normalise, wer
    from subd.sinks.events_log import read_events

    tag = f"p{processes}-{len(list(tmp.glob('p*.toml')))}"
    logs = [tmp / f"{tag}-c{i}.jsonl" for i in range(len(wavs))]
    port = free_port()
    config = tmp / f"{tag}.toml"
    config.write_text(_config(port, args.latency_ms, processes, wavs, logs, args.model,
                              device, args.update_ms, args.precision, args.update_cost_ms))
    log = tmp / f"{tag}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "subd.cli", "run", "--config",
                                 str(config)], stdout=out, stderr=subprocess.STDOUT)
    try:
        def ready() -> dict | None:
            if proc.poll() is not None:
                raise UserError(f"bench daemon: subd run exited {proc.returncode} (see {log})")
            health = get_json(port, "/healthz")
            return health["stages"] if health.get("status") == "ok" else None

        stages = wait_until(ready, START_LIMIT_S, f"subd run to serve ({log})")
        pids = {"daemon": proc.pid, **{name: s["pid"] for name, s in stages.items()
                                       if s.get("pid")}}
        cpu0, t0 = {name: _cpu_s(pid) for name, pid in pids.items()}, time.monotonic()
        seen: dict[str, Any] = {"at": 0.0}

        def finished() -> bool:
            """The daemon exits once its last channel has played out: until then, /metrics
            and the processes' CPU are read as it goes."""
            if proc.poll() is not None:
                return True
            now = time.monotonic()
            if now - seen["at"] >= 2:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    seen["updates"] = _updates(r.read().decode())
                cpu = {name: _cpu_s(pid) for name, pid in pids.items()}
                if None not in cpu.values():  # not while the daemon is stopping
                    seen["cpu"] = {name: (cpu[name] - cpu0[name]) / (now - t0) for name in cpu}
                seen["at"] = now
            return False

        longest = max(len(a) for a, _ in audio) / RATE
        wait_until(finished, longest + 120, f"every channel to finish ({log})")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    counts = _published(log.read_text(errors="replace"))
    if proc.returncode != 0 or len(counts) < len(wavs):
        raise UserError(f"bench daemon: subd run exited {proc.returncode} with "
                        f"{len(counts)} of {len(wavs)} channels played out (see {log})")
    limit = args.latency_ms / 1000 + SHOWN_SLACK_S
    channels, errors_ms = [], []
    for i, (path, (_, ref)) in enumerate(zip(logs, audio, strict=True)):
        start, ticks = read_events(path)
        shown = [(t["due_ns"] - start["t0_ns"]) / NS_PER_S - w["end_ms"] / 1000
                 for t in ticks for w in t["committed"]]
        words = [w["w"] for t in ticks for w in t["committed"]]
        errors_ms += [abs(t["sent_ns"] - t["due_ns"]) / 1e6 for t in ticks]
        name = f"c{i}"
        channels.append(dict(
            name=name, words=len(shown), p50=percentile(shown, 0.5) if shown else float("nan"),
            p95=percentile(shown, 0.95) if shown else float("nan"),
            max=max(shown, default=float("nan")),
            within=sum(s <= limit for s in shown) / max(1, len(shown)),
            updates=seen.get("updates", {}).get(name, 0), text=normalise(" ".join(words)),
            exact=[(w["w"], w["start_ms"], w["end_ms"]) for t in ticks for w in t["committed"]],
            wer=wer(ref, normalise(" ".join(words)))))
    totals = {k: sum(c[k] for c in counts.values()) for k in COUNTERS}
    return dict(device=device, processes=processes, channels=channels, totals=totals,
                cpu=seen.get("cpu", {}),
                publish_p99_ms=percentile(errors_ms, 0.99) if errors_ms else float("nan"),
                recognisers=sum(name.startswith("recognise") for name in pids))


def _settings(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(device, cpu_processes) per setting, the baseline first; on CUDA the processes setting
    does not apply, so a CUDA device is run once, with the first."""
    from subd.errors import UserError

    devices = [d.strip() for d in args.device.split(",") if d.strip()]
    procs = [s.strip() for s in args.processes.split(",") if s.strip()]
    if not 1 <= args.channels <= 16 or args.runs < 1 or args.seconds <= 0 or not procs \
            or not devices or len(set(devices)) < len(devices) \
            or any(s != "auto" and not (s.isdigit() and 1 <= int(s) <= 64) for s in procs) \
            or any(not re.fullmatch(r"auto|cpu|cuda(:\d{1,2})?", d) for d in devices) \
            or any(v is not None and not 20 <= v <= 10_000
                   for v in (args.update_ms, args.update_cost_ms)):
        raise UserError("daemon: need --channels in 1..16, --runs >= 1, --seconds > 0, "
                        "--processes a comma list of 'auto' and counts 1..64, --device a comma "
                        "list of auto, cpu, cuda, cuda:N, --update-ms and --update-cost-ms in "
                        "20..10000")
    return [(d, p) for d in devices for p in (procs[:1] if d.startswith("cuda") else procs)]


def _label(device: str, processes: str, several_devices: bool) -> str:
    return f"{device}/{processes}" if several_devices else processes


def run(args: argparse.Namespace) -> int:
    import soundfile as sf

    from subd.scoring.wer import word_errors

    settings = _settings(args)
    several = len({d for d, _ in settings}) > 1
    labels = [_label(d, p, several) for d, p in settings]
    audio = channel_audio(args.channels, args.seconds)
    load_start = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="subd-bench-daemon-") as tmp_name:
        tmp = Path(args.keep or tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        wavs = []
        for i, (samples, _) in enumerate(audio):
            wavs.append(tmp / f"c{i}.wav")
            sf.write(wavs[-1], samples, RATE, subtype="PCM_16")
        for r in range(args.runs):
            for (device, processes), label in zip(settings, labels, strict=True):
                row = _run_once(tmp, args, device, processes, audio, wavs)
                row["run"], row["label"] = r + 1, label
                rows.append(row)
                _print_row(row, args)
    load_end = os.getloadavg()
    limit = args.latency_ms / 1000 + SHOWN_SLACK_S
    cadence = "" if args.update_ms is None else f", an update every {args.update_ms} ms of audio"
    if args.update_cost_ms is not None:
        cadence += f", every update planned as {args.update_cost_ms} ms"
    if args.precision != "auto":
        cadence += f", precision {args.precision}"
    print(f"\nsubd bench daemon: {args.channels} channels of {args.model} in one subd run "
          f"([recognizer] device = {args.device!r}{cadence}), "
          f"D = {args.latency_ms} ms, {len(os.sched_getaffinity(0))} usable cores, audio "
          f"{min(len(a) for a, _ in audio) / RATE:.0f}-{max(len(a) for a, _ in audio) / RATE:.0f}"
          f" s a channel (dev and held-out clips), load average {load_start[0]:.2f} at the "
          f"start, {load_end[0]:.2f} at the end")
    head = "device/cpu_processes" if several else "cpu_processes"
    print(f"{head:>21} {'runs':>5} {'worst p95 s':>12} {'met':>6} {'misses':>7} "
          f"{'fallbacks':>10} {'degraded':>9} {'updates/ch':>11} {'WER %':>6}")
    summary = {}
    for label in labels:
        mine = [row for row in rows if row["label"] == label]
        worst = [max(c["p95"] for c in row["channels"]) for row in mine]
        met = sum(w <= limit and not row["totals"]["deadline_misses"]
                  and not row["totals"]["fallbacks"] for w, row in zip(worst, mine, strict=True))
        chans = [c for row in mine for c in row["channels"]]
        summary[label] = max(worst)
        print(f"{label:>21} {len(mine):>5} {max(worst):>12.2f} {f'{met}/{len(mine)}':>6} "
              f"{sum(r['totals']['deadline_misses'] for r in mine):>7} "
              f"{sum(r['totals']['fallbacks'] for r in mine):>10} "
              f"{sum(r['totals']['degraded_ticks'] for r in mine):>9} "
              f"{sum(c['updates'] for c in chans) / len(chans):>11.0f} "
              f"{100 * sum(c['wer'] for c in chans) / len(chans):>6.1f}")
    print(f"met: every channel's words shown within D + {SHOWN_SLACK_S} s = {limit:.1f} s at "
          f"p95, with 0 deadline misses and 0 fallbacks")
    if len(labels) > 1:
        base = labels[0]
        print(f"worst channel's p95 against {head} = {base}: " + ", ".join(
            f"{s} {summary[s]:.2f} s ({summary[s] / summary[base]:.2f}x)" for s in labels[1:]))
        # the captions themselves: each channel's committed words against the baseline's in
        # the same round (word errors, the baseline's words the reference)
        for label in labels[1:]:
            diffs, exact = [], 0
            for r in range(1, args.runs + 1):
                (mine,) = [row for row in rows if row["label"] == label and row["run"] == r]
                (theirs,) = [row for row in rows if row["label"] == base and row["run"] == r]
                pairs = list(zip(theirs["channels"], mine["channels"], strict=True))
                diffs += [word_errors(b["text"], c["text"]) for b, c in pairs]
                exact += sum(b["exact"] == c["exact"] for b, c in pairs)
            print(f"captions of {label} against {base}: {sum(d == 0 for d in diffs)} of "
                  f"{len(diffs)} channels word for word the same; words that differ per "
                  f"channel: {', '.join(map(str, diffs))}")
            print(f"  with their marks, capitals and word times: {exact} of {len(diffs)} "
                  "channels the same")
    return 0


def _print_row(row: dict[str, Any], args: argparse.Namespace) -> None:
    t = row["totals"]
    cpu = ", ".join(f"{name} {100 * share:.0f} %" for name, share in row["cpu"].items())
    print(f"run {row['run']}, device = {row['device']}, cpu_processes = {row['processes']} "
          f"({row['recognisers']} "
          f"recogniser processes): misses {t['deadline_misses']}, fallbacks {t['fallbacks']}, "
          f"degraded ticks {t['degraded_ticks']}, publish error p99 "
          f"{row['publish_p99_ms']:.3f} ms; CPU of a core while playing: {cpu}")
    print(f"  {'channel':>8} {'words':>6} {'p50 s':>6} {'p95 s':>6} {'max s':>6} "
          f"{'within':>7} {'updates':>8} {'WER %':>6}")
    for c in row["channels"]:
        print(f"  {c['name']:>8} {c['words']:>6} {c['p50']:>6.2f} {c['p95']:>6.2f} "
              f"{c['max']:>6.2f} {100 * c['within']:>6.0f}% {c['updates']:>8} "
              f"{100 * c['wer']:>6.1f}")
    sys.stdout.flush()


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("daemon", help="channels in one subd run, per cpu_processes")
    p.add_argument("--channels", type=int, default=4, help="file channels, played at once")
    p.add_argument("--processes", default="1,auto",
                   help="[recognizer] cpu_processes settings, the first the baseline")
    p.add_argument("--runs", type=int, default=1, help="rounds, each setting once a round")
    p.add_argument("--seconds", type=float, default=80.0,
                   help="audio per channel, in whole clips (all of them: 85 s)")
    p.add_argument("--latency-ms", type=int, default=2000, help="D")
    p.add_argument("--model", default="tiny.en", help="[recognizer] model")
    p.add_argument("--device", default="auto",
                   help="[recognizer] device, or a comma list of them, each a setting (the "
                        "first with the first --processes the baseline): auto (the daemon's "
                        "default), cpu, cuda, cuda:N; on CUDA every channel is on the batched "
                        "recogniser and --processes does not apply")
    p.add_argument("--update-ms", type=int, default=None,
                   help="one cadence on every device ([recognizer] min_update_ms and "
                        "gpu_update_ms)")
    p.add_argument("--update-cost-ms", type=int, default=None,
                   help="[recognizer] update_cost_ms on every device: updates sent on the "
                        "audio's clock and planned as lasting this long, so the devices decide "
                        "every word from the same update (with --update-ms)")
    p.add_argument("--precision", default="auto", choices=("auto", "fp32"),
                   help="[recognizer] precision on every device: auto (int8 on the CPU, fp16 on "
                        "CUDA) or fp32 on both (captions apart from rounding)")
    p.add_argument("--keep", metavar="DIR",
                   help="write the audio, configurations, daemon logs and events logs here")
    p.set_defaults(func=run)
