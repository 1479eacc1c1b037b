"""``subd bench abuse``: malformed and oversized HTTP requests against a running daemon.

Sends ``--requests`` (10 000) bad requests over loopback, ``--concurrency`` at a time, each on
its own connection with a short deadline (so the run ends by itself), and measures the
publish-time error at an SSE client — arrival (CLOCK_MONOTONIC) minus the tick's ``due_ns`` —
first with the daemon left alone, then under the abuse. The client is a separate process at
SCHED_FIFO where allowed, so the figure is the daemon's. Without ``--url`` it starts
``subd run`` on a temporary config (loopback, a random free port and push token, looping demo
clip, SSE sink, state in a temp dir) and stops it with SIGTERM afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from subd.bench.netutil import free_port
from subd.errors import UserError

NS_PER_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    push_path: str = "/push"
    events_path: str = "/events"


def _requests(t: Target, rng: random.Random) -> list[tuple[str, bytes]]:
    """One of every kind of bad request (name, raw bytes)."""
    host = f"Host: {t.host}:{t.port}\r\n".encode()
    push = t.push_path.encode()
    return [
        ("garbage", bytes(rng.getrandbits(8) for _ in range(512))),
        ("bad request line", b"GET / HTTP/9.9 extra\r\n\r\n"),
        ("huge header", b"GET /healthz HTTP/1.1\r\n" + host
         + b"X-A: " + b"a" * 65536 + b"\r\n\r\n"),
        ("header flood", b"GET /healthz HTTP/1.1\r\n" + host
         + b"".join(b"X-%d: v\r\n" % i for i in range(500)) + b"\r\n"),
        ("long path", b"GET /" + b"p" * 16384 + b" HTTP/1.1\r\n" + host + b"\r\n"),
        ("push, no token", b"POST " + push + b" HTTP/1.1\r\n" + host
         + b"Content-Length: 1024\r\n\r\n" + b"\0" * 1024),
        ("push, wrong token", b"POST " + push + b" HTTP/1.1\r\n" + host
         + b"Authorization: Bearer " + secrets.token_hex(16).encode()
         + b"\r\nContent-Length: 64\r\n\r\n" + b"\1" * 64),
        ("huge length", b"POST " + push + b" HTTP/1.1\r\n" + host
         + b"Content-Length: 1000000000000\r\n\r\n" + b"\0" * 4096),
        ("write to read-only", b"POST /healthz HTTP/1.1\r\n" + host
         + b"Content-Length: 2\r\n\r\n{}"),
        ("delete metrics", b"DELETE /metrics HTTP/1.1\r\n" + host + b"\r\n"),
        ("bad chunked", b"POST " + push + b" HTTP/1.1\r\n" + host
         + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n"),
        ("bad encoding", b"GET /%ff%fe/../../etc/passwd?\xff=\xfe HTTP/1.1\r\n" + host + b"\r\n"),
        ("truncated", b"GET " + t.events_path.encode() + b" HTTP/1.1\r\nHos"),
        ("sse hit and run", b"GET " + t.events_path.encode() + b" HTTP/1.1\r\n" + host
         + b"Last-Event-ID: " + b"9" * 4000 + b"\r\n\r\n"),
    ]


async def _one(t: Target, name: str, data: bytes, timeout_s: float) -> str:
    writer = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(t.host, t.port)
            writer.write(data)
            await writer.drain()
            if name == "truncated":
                return "hung up"  # client gives up mid-request
            line = await reader.readline()
        parts = line.split(b" ", 2)
        return parts[1].decode() if len(parts) > 1 and parts[1].isdigit() else "closed"
    except TimeoutError:
        return "timeout"
    except OSError:
        return "reset"
    finally:
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass


async def run_abuse(
    t: Target, n_requests: int, concurrency: int = 32, timeout_s: float = 2.0, seed: int = 0
) -> Counter:
    """Send ``n_requests`` bad requests; returns outcome -> count (status code or what
    happened to the connection)."""
    kinds = _requests(t, random.Random(seed))
    outcomes: Counter = Counter()
    it = iter(range(n_requests))

    async def worker() -> None:
        for i in it:
            name, data = kinds[i % len(kinds)]
            outcomes[await _one(t, name, data, timeout_s)] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return outcomes


# -- the measuring SSE client (its own process) -------------------------------------------------

def probe_main(host: str, port: int, path: str) -> int:
    """Connect to SSE, print READY at the first event, then at stdin EOF one
    ``k due_ns arrival_ns`` line per event."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        print("FIFO yes", flush=True)
    except (PermissionError, AttributeError, OSError):
        print("FIFO no", flush=True)
    try:
        sock = socket.create_connection((host, port), timeout=10)
    except OSError:
        print("NOCONN", flush=True)  # not listening yet: the bench retries
        return 2
    sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
    sock.setblocking(False)
    buf, rows, ready = b"", [], False
    while True:
        readable, _, _ = select.select([sock, sys.stdin], [], [], 5.0)
        if sys.stdin in readable and not sys.stdin.readline():
            break
        if sock not in readable:
            continue
        arrival_ns = time.monotonic_ns()
        data = sock.recv(1 << 16)
        if not data:
            break
        buf += data
        *events, buf = buf.split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if line.startswith(b"data: "):
                    payload = json.loads(line[6:])
                    if payload.get("type") == "delta":
                        rows.append((payload["k"], payload["due_ns"], arrival_ns))
                        if not ready:
                            ready = True
                            print("READY", flush=True)
    for k, due_ns, arrival_ns in rows:
        print(k, due_ns, arrival_ns)
    return 0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _summary(errors_ms: list[float]) -> str:
    if not errors_ms:
        return "no ticks received"
    return (f"p50 {_percentile(errors_ms, 0.5):.2f} ms  p99 {_percentile(errors_ms, 0.99):.2f} ms"
            f"  max {max(errors_ms):.2f} ms  (n={len(errors_ms)})")


