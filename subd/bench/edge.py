"""``subd bench edge``: viewers served through the caption bus, and the same viewers without it.

Bus on: a redis-server of its own (in a temporary directory, stopped at the end), one
``subd run`` daemon publishing channel "main" (the bundled demo clip, the scripted recogniser:
this measures the fan-out, not the model) to it, and two ``subd edge`` processes (one fan-out
worker each), with ``--clients`` SSE clients per edge, half of them never reading (they are
dropped and reconnect, as EventSource does). Bus off: the same daemon without ``[bus]`` serving
the same number of clients itself (``[sinks.sse] fanout_workers = 1``).

The clients are bench fanout's bulk processes (one per server): for every event a reader
receives, the kernel's arrival stamp (SO_TIMESTAMPNS) minus the event's ``due_ns`` (T(k) on this
host's monotonic clock, which the edges share with the daemon here). The headline is the p99
over every event at every reader, and the worst single reader's p99. Memory: the resident size
of every server process (fan-out workers included) and of Redis when the clients are connected
and at the end, and the stream's length (bounded by ``[bus] stream_maxlen``).

Scheduling, as on a host that serves viewers: the edges' release loops (and the daemon's
publisher) at SCHED_FIFO 10, their fan-out workers at ``--fanout-priority`` (9, subd edge's
default; bus off the daemon's workers the same, so the two rows differ by the bus alone), this
process at normal priority. Redis at SCHED_FIFO 8, below them: it stands for a machine of its
own, and at normal priority the other load of the shared 2-core host held entries back past
their 20 ms lead (edge releases late at p99 15 ms). The readers stand for other machines: once
connected they run at SCHED_FIFO ``--reader-priority`` (1), below every server process, so
other load on the host cannot hold them a tick behind. A reader that is (2000 clients on the
shared 2-core machine at normal priority: 13-27 % of the events) reads two events in one
``recvmsg``, and the kernel has merged their segments under the later one's stamp: the
earlier event is then measured a tick late. ``late_stamp`` counts such events.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from subd.bench.fanout import percentile, raise_fd_limit, rss_mb, try_realtime
from subd.bench.netutil import free_port, get_json, wait_until

NS_PER_MS = 1_000_000
START_LIMIT_S = 120.0
TAIL_TICKS = 15
STREAM_MAXLEN = 300
REDIS_PRIORITY = 8  # SCHED_FIFO: below every server process, above the readers


def _tree_rss_mb(pid: int) -> float:
    """A process and its children (fan-out workers, stage processes)."""
    total = rss_mb(pid)
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return total + sum(_tree_rss_mb(int(c)) for c in children)


class _Procs:
    """Every process this bench starts, stopped (by pid) in reverse order."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        with open(self.tmp / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, timeout_s: float = 15) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc)


def _daemon_config(port: int, bus_url: str, workers: int, priority: int) -> str:
    # a short stream: the bench runs long enough to show MAXLEN ~ holding it
    bus = f'[bus]\nurl = "{bus_url}"\nstream_maxlen = {STREAM_MAXLEN}\n' if bus_url else ""
    return f"""
[source]
kind = "file"
loop = true
[recognizer]
factory = "subd.testing.recognizer:ScriptedRecognizer"
[pipeline]
tagger = "none"
[server]
port = {port}
[sinks]
enabled = ["sse"]
[sinks.sse]
fanout_workers = {workers}
fanout_priority = {priority}
max_clients = 4096
{bus}"""


