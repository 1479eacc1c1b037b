"""``subd bench realtime``: publication accuracy and caption latency, subd vs a naive pipeline.

subd: the file is paced at real time with ±jitter, the daemon publishes over SSE on loopback and
a client in another process (SCHED_FIFO where allowed) takes each event's arrival time from the
kernel's receive stamp (SO_TIMESTAMPNS). Naive: the
same paced audio, each recogniser update sent the moment it is done (what peers do). Prints
publish-time error at the client, deadline misses, fallbacks, committed-word latency (word end
→ committed), tentative latency, time to first caption and WER for both; plots both latency
distributions to a PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import re
import socket
import struct
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

from subd.bench.quality_sets import POCKETSPHINX
from subd.errors import UserError
from subd.scoring.wer import normalise, wer
from subd.tasks import start_task

LIBRIVOX_DIR = POCKETSPHINX / "librivox"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("realtime", help="tick accuracy and caption latency vs naive push")
    p.add_argument("--clip", help="speech file (default: the LibriVox test clips, joined)")
    p.add_argument("--transcript", help="reference text, or a file holding it")
    p.add_argument("--latency-ms", type=int, default=2000)
    p.add_argument("--jitter-ms", type=int, default=50)
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--plot", default="realtime_latency.png", help="PNG output ('': none)")
    p.set_defaults(func=run)


def librivox_clips() -> list[tuple[Path, str]]:
    """The LibriVox test clips and their transcripts, in the table's order."""
    table = LIBRIVOX_DIR / "transcription"
    if not table.exists():
        raise UserError("no --clip given and the LibriVox test clips are not installed "
                        "(apt-get install pocketsphinx-testdata)")
    clips = []
    for line in table.read_text().splitlines():
        m = re.match(r"<s>\s*(.*?)\s*</s>\s*\((.+)\)", line)
        if m is None:
            raise UserError(f"{table}: unexpected format")
        clips.append((LIBRIVOX_DIR / f"{m.group(2)}.wav", m.group(1)))
    return clips


def default_clip() -> tuple[Path, str]:
    return librivox_clips()[0]


def joined_clips(gap_s: float = 0.75) -> tuple[np.ndarray, str]:
    """Every LibriVox test clip, one after another with ``gap_s`` of silence: 28.5 s of
    speech (71 words), so p99 of the publish error is over ~850 ticks and one word moves
    the WER by 1.4 points, not 4.5 as on one clip."""
    from subd.sources.decode import load_audio

    parts, texts = [], []
    for path, text in librivox_clips():
        parts += [load_audio(path), np.zeros(int(gap_s * 16000), np.float32)]
        texts.append(text)
    return np.concatenate(parts), " ".join(texts)


# ---- SSE client (its own process, real-time priority where allowed) ---------------------------

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's value; Python 3.11 lacks it


