"""``subd bench fanout``: SSE publish-time error and memory with many clients, half not reading.

The SSE sink runs in this process with a deadline publisher like the daemon's: at T(k) - 2 ms
``prepare`` (layout, encoding; the fan-out workers get the event with its release time T(k)),
then spin to T(k) and ``publish`` (writes only); SCHED_FIFO when allowed, and ``--workers``
fan-out worker processes inherit it. Clients run in other processes so they do not share this
GIL: a bulk process holds the plain readers and the non-readers (small receive buffers, never
read), and a probe process (SCHED_FIFO when allowed) reads like a viewer and records, for every
event, ``receive time - due_ns`` on the shared monotonic clock. Printed for N clients and for 1.

The probe is a plain reading client and not favoured: it connects last, so it is the last
client written to by whichever process serves it. The bulk readers are load, not what is
measured: they are one ``selectors`` loop doing raw ``recv`` (cheap per event, like a browser's
network thread), not asyncio streams, whose per-event cost on the 2-core machine competed with
the publisher for CPU; and they run at normal priority (they stand for other machines), where
before they inherited this process's SCHED_FIFO by accident.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import selectors
import socket
import struct
import subprocess
import sys
import time
from fractions import Fraction
from typing import Any

NS_PER_MS = 1_000_000
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux


def raise_fd_limit(n: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n if hard == resource.RLIM_INFINITY else min(n, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def try_realtime(priority: int = 50) -> bool:
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        return True
    except (PermissionError, OSError, AttributeError):
        return False


def rss_mb(pid: int | str = "self") -> float:
    """Resident memory of a process in MB (nan if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _request(port: int) -> bytes:
    return f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()


# -- client processes ---------------------------------------------------------------------


def _bulk_main(port: int, n_readers: int, n_idle: int) -> None:
    """Readers (read everything, raw recv in one selectors loop) and idle clients (never read)."""
    raise_fd_limit(n_readers + n_idle + 256)
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # load: not real-time
    sel = selectors.DefaultSelector()
    held = []
    for i in range(0, n_readers + n_idle, 100):  # in batches: stay inside the listen backlog
        for j in range(i, min(i + 100, n_readers + n_idle)):
            sock = socket.socket()
            if j >= n_readers:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)  # slow and small
            sock.connect(("127.0.0.1", port))
            sock.sendall(_request(port))
            sock.setblocking(False)
            if j < n_readers:
                sel.register(sock, selectors.EVENT_READ)
            held.append(sock)
        time.sleep(0.05)
    print("ready", flush=True)
    while sel.get_map():
        for key, _ in sel.select():
            try:
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
            except OSError:
                data = b""
            if not data:
                sel.unregister(key.fileobj)


def _probe_main(port: int, last_k: int, warmup: int) -> None:
    rt = try_realtime(60)
    sock = socket.create_connection(("127.0.0.1", port))
    # the kernel stamps each segment as it reaches this socket (CLOCK_REALTIME): the arrival,
    # before this process is scheduled to read it
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.sendall(_request(port))
    buf = b""
    errors_ns: list[int] = []
    arrivals_ns: list[int] = []
    while True:
        data, anc, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(16))
        now = time.monotonic_ns()
        arrived = now
        for level, kind, stamp in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(stamp) >= 16:
                sec, nsec = struct.unpack("qq", stamp[:16])
                arrived = sec * 1_000_000_000 + nsec - (time.time_ns() - time.monotonic_ns())
        if not data:
            break
        buf += data
        *events, buf = buf.split(b"\n\n")
        done = False
        for event in events:
            i = event.find(b'"due_ns":')
            if i < 0 or b'"type":"delta"' not in event:
                continue
            due = int(event[i + 9 : event.index(b",", i)])
            k = int(event[event.index(b'"k":') + 4 : event.index(b",", event.index(b'"k":'))])
            if k >= warmup:
                errors_ns.append(now - due)
                arrivals_ns.append(min(arrived, now) - due)
            done = done or k >= last_k
        if done:
            break
    print(json.dumps({"errors_ns": errors_ns, "arrivals_ns": arrivals_ns, "realtime": rt}),
          flush=True)


