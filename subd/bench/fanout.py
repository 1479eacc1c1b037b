"""``subd bench fanout``: SSE publish-time error and memory with many clients, half not reading.

The SSE sink runs in this process with a deadline publisher like the daemon's: at T(k) - 2 ms
``prepare`` (layout, encoding; the ``--workers`` fan-out processes get the event with its
release time T(k)), then spin to T(k) and ``publish`` (writes only), SCHED_FIFO when allowed.
Clients run in other processes (not this GIL): a bulk process holds the plain readers and the
non-readers (small receive buffers, never read), a probe process reads like a viewer.

What is measured is ``time - due_ns`` of every event at every reading client, on the shared
monotonic clock. For the bulk readers the time is the kernel's arrival stamp on their socket
(``SO_TIMESTAMPNS``), not their read time: they are one ``epoll`` loop doing raw ``recv``
at normal priority (they stand for other machines; cheap per event, like a browser's network
thread), and when that loop gets the CPU is not the server's error. The headline is the p99
over all of them, and the p99 of the worst reader. The probe (connected last) records its read
time and arrival; alone it under-reports (up to 1.3 ms below the worst reader's p99).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import select
import socket
import struct
import subprocess
import sys
import time
from collections import deque
from fractions import Fraction
from typing import Any

NS_PER_MS = 1_000_000
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux
TAIL_TICKS = 6  # published after the measured ticks: the probe exits after these, not inside
REJOIN_S = 1.0  # a dropped non-reader reconnects after this long (EventSource's retry: 1 s)


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


def _request(port: int, path: str = "/events") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()


# -- client processes ---------------------------------------------------------------------


def _deltas(buf: bytes) -> tuple[list[tuple[int, int]], bytes]:
    """(tick, due_ns) of each whole delta event in ``buf``, and the unparsed rest."""
    *events, rest = buf.split(b"\n\n")
    out = []
    for event in events:
        i = event.find(b'"due_ns":')
        if i < 0 or b'"type":"delta"' not in event:
            continue
        j = event.index(b'"k":') + 4
        out.append((int(event[j : event.index(b",", j)]), int(event[i + 9 : event.index(b",", i)])))
    return out, rest


def _arrival_ns(anc: list[tuple[int, int, bytes]], offset_ns: int) -> int | None:
    """The kernel's receive stamp (SO_TIMESTAMPNS, CLOCK_REALTIME) on the monotonic clock."""
    for level, kind, stamp in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(stamp) >= 16:
            sec, nsec = struct.unpack("qq", stamp[:16])
            return sec * 1_000_000_000 + nsec - offset_ns
    return None


def _client(port: int, *, idle: bool, wait: bool = True,
            path: str = "/events") -> socket.socket:
    """A connected client that has sent its request; with ``wait`` False, a non-blocking
    connect in progress (the request is the caller's once it is writable): a blocking connect
    can wait a second for a SYN resent when the server's listen queue is full, and every
    reader of this process with it."""
    sock = socket.socket()
    if idle:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)  # slow and small
    else:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    if not wait:
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        return sock
    sock.connect(("127.0.0.1", port))
    sock.sendall(_request(port, path))
    sock.setblocking(False)
    return sock