# -- daemon management -------------------------------------------------------------------------

def _start_daemon(workdir: Path, port: int) -> subprocess.Popen:
    config = workdir / "subd.toml"
    config.write_text(
        "[server]\n"
        f'host = "127.0.0.1"\nport = {port}\npush_token = "{secrets.token_hex(16)}"\n'
        '[source]\nkind = "file"\nloop = true\n'
        '[sinks]\nenabled = ["sse"]\n'
    )
    with open(workdir / "daemon.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "subd.cli", "run", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
        )


def _start_probe(t: Target) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "subd.bench.abuse", "--probe", t.host, str(t.port), t.events_path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )


def _wait_ready(probe: subprocess.Popen, daemon: subprocess.Popen | None, limit_s: float) -> str:
    deadline = time.monotonic() + limit_s
    fifo = ""
    while time.monotonic() < deadline:
        if daemon is not None and daemon.poll() is not None:
            raise UserError(f"the daemon exited with {daemon.returncode} before serving")
        if probe.poll() is not None:
            return fifo
        readable, _, _ = select.select([probe.stdout], [], [], 1.0)
        if readable:
            line = probe.stdout.readline().strip()
            if line.startswith("FIFO"):
                fifo = line
            if line == "READY":
                return fifo
    raise UserError(f"no SSE tick within {limit_s:.0f} s")