# -- server -------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def _serve_once(n_clients: int, n_ticks: int, fps: Fraction, event_bytes: int,
                      warmup: int, n_workers: int) -> dict[str, Any]:
    from subd.gcpace import PACER
    from subd.sinks.scripted import script_states, script_words
    from subd.sinks.sse import SSEConfig, SSESink
    from subd.types import CaptionState

    n_idle = n_clients // 2
    n_readers = n_clients - n_idle - 1  # the probe is a reader too
    sink = SSESink(SSEConfig(host="127.0.0.1", port=0, max_clients=n_clients + 16,
                             fanout_workers=n_workers))
    await sink.start()
    rss_idle = rss_mb()
    py = [sys.executable, "-c"]
    bulk = None
    if n_readers + n_idle:
        bulk = subprocess.Popen(
            py + [f"from subd.bench.fanout import _bulk_main; _bulk_main({sink.port}, "
                  f"{n_readers}, {n_idle})"], stdout=subprocess.PIPE, text=True)
        assert bulk.stdout is not None
        await asyncio.to_thread(bulk.stdout.readline)
    while sink.n_clients < n_readers + n_idle:
        await asyncio.sleep(0.05)
    probe = subprocess.Popen(
        py + [f"from subd.bench.fanout import _probe_main; _probe_main({sink.port}, "
              f"{n_ticks - 1}, {warmup})"], stdout=subprocess.PIPE, text=True)
    while sink.n_clients < n_readers + n_idle + 1:
        await asyncio.sleep(0.05)
    rss_connected = rss_mb()
    pad = "x" * max(0, event_bytes - 200)
    period = Fraction(10**9) / fps
    states = script_states(script_words(" ".join(["word"] * 2000)))
    PACER.acquire()  # as the daemon's publisher: collections right after publishing
    t0 = time.monotonic_ns()
    max_buffered = 0
    publish_ms: list[float] = []
    for k, state in zip(range(n_ticks), states, strict=False):
        due = t0 + int((k + 1) * period)
        slack_s = (due - time.monotonic_ns()) / 1e9 - 0.002
        if slack_s > 0:
            await asyncio.sleep(slack_s)
        tick = CaptionState(k, due, state.audio_end_ns, state.committed, pad + state.tentative)
        sink.prepare(tick)  # as the daemon's publisher: encode at T(k) - 2 ms, write at T(k)
        while time.monotonic_ns() < due:
            pass
        t_pub = time.monotonic_ns()
        sink.publish(tick)
        if k >= warmup:
            publish_ms.append((time.monotonic_ns() - t_pub) / NS_PER_MS)
        PACER.after_publish()
        if k % 30 == 0:
            max_buffered = max(max_buffered, sink.buffered_bytes())
    PACER.release()
    out, _ = await asyncio.to_thread(probe.communicate, timeout=60)
    result = json.loads(out.strip().splitlines()[-1])
    rss_end = rss_mb()
    rss_workers = sum(rss_mb(pid) for pid in sink.worker_pids)
    stats = dict(n_skipped=sink.n_skipped, n_dropped=sink.n_dropped, n_open=sink.n_clients)
    await sink.close()
    if bulk is not None:
        bulk.kill()
        bulk.wait()
    errors_ms = [e / NS_PER_MS for e in result["errors_ns"]]
    arrivals_ms = [e / NS_PER_MS for e in result["arrivals_ns"]]
    return dict(clients=n_clients, readers=n_readers + 1, idle=n_idle,
                p50_ms=percentile(errors_ms, 0.5), p99_ms=percentile(errors_ms, 0.99),
                max_ms=max(errors_ms), n_samples=len(errors_ms),
                arrival_p50_ms=percentile(arrivals_ms, 0.5),
                arrival_p99_ms=percentile(arrivals_ms, 0.99),
                publish_p50_ms=percentile(publish_ms, 0.5),
                publish_p99_ms=percentile(publish_ms, 0.99),
                rss_idle_mb=rss_idle, rss_connected_mb=rss_connected, rss_end_mb=rss_end,
                rss_workers_mb=rss_workers,
                max_buffered_mb=max_buffered / 2**20, probe_realtime=result["realtime"], **stats)