def _bulk_main(port: int, n_readers: int, n_idle: int, measured: range, rejoin: bool,
               path: str = "/events") -> None:
    """Readers (read everything, raw recv in one epoll loop) and idle clients (never read).

    For every event a reader receives, the kernel's arrival stamp minus ``due_ns`` is kept
    (arrival, not this process's read time: these readers are load at normal priority, and
    their own scheduling is not the server's error). An idle client that the server drops
    reconnects ``REJOIN_S`` later if ``rejoin`` (as EventSource does after ``retry``), so
    about half the clients never read for the whole run. Printed as JSON when the server
    closes the readers.
    """
    raise_fd_limit(n_readers + n_idle + 256)
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # load: not real-time
    ep = select.epoll()
    readers: dict[int, tuple[socket.socket, list[Any]]] = {}  # fd -> socket, [rest, errors]
    idle: dict[int, socket.socket] = {}
    connecting: dict[int, socket.socket] = {}  # idle clients reconnecting
    for i in range(0, n_readers + n_idle, 100):  # in batches: stay inside the listen backlog
        for j in range(i, min(i + 100, n_readers + n_idle)):
            sock = _client(port, idle=j >= n_readers, path=path)
            if j < n_readers:
                readers[sock.fileno()] = (sock, [b"", []])
                ep.register(sock.fileno(), select.EPOLLIN)
            else:
                idle[sock.fileno()] = sock
                ep.register(sock.fileno(), select.EPOLLRDHUP)  # (and errors): gone, not data
        time.sleep(0.05)
    print("ready", flush=True)
    offset_ns = time.time_ns() - time.monotonic_ns()
    done: list[list[int]] = []  # per reader, once the server closed it
    rejoin_at: deque[float] = deque()
    n_rejoined = 0
    n_shared = 0  # measured events stamped with a later segment's arrival
    space = socket.CMSG_SPACE(16)
    while readers:
        wait_s = max(0.0, rejoin_at[0] - time.monotonic()) if rejoin_at else -1
        for fd, mask in ep.poll(wait_s):
            if fd in connecting:
                sock = connecting.pop(fd)
                if mask & select.EPOLLOUT and not sock.getsockopt(socket.SOL_SOCKET,
                                                                  socket.SO_ERROR):
                    sock.send(_request(port, path))  # ~60 bytes into an empty buffer
                    idle[fd] = sock
                    ep.modify(fd, select.EPOLLRDHUP)
                    n_rejoined += 1
                else:
                    ep.unregister(fd)
                    sock.close()
                    if not done:
                        rejoin_at.append(time.monotonic() + REJOIN_S)
                continue
            if fd in idle:  # dropped by the server (or it is closing)
                ep.unregister(fd)
                idle.pop(fd).close()
                if rejoin and not done:
                    rejoin_at.append(time.monotonic() + REJOIN_S)
                continue
            sock, state = readers[fd]  # [unparsed rest, errors]
            try:
                data, anc, _, _ = sock.recvmsg(65536, space)
            except OSError:
                data, anc = b"", []
            if not data:
                ep.unregister(fd)
                readers.pop(fd)
                done.append(state[1])
                sock.close()
                continue
            stamp = _arrival_ns(anc, offset_ns) or time.monotonic_ns()
            events, state[0] = _deltas(state[0] + data)
            errors = [stamp - due for k, due in events if k in measured]
            state[1].extend(errors)
            # the stamp is the last segment's: an event read with a later one gets a late stamp
            n_shared += max(0, len(errors) - (0 if state[0].strip() else 1))  # (a chunk's CRLF)
        while rejoin_at and rejoin_at[0] <= time.monotonic() and not done:
            rejoin_at.popleft()
            sock = _client(port, idle=True, wait=False, path=path)
            connecting[sock.fileno()] = sock
            ep.register(sock.fileno(), select.EPOLLOUT)
    print(json.dumps({"errors_ns": done, "rejoined": n_rejoined, "shared_stamp": n_shared}))


def _probe_main(port: int, last_k: int, measured: range) -> None:
    rt = try_realtime(60)
    sock = socket.create_connection(("127.0.0.1", port))
    # the kernel stamps each segment as it reaches this socket (CLOCK_REALTIME): the arrival,
    # before this process is scheduled to read it
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.sendall(_request(port))
    buf = b""
    errors_ns: list[int] = []
    arrivals_ns: list[int] = []
    space = socket.CMSG_SPACE(16)
    offset_ns = time.time_ns() - time.monotonic_ns()
    last = -1
    while last < last_k:
        data, anc, _, _ = sock.recvmsg(1 << 20, space)
        now = time.monotonic_ns()
        if not data:
            break
        arrived = min(_arrival_ns(anc, offset_ns) or now, now)
        events, buf = _deltas(buf + data)
        for k, due in events:
            if k in measured:
                errors_ns.append(now - due)
                arrivals_ns.append(arrived - due)
            last = max(last, k)
    print(json.dumps({"errors_ns": errors_ns, "arrivals_ns": arrivals_ns, "realtime": rt}),
          flush=True)