def _measure(args: argparse.Namespace, t: Target, daemon: subprocess.Popen | None) -> int:
    # The probe may start before the daemon listens: retry until it connects and sees a tick.
    deadline = time.monotonic() + args.start_timeout_s
    while True:
        probe = _start_probe(t)
        try:
            fifo = _wait_ready(probe, daemon, max(deadline - time.monotonic(), 1.0))
        except BaseException:
            _end(probe)
            raise
        if probe.poll() is None:
            break
        if time.monotonic() > deadline:
            raise UserError(f"cannot read {t.events_path} from {t.host}:{t.port}")
        time.sleep(1.0)
    try:
        return _abuse_and_report(args, t, daemon, probe, fifo)
    finally:
        _end(probe)


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _abuse_and_report(args: argparse.Namespace, t: Target, daemon: subprocess.Popen | None,
                      probe: subprocess.Popen, fifo: str) -> int:
    quiet_from = time.monotonic_ns()
    time.sleep(args.quiet_s)
    abuse_from = time.monotonic_ns()
    outcomes = asyncio.run(run_abuse(t, args.requests, args.concurrency))
    abuse_to = time.monotonic_ns()
    out, _ = probe.communicate(input="", timeout=30)
    rows = [tuple(map(int, line.split())) for line in out.splitlines() if line[:1].isdigit()]
    quiet = [(a - d) / NS_PER_MS for _, d, a in rows if quiet_from <= a < abuse_from]
    abused = [(a - d) / NS_PER_MS for _, d, a in rows if abuse_from <= a < abuse_to]
    alive = daemon is None or daemon.poll() is None
    secs = (abuse_to - abuse_from) / 1e9
    print(f"abuse: {args.requests} bad requests in {secs:.1f} s "
          f"({args.requests / secs:.0f}/s, {args.concurrency} at a time)")
    print("outcomes: " + ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())))
    print(f"publish-time error at the SSE client ({fifo or 'FIFO ?'}), arrival - T(k):")
    print(f"  quiet        {_summary(quiet)}")
    print(f"  under abuse  {_summary(abused)}")
    if quiet and abused:
        ratio = _percentile(abused, 0.99) / max(_percentile(quiet, 0.99), 1e-9)
        print(f"  p99 ratio abuse/quiet: {ratio:.2f}x")
    if rows:
        n_missing = rows[-1][0] - rows[0][0] + 1 - len({k for k, _, _ in rows})
        print(f"ticks missing at the client: {n_missing} of {rows[-1][0] - rows[0][0] + 1}")
    print(f"daemon: {'still running' if alive else 'DIED'}")
    return 0 if alive else 1


def run(args: argparse.Namespace) -> int:
    if args.requests < 1 or args.concurrency < 1 or args.quiet_s <= 0:
        raise UserError("--requests and --concurrency must be >= 1 and --quiet-s > 0")
    if args.url:
        parts = urlsplit(args.url)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise UserError(f"--url {args.url!r}: expected http://HOST:PORT")
        t = Target(parts.hostname, parts.port, args.push_path, args.events_path)
        return _measure(args, t, None)
    with tempfile.TemporaryDirectory(prefix="subd-abuse-") as tmp:
        port = free_port()
        daemon = _start_daemon(Path(tmp), port)
        try:
            code = _measure(args, Target("127.0.0.1", port, args.push_path, args.events_path),
                            daemon)
        except UserError:
            print((Path(tmp) / "daemon.log").read_text(errors="replace")[-2000:], file=sys.stderr)
            raise
        finally:
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
        print(f"daemon exit code after SIGTERM: {daemon.returncode}")
        return code


def register(subparsers) -> None:
    p = subparsers.add_parser("abuse", help="bad HTTP requests vs publish-time error")
    p.add_argument("--url", help="a running daemon (http://127.0.0.1:PORT); default: start one")
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--quiet-s", type=float, default=10.0, help="quiet measurement before abuse")
    p.add_argument("--start-timeout-s", type=float, default=300.0)
    p.add_argument("--push-path", default="/push")
    p.add_argument("--events-path", default="/events")
    p.set_defaults(func=run)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--probe":
        try:
            sys.exit(probe_main(sys.argv[2], int(sys.argv[3]), sys.argv[4]))
        except (BrokenPipeError, KeyboardInterrupt):
            sys.exit(1)  # the bench went away
    sys.exit("usage: python -m subd.bench.abuse --probe HOST PORT PATH")