def _run_once(tmp: Path, args: argparse.Namespace, bus: bool) -> dict[str, Any]:
    procs = _Procs(tmp)
    py = [sys.executable, "-m", "subd.cli"]
    redis_port = free_port()
    bus_url = f"redis://127.0.0.1:{redis_port}/0" if bus else ""
    try:
        redis = None
        if bus:
            redis = procs.start("redis", ["redis-server", "--port", str(redis_port), "--bind",
                                          "127.0.0.1", "--dir", str(tmp), "--save", "",
                                          "--appendonly", "no", "--daemonize", "no"])
            _set_priority(redis.pid, REDIS_PRIORITY)  # see the module docstring
        port = free_port()
        config = tmp / f"daemon-{'bus' if bus else 'direct'}.toml"
        # bus on, the daemon's own SSE has no clients: no fan-out worker of its own either
        config.write_text(_daemon_config(port, bus_url, 0 if bus else args.workers,
                                         args.fanout_priority))
        daemon = procs.start("daemon", [*py, "run", "--config", str(config)])
        wait_until(lambda: (get_json(port, "/healthz")["channels"]["main"]["last_tick"] or 0) > 0,
                   START_LIMIT_S, "the daemon's first tick")
        servers: list[tuple[subprocess.Popen, int, str]] = []
        if bus:
            for i in range(2):
                edge_port = free_port()
                edge = procs.start(f"edge{i}", [
                    *py, "edge", "--bus", bus_url, "--listen", f"127.0.0.1:{edge_port}",
                    "--fanout-workers", str(args.workers), "--fanout-priority",
                    str(args.fanout_priority), "--max-clients", str(args.clients + 64)])
                servers.append((edge, edge_port, "/c/main/events"))
            for _, edge_port, _ in servers:  # the first request makes it follow the channel
                wait_until(lambda p=edge_port: urllib.request.urlopen(
                    f"http://127.0.0.1:{p}/c/main/overlay", timeout=5).status == 200,
                    START_LIMIT_S, "the edges")
                wait_until(lambda p=edge_port: _first_event(p), START_LIMIT_S, "an edge's events")
        else:
            servers = [(daemon, port, "/c/main/events")] * 2
        # the servers are up (each set its own priority): this process only polls from here,
        # and must never take a core from them at FIFO
        _set_priority(0, 0)

        def last_k() -> int:
            if bus:
                return get_json(servers[0][1], "/healthz")["channels"]["main"]["last_k"]
            return get_json(port, "/healthz")["channels"]["main"]["last_tick"] or 0

        k_start = last_k() + args.warmup
        measured = range(k_start, k_start + args.ticks)
        n_idle = args.clients // 2
        bulks = []
        for _, server_port, path in servers:
            code = (f"from subd.bench.fanout import _bulk_main; _bulk_main({server_port}, "
                    f"{args.clients - n_idle}, {n_idle}, {measured!r}, True, {path!r})")
            bulks.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                          text=True))
        for bulk in bulks:
            assert bulk.stdout is not None
            bulk.stdout.readline()  # "ready"
            _set_priority(bulk.pid, args.reader_priority)  # see the module docstring
        pids = {"daemon": daemon.pid, **{f"edge{i + 1}": p.pid
                                         for i, (p, _, _) in enumerate(servers) if bus}}
        if redis is not None:
            pids["redis"] = redis.pid
        rss_connected = {name: _tree_rss_mb(pid) for name, pid in pids.items()}
        # late releases before the measured ticks: the stream's history when an edge started
        late_before = [get_json(p, "/healthz")["channels"]["main"]["late"]
                       for _, p, _ in servers] if bus else []
        middle = measured.start + len(measured) // 2
        wait_until(lambda: last_k() >= middle, (args.warmup + args.ticks) / 30 + 60, "mid-run")
        rss_middle = {name: _tree_rss_mb(pid) for name, pid in pids.items()}
        # what the edges' write loops take mid-run (the idle clients' buffers still filling)
        fanout = [get_json(p, "/healthz")["channels"]["main"]["fanout"]
                  for _, p, _ in servers] if bus else []
        wait_until(lambda: last_k() >= measured.stop + TAIL_TICKS,
                   (args.warmup + args.ticks) / 30 + 60, "the measured ticks")
        rss_end = {name: _tree_rss_mb(pid) for name, pid in pids.items()}
        xlen = _xlen(redis_port) if bus else 0
        health = [get_json(p, "/healthz")["channels"]["main"] for _, p, _ in servers] if bus else []
        release_p99 = [h["release_p99_ms"] for h in health]
        late = [h["late"] - n for h, n in zip(health, late_before, strict=True)]
        for proc, _, _ in dict.fromkeys(servers):  # closing the servers ends the bulk readers
            procs.stop(proc)
        readers: list[list[int]] = []
        rejoined = shared = 0
        for bulk in bulks:
            out, _ = bulk.communicate(timeout=60)
            got = json.loads(out.strip().splitlines()[-1])
            readers += [r for r in got["errors_ns"] if r]
            rejoined += got["rejoined"]
            shared += got["shared_stamp"]
        every_ms = [e / NS_PER_MS for r in readers for e in r]
        if not every_ms:
            from subd.errors import UserError

            raise UserError("bench edge: no reader received a measured tick")
        return dict(bus=bus, servers=2 if bus else 1, clients=2 * args.clients,
                    readers=len(readers), every_p50_ms=percentile(every_ms, 0.5),
                    every_p99_ms=percentile(every_ms, 0.99), every_max_ms=max(every_ms),
                    worst_p99_ms=max(percentile(r, 0.99) for r in readers) / NS_PER_MS,
                    rss_connected=rss_connected, rss_middle=rss_middle, rss_end=rss_end,
                    xlen=xlen, release_p99=release_p99, late=late, fanout=fanout, shared=shared,
                    rejoined=rejoined, n_events=len(every_ms))
    finally:
        procs.stop_all()
        if args.realtime:  # the next run's servers inherit it, as systemd would grant it
            try_realtime(50)