# -- server -------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def _serve_once(n_clients: int, n_ticks: int, fps: Fraction, event_bytes: int,
                      warmup: int, n_workers: int, rejoin: bool) -> dict[str, Any]:
    from subd.pipeline.gcpace import PACER
    from subd.server.standalone import ServedSink
    from subd.sinks.sse.sink import SSEConfig, SSESink
    from subd.testing.sinks import script_states, script_words
    from subd.types import CaptionState

    measured = range(warmup, n_ticks)
    n_idle = n_clients // 2
    n_readers = n_clients - n_idle - 1  # the probe is a reader too
    sink = ServedSink(SSESink(SSEConfig(max_clients=n_clients + 16, fanout_workers=n_workers)),
                      "127.0.0.1")
    await sink.start()
    rss_idle = rss_mb()
    py = [sys.executable, "-c"]
    bulk = None
    if n_readers + n_idle:
        bulk = subprocess.Popen(
            py + [f"from subd.bench.fanout import _bulk_main; _bulk_main({sink.port}, "
                  f"{n_readers}, {n_idle}, {measured!r}, {rejoin})"],
            stdout=subprocess.PIPE, text=True)
        assert bulk.stdout is not None
        await asyncio.to_thread(bulk.stdout.readline)
    while sink.n_clients < n_readers + n_idle:
        await asyncio.sleep(0.05)
    probe = subprocess.Popen(
        py + [f"from subd.bench.fanout import _probe_main; _probe_main({sink.port}, "
              f"{n_ticks + TAIL_TICKS - 1}, {measured!r})"], stdout=subprocess.PIPE, text=True)
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
    for k, state in zip(range(n_ticks + TAIL_TICKS), states, strict=False):
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
        if k in measured:
            publish_ms.append((time.monotonic_ns() - t_pub) / NS_PER_MS)
        PACER.after_publish()
        if k % 30 == 0:
            max_buffered = max(max_buffered, sink.buffered_bytes())
    PACER.release()
    out, _ = await asyncio.to_thread(probe.communicate, timeout=60)
    result = json.loads(out.strip().splitlines()[-1])
    rss_end = rss_mb()
    rss_workers = sum(rss_mb(pid) for pid in sink.worker_pids)
    stats = dict(n_skipped=sink.n_skipped, n_dropped=sink.n_dropped, n_open=sink.n_clients,
                 shares=sink.fanout_shares)
    await sink.close()
    readers_ns: list[list[int]] = []
    n_rejoined = 0
    if bulk is not None:
        try:
            out, _ = await asyncio.to_thread(bulk.communicate, timeout=60)
            bulk_result = json.loads(out.strip().splitlines()[-1])
            readers_ns, n_rejoined = bulk_result["errors_ns"], bulk_result["rejoined"]
        finally:
            bulk.kill()
            bulk.wait()
    readers_ns = [r for r in readers_ns if r] + [result["arrivals_ns"]]
    every_ms = [e / NS_PER_MS for r in readers_ns for e in r]
    errors_ms = [e / NS_PER_MS for e in result["errors_ns"]]
    arrivals_ms = [e / NS_PER_MS for e in result["arrivals_ns"]]
    return dict(clients=n_clients, readers=n_readers + 1, idle=n_idle,
                p50_ms=percentile(errors_ms, 0.5), p99_ms=percentile(errors_ms, 0.99),
                max_ms=max(errors_ms), n_samples=len(errors_ms),
                arrival_p50_ms=percentile(arrivals_ms, 0.5),
                arrival_p99_ms=percentile(arrivals_ms, 0.99),
                every_p50_ms=percentile(every_ms, 0.5), every_p99_ms=percentile(every_ms, 0.99),
                worst_p99_ms=max(percentile(r, 0.99) for r in readers_ns) / NS_PER_MS,
                n_rejoined=n_rejoined,
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
                                            args.workers, not args.no_rejoin)))
    print(f"subd bench fanout: {args.ticks} ticks at {args.fps} fps, ~{args.event_bytes} B "
          f"events, {args.workers} fan-out worker processes, publisher SCHED_FIFO={realtime}, "
          f"probe SCHED_FIFO={rows[0]['probe_realtime']}")
    print("publish-time error (ms after due_ns) at the reading clients. all: every event at"
          " every reader, by its kernel arrival stamp (SO_TIMESTAMPNS: when the bytes reached"
          " the client's socket); worst: the p99 of the reader whose p99 is highest; probe: the"
          " last-connected reader, a real-time client, by its read time and (arrive) arrival."
          " fanout: time in publish(), this process's share of the writing. Memory: this process"
          " (workers_MB: the fan-out workers); user-space buffers of all processes:")
    head = ("clients", "readers", "all_p50", "all_p99", "worst_p99", "probe_p50", "probe_p99",
            "probe_max", "arrive_p99", "fanout_p50", "fanout_p99",
            "rss_idle_MB", "rss_conn_MB", "rss_end_MB", "workers_MB", "buf_max_MB", "skipped",
            "dropped", "rejoined")
    print(" ".join(f"{h:>11}" for h in head))
    for r in rows:
        vals = (r["clients"], r["readers"], r["every_p50_ms"], r["every_p99_ms"],
                r["worst_p99_ms"], r["p50_ms"], r["p99_ms"], r["max_ms"], r["arrival_p99_ms"],
                r["publish_p50_ms"], r["publish_p99_ms"], r["rss_idle_mb"],
                r["rss_connected_mb"], r["rss_end_mb"], r["rss_workers_mb"],
                r["max_buffered_mb"], r["n_skipped"], r["n_dropped"],
                r["n_rejoined"])
        print(" ".join(f"{v:>11.2f}" if isinstance(v, float) else f"{v:>11}" for v in vals))
    many, one = rows
    print("fan-out shares at the end (clients x us per client in the tight write loop): "
          + ", ".join(f"{name} {n} x {us:.2f}" for name, (n, us) in
                      zip(["this process"] + [f"worker {i + 1}" for i in range(args.workers)],
                          many["shares"], strict=True)))
    print(f"p99 over all reading clients: {many['every_p99_ms']:.2f} ms with {args.clients}"
          f" clients, {one['every_p99_ms']:.2f} ms with 1"
          f" ({many['every_p99_ms'] / max(one['every_p99_ms'], 1e-3):.1f}x); target <= 2 ms:"
          f" {'met' if many['every_p99_ms'] <= 2 else 'NOT met'}. The worst single reader's p99:"
          f" {many['worst_p99_ms']:.2f} ms.")
    growth_mb = many["rss_end_mb"] - many["rss_connected_mb"]
    print(f"Memory: RSS growth while publishing: {growth_mb:.1f} MB; user-space buffers at most"
          f" {many['max_buffered_mb']:.1f} MB"
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
    p.add_argument("--no-rejoin", action="store_true",
                   help="dropped non-readers stay away (by default each reconnects after"
                   f" {REJOIN_S:g} s, so half the clients never read for the whole run)")
    p.set_defaults(func=run)