def run(args: argparse.Namespace) -> int:
    from subd.errors import UserError

    if args.clients < 1 or args.warmup < 0 or args.ticks < args.warmup + 60:
        raise UserError("fanout: need --clients >= 1 and --ticks >= --warmup + 60")
    if not 0 <= args.workers <= 64:
        raise UserError("fanout: --workers must be in 0..64")
    fps = Fraction(args.fps)
    limit = raise_fd_limit(2 * args.clients + 256)
    if limit < args.clients + 64:
        raise UserError(f"fanout: open-file limit {limit} is too low for {args.clients} clients")
    realtime = try_realtime(50)
    rows = []
    for n in (args.clients, 1):
        rows.append(asyncio.run(_serve_once(n, args.ticks, fps, args.event_bytes, args.warmup,
                                            args.workers)))
    print(f"subd bench fanout: {args.ticks} ticks at {args.fps} fps, ~{args.event_bytes} B "
          f"events, {args.workers} fan-out worker processes, publisher SCHED_FIFO={realtime}, "
          f"probe SCHED_FIFO={rows[0]['probe_realtime']}")
    print("publish-time error at the last-connected reading client (receive - due, ms; arrive:"
          " when the kernel queued the bytes on its socket, before the client was scheduled), time"
          " spent in publish() (this process's share of the fan-out, ms), server memory (this"
          " process; workers_MB: the fan-out workers), user-space buffers (all processes):")
    head = ("clients", "readers", "p50_ms", "p99_ms", "max_ms", "arrive_p50", "arrive_p99",
            "fanout_p50", "fanout_p99",
            "rss_idle_MB", "rss_conn_MB", "rss_end_MB", "workers_MB", "buf_max_MB", "skipped",
            "dropped")
    print(" ".join(f"{h:>11}" for h in head))
    for r in rows:
        vals = (r["clients"], r["readers"], r["p50_ms"], r["p99_ms"], r["max_ms"],
                r["arrival_p50_ms"], r["arrival_p99_ms"], r["publish_p50_ms"],
                r["publish_p99_ms"], r["rss_idle_mb"], r["rss_connected_mb"],
                r["rss_end_mb"], r["rss_workers_mb"], r["max_buffered_mb"], r["n_skipped"],
                r["n_dropped"])
        print(" ".join(f"{v:>11.2f}" if isinstance(v, float) else f"{v:>11}" for v in vals))
    many, one = rows
    print(f"p99 ratio {args.clients} vs 1 client: {many['p99_ms'] / max(one['p99_ms'], 1e-3):.1f}x;"
          f" RSS growth while publishing: {many['rss_end_mb'] - many['rss_connected_mb']:.1f} MB"
          f" (unbounded queues would hold "
          f"{many['idle'] * args.ticks * args.event_bytes / 2**20:.0f} MB)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("fanout", help="SSE fan-out: publish error and memory, N vs 1")
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--ticks", type=int, default=540)
    p.add_argument("--warmup", type=int, default=240,
                   help="ticks not measured: idle clients' kernel and user-space buffers fill"
                   " meanwhile (~6 s); they are dropped inside the measured window")
    p.add_argument("--fps", default="30")
    p.add_argument("--event-bytes", type=int, default=400, help="approximate size of an event")
    p.add_argument("--workers", type=int, default=1,
                   help="sinks.sse fanout_workers: processes writing to clients besides this one")
    p.set_defaults(func=run)