def _wall_minus_monotonic_ns() -> int:
    """CLOCK_REALTIME − CLOCK_MONOTONIC (receive stamps are wall time; the ticks monotonic),
    from the closest of a few paired readings."""
    best = None
    for _ in range(20):
        a = time.monotonic_ns()
        wall = time.time_ns()
        b = time.monotonic_ns()
        if best is None or b - a < best[0]:
            best = (b - a, wall - (a + b) // 2)
    return best[1]



def _sse_client(port: int, conn) -> None:
    from subd.clock import request_realtime_priority

    rt = request_realtime_priority(who="bench SSE client")
    sock = socket.create_connection(("127.0.0.1", port))
    # the kernel's receive time of each segment: what the daemon sent when, without the
    # client's own wake-up (0.2-0.3 ms on the development VM, milliseconds when its vCPU is
    # taken), which no daemon could make up for
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    wall_minus_mono = _wall_minus_monotonic_ns()
    sock.sendall(b"GET /events HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n")
    buf = b""
    records = []
    sock.settimeout(1.0)
    idle = 0
    while idle < 20:
        try:
            data, ancillary, _, _ = sock.recvmsg(65536, 64)
        except TimeoutError:
            idle += 1
            continue
        now, stamped = time.monotonic_ns(), False
        for level, kind, stamp in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(stamp) >= 16:
                sec, nsec = struct.unpack("qq", stamp[:16])
                now, stamped = sec * 1_000_000_000 + nsec - wall_minus_mono, True
        if not data:
            break
        idle = 0
        buf += data
        for m in re.finditer(rb"data: (\{.*?\})\n", buf):
            try:
                ev = json.loads(m.group(1))
            except ValueError:
                continue
            if "due_ns" in ev:
                records.append((ev["k"], ev["due_ns"], now, stamped))
        buf = buf[buf.rfind(b"\n\n") + 2:] if b"\n\n" in buf else buf
    conn.send((rt, records))


# ---- observation -------------------------------------------------------------------------------


@dataclass
class Observed:
    t0_ns: int = 0
    rate: Fraction = Fraction(1)
    commits: list[tuple[int, int, str]] = field(default_factory=list)  # (end_ns, t, text)
    reach: list[tuple[int, int]] = field(default_factory=list)  # (now, audio reached)
    first_caption_ns: int | None = None
    shown: list[tuple[int, int]] = field(default_factory=list)  # (word end, sent)

    def spoken_ns(self, audio_ns: int) -> int:
        return self.t0_ns + int(audio_ns / self.rate)

    def on_hypothesis(self, result, now_ns: int) -> None:
        hyp = result.hypothesis
        for w in hyp.committed:
            self.commits.append((w.end_ns, now_ns, w.text))
        ends = [w.end_ns for w in (*hyp.committed, *hyp.tentative)]
        if ends:
            self.reach.append((now_ns, max(ends)))

    def on_publish(self, state, sent_ns: int) -> None:
        if self.first_caption_ns is None and (state.committed or state.tentative):
            self.first_caption_ns = sent_ns
        for tw in state.committed:
            self.shown.append((tw.word.end_ns, sent_ns))

    def latencies(self) -> dict[str, np.ndarray]:
        commit = np.array([t - self.spoken_ns(e) for e, t, _ in self.commits]) / 1e6
        tent = []
        for end, _, _ in self.commits:
            seen = next((now for now, r in self.reach if r >= end), None)
            if seen is not None:
                tent.append((seen - self.spoken_ns(end)) / 1e6)
        shown = np.array([s - self.spoken_ns(e) for e, s in self.shown]) / 1e6
        return {"commit": commit, "tentative": np.array(tent), "shown": shown}


def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


async def _run_subd(args, audio: np.ndarray) -> tuple[dict, Observed]:
    from subd.config import load_config
    from subd.service.daemon import Daemon, build_sink, sink_options
    from subd.sources.live import FileSource

    cfg = load_config(None)
    cfg = cfg.replace(tick=cfg.tick.__class__(latency_ms=args.latency_ms),
                      recognizer=cfg.recognizer.__class__(model=args.model))
    source = FileSource(audio, jitter_ms=args.jitter_ms, seed=1)
    obs = Observed()
    sse = build_sink("sse", sink_options(cfg, "sse"))
    daemon = Daemon(cfg, source, sinks=[sse], observer=obs, serve=("127.0.0.1", 0))
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    loop = asyncio.get_running_loop()
    run_task = start_task(daemon.run(), "bench:daemon")
    # the port is bound before the model loads (its routes answer 503 until the channel is
    # up): the client connects once the source has started, ticks come D after that
    while (daemon.bound_port is None or not source.t0_ns) and not run_task.done():
        await asyncio.sleep(0.01)
    client = ctx.Process(target=_sse_client, args=(daemon.bound_port, child), daemon=True)
    client.start()
    obs.t0_ns = source.t0_ns
    counters = await run_task
    rt, records = await loop.run_in_executor(None, parent.recv)
    client.join(5)
    errors = np.array([(now - due) / 1e6 for _, due, now, _ in records])
    n_stamped = sum(stamped for *_, stamped in records)
    words = [text for _, _, text in obs.commits]
    return {"counters": counters, "client_rt": rt, "errors_ms": errors, "words": words,
            "kernel_stamped": n_stamped}, obs


async def _run_naive(args, audio: np.ndarray) -> tuple[dict, Observed]:
    """Each update's words are 'sent' the moment the recogniser returns them."""
    from subd.clock import MonotonicClock
    from subd.history import AudioHistory
    from subd.service.daemon import recognizer_spec
    from subd.sources.live import FileSource
    from subd.types import SAMPLE_RATE_HZ
    from subd.workers.hosts import FactorySpec, UpdateRequest
    from subd.workers.process import ProcessWorker

    history = AudioHistory(40 * SAMPLE_RATE_HZ, shared=True)
    worker = ProcessWorker("recognise", FactorySpec("subd.workers.hosts:RecogniserHost", {
        "recognizer": recognizer_spec(args.model), "history_capacity": history.capacity,
        "history_name": history.shm_name}))
    await worker.start()
    clock = MonotonicClock()
    source = FileSource(audio, jitter_ms=args.jitter_ms, seed=1)
    obs = Observed(t0_ns=await source.start(clock))
    from subd.workers.hosts import FinishRequest

    async def feed():
        async for chunk in source.chunks():
            history.write(chunk.start_sample, chunk.samples)

    feeder = start_task(feed(), "bench:feed")
    words: list[str] = []
    while True:
        done = feeder.done()
        end = history.end_sample
        req = FinishRequest(end) if done else UpdateRequest(end)
        result = await worker.call(req)
        now = clock.now_ns()
        obs.on_hypothesis(result, now)
        for w in result.hypothesis.committed:
            words.append(w.text)
            obs.shown.append((w.end_ns, now))
            if obs.first_caption_ns is None:
                obs.first_caption_ns = now
        if done:
            break
        await asyncio.sleep(0)
    await worker.close()
    history.close()
    return {"words": words}, obs


def _report(name: str, res: dict, obs: Observed, ref: list[str]) -> dict:
    lat = obs.latencies()
    out = {
        "committed_latency_p50_ms": pct(lat["commit"], 50),
        "committed_latency_p95_ms": pct(lat["commit"], 95),
        "tentative_latency_p50_ms": pct(lat["tentative"], 50),
        "display_latency_p50_ms": pct(lat["shown"], 50),
        "display_latency_p99_minus_p1_ms": pct(lat["shown"], 99) - pct(lat["shown"], 1),
        "time_to_first_caption_s": ((obs.first_caption_ns - obs.t0_ns) / 1e9
                                    if obs.first_caption_ns else float("nan")),
        "wer": wer(ref, normalise(" ".join(res["words"]))),
    }
    if "errors_ms" in res:
        err = res["errors_ms"]
        c = res["counters"]
        out.update({"publish_error_p50_ms": pct(np.abs(err), 50),
                    "publish_error_p99_ms": pct(np.abs(err), 99),
                    "publish_error_max_ms": float(np.abs(err).max()) if err.size else 0.0,
                    "events_at_client": int(err.size), "deadline_misses": c.deadline_misses,
                    "fallbacks": c.fallbacks, "stale_slots": c.stale_slots,
                    "degraded_ticks": c.degraded_ticks, "client_sched_fifo": res["client_rt"],
                    "events_with_kernel_receive_time": res["kernel_stamped"]})
    print(f"{name}:")
    for k, v in out.items():
        print(f"  {k:34s} {v:.3f}" if isinstance(v, float) else f"  {k:34s} {v}")
    return lat


def run(args: argparse.Namespace) -> int:
    from subd.sources.decode import load_audio

    if args.clip:
        clip = Path(args.clip)
        audio = load_audio(clip)
        name = clip.name
        text = args.transcript or ""
        if text and Path(text).is_file():
            text = Path(text).read_text()
    else:
        audio, text = joined_clips()
        name = "LibriVox test clips"
    ref = normalise(text)
    print(f"realtime: {name}, {len(audio) / 16000:.1f} s of audio, D = {args.latency_ms} ms, "
          f"±{args.jitter_ms} ms jitter", flush=True)
    res, obs = asyncio.run(_run_subd(args, audio))
    naive, nobs = asyncio.run(_run_naive(args, audio))
    lat_subd = _report("subd (pull, fixed latency D)", res, obs, ref)
    lat_naive = _report("naive push", naive, nobs, ref)
    if not args.plot:
        return 0
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    bins = np.linspace(0, max(1.0, *(np.nanmax(x) if x.size else 0 for x in
                                      (lat_subd["shown"], lat_naive["shown"]))), 60)
    ax.hist(lat_subd["shown"], bins=bins, alpha=0.6, label=f"subd (D = {args.latency_ms} ms)")
    ax.hist(lat_naive["shown"], bins=bins, alpha=0.6, label="naive push")
    ax.set_xlabel("word end → shown to the viewer (ms)")
    ax.set_ylabel("words")
    ax.set_title(f"Caption latency, {name}, ±{args.jitter_ms} ms input jitter")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    print(f"plot: {args.plot}")
    return 0