def _set_priority(pid: int, priority: int) -> bool:
    """SCHED_FIFO ``priority`` for process ``pid`` (0: normal scheduling)."""
    try:
        if priority:
            os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(priority))
        else:
            os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
        return True
    except (PermissionError, OSError):
        return False


def _first_event(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /c/main/events HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while b"\nid: " not in data and b"\r\nid: " not in data:
            chunk = s.recv(65536)
            if not chunk:
                return False
            data += chunk
        return True


def _xlen(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"XLEN subd:{main}:events\r\n")
        return int(s.recv(64).strip().lstrip(b":"))


def run(args: argparse.Namespace) -> int:
    from subd.errors import UserError

    if args.clients < 2 or args.ticks < 60 or args.warmup < 0 or not 0 <= args.workers <= 64 \
            or not 0 <= args.fanout_priority <= 9 or not 0 <= args.reader_priority <= 9:
        raise UserError("edge: need --clients >= 2, --ticks >= 60, --warmup >= 0, --workers "
                        "in 0..64, --fanout-priority and --reader-priority in 0..9")
    if shutil.which("redis-server") is None:
        raise UserError("edge: redis-server is not installed (scripts/install-deps.sh)")
    limit = raise_fd_limit(2 * args.clients + 512)
    if limit < args.clients + 128:
        raise UserError(f"edge: open-file limit {limit} is too low for {args.clients} clients")
    realtime = args.realtime = try_realtime(50)  # inherited by the servers, as systemd grants it
    load_start = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="subd-bench-edge-") as tmp:
        for bus in (True, False):
            rows.append(_run_once(Path(tmp), args, bus))
    load_end = os.getloadavg()
    print(f"subd bench edge: {args.ticks} measured ticks at 30 fps after {args.warmup}, "
          f"{args.clients} clients per edge (half never reading), {args.workers} fan-out "
          f"workers per server at SCHED_FIFO {args.fanout_priority} (0: normal), servers "
          f"SCHED_FIFO={realtime}, readers SCHED_FIFO {args.reader_priority}, "
          f"{os.cpu_count()} CPUs, load average {load_start[0]:.2f} at the start, "
          f"{load_end[0]:.2f} at the end")
    print("publish-time error (ms after due_ns): every event at every reading client, by its "
          "kernel arrival stamp; worst: the p99 of the reader whose p99 is highest. RSS in MB, "
          "each server with its fan-out workers (the daemon with its stage processes):")
    head = ("bus", "servers", "clients", "readers", "all_p50", "all_p99", "all_max",
            "worst_p99", "rejoined", "stream_len", "late_stamp")
    print(" ".join(f"{h:>10}" for h in head))
    for r in rows:
        vals = ("on" if r["bus"] else "off", r["servers"], r["clients"], r["readers"],
                r["every_p50_ms"], r["every_p99_ms"], r["every_max_ms"], r["worst_p99_ms"],
                r["rejoined"], r["xlen"], r["shared"])
        print(" ".join(f"{v:>10.2f}" if isinstance(v, float) else f"{v:>10}" for v in vals))
    for r in rows:
        mem = ", ".join(f"{name} {r['rss_connected'][name]:.0f} -> "
                        f"{r['rss_middle'][name]:.0f} -> {r['rss_end'][name]:.0f}"
                        for name in r["rss_end"])
        print(f"RSS bus {'on' if r['bus'] else 'off'} (connected -> mid-run -> end): {mem}")
    print("the edges' own release error p99 (end of the spin to T(k), ms, last 300 ticks): "
          + ", ".join(f"{v:.3f}" for v in rows[0]["release_p99"] if v is not None)
          + "; ticks released over 2 ms late since the clients connected (late from the bus,"
          " or the loop held): "
          + ", ".join(str(n) for n in rows[0]["late"]))
    writing_ms = 0.0
    for i, shares in enumerate(rows[0]["fanout"]):
        writing_ms += sum(n * us for n, us in shares) / 1000
        print(f"edge{i + 1} fan-out mid-run (clients x us per client in the write loop): "
              + ", ".join(f"{name} {n} x {us:.2f}" for name, (n, us) in zip(
                  ["this process"] + [f"worker {j + 1}" for j in range(len(shares) - 1)],
                  shares, strict=True)))
    print(f"writing to the readers that keep up takes {writing_ms:.2f} ms of CPU a tick over "
          f"both edges: {writing_ms / min(os.cpu_count() or 1, 2 + 2 * args.workers):.2f} ms "
          f"a core if spread perfectly over this host's cores (the last reader's floor)")
    n_all = sum(r["n_events"] for r in rows)
    print(f"late_stamp: events read together with a later one (the reader was a tick behind),"
          f" stamped with the later one's arrival: {sum(r['shared'] for r in rows)} of {n_all}")
    print(f"stream length at the end: {rows[0]['xlen']} entries ([bus] stream_maxlen = "
          f"{STREAM_MAXLEN} here, MAXLEN ~ trims in whole nodes)")
    on, off = rows
    print(f"p99 over all reading clients through the bus: {on['every_p99_ms']:.2f} ms "
          f"(target <= 2 ms: {'met' if on['every_p99_ms'] <= 2 else 'NOT met'}); without it, "
          f"one daemon serving them all: {off['every_p99_ms']:.2f} ms")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("edge", help="viewers through Redis and 2 edges vs one daemon")
    p.add_argument("--clients", type=int, default=1000, help="SSE clients per edge")
    p.add_argument("--ticks", type=int, default=300, help="measured ticks")
    p.add_argument("--warmup", type=int, default=240,
                   help="ticks before the measured ones (8 s): the non-readers' buffers "
                   "fill meanwhile; at ~210 B a tick one is dropped ~18 s after it connects "
                   "(13 s to fill the socket and 16 KB, then 5 s skipped)")
    p.add_argument("--workers", type=int, default=1,
                   help="fan-out worker processes of each server (the edges; bus off, the "
                   "daemon's [sinks.sse] fanout_workers)")
    p.add_argument("--fanout-priority", type=int, default=9,
                   help="the fan-out workers' SCHED_FIFO priority (subd edge --fanout-priority;"
                   " bus off, the daemon's [sinks.sse] fanout_priority); 0: normal")
    p.add_argument("--reader-priority", type=int, default=1,
                   help="SCHED_FIFO priority of the client processes once connected, below "
                   "every server's (0: normal, as bench fanout's)")
    p.set_defaults(func=run)
