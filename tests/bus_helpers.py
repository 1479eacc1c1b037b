"""A real redis-server, `subd run` daemons and `subd edge` processes for the bus tests, and an SSE
client that records the kernel's arrival time of every event (as bench fanout's probe does)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from daemon_helpers import free_port, wait_for

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
START_LIMIT_S = 120.0


def redis_available() -> bool:
    return shutil.which("redis-server") is not None


@dataclass
class RedisProc:
    """redis-server on a free port in ``directory``; ``aof``: every write fsynced to an
    append-only file, so a restart (even after SIGKILL) loses nothing."""

    directory: Path
    aof: bool = False
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProc:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.directory), "--save", "", "--daemonize", "no"]
        args += ["--appendonly", "yes", "--appendfsync", "always"] if self.aof else \
            ["--appendonly", "no"]
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 - the process keeps it
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()

        def answers() -> bool:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")

        wait_for(answers, 10, "redis-server")
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


FILE_SOURCE = 'kind = "file"\nloop = true'


def daemon_config(bus_url: str, port: int, *, latency_ms: int = 1000, ttl_ms: int = 1500,
                  extra: str = "", source: str = FILE_SOURCE) -> str:
    """One channel "main" (by default on the bundled demo clip) with the scripted recogniser
    (no model)."""
    return f"""
[tick]
latency_ms = {latency_ms}
realtime = false
[source]
{source}
[recognizer]
factory = "subd.testing.recognizer:ScriptedRecognizer"
[pipeline]
tagger = "none"
[server]
port = {port}
[bus]
url = "{bus_url}"
lease_ttl_ms = {ttl_ms}
{extra}
"""


@dataclass
class Proc:
    proc: subprocess.Popen
    log: Path
    port: int

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


def start_subd(tmp: Path, name: str, args: list[str], port: int) -> Proc:
    log = tmp / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "subd.cli", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=dict(os.environ))
    return Proc(proc, log, port)


def start_daemon(tmp: Path, name: str, bus_url: str, **kw) -> Proc:
    port = free_port()
    config = tmp / f"{name}.toml"
    config.write_text(daemon_config(bus_url, port, **kw))
    return start_subd(tmp, name, ["run", "--config", str(config)], port)


def start_edge(tmp: Path, name: str, bus_url: str, port: int | None = None) -> Proc:
    port = port or free_port()
    return start_subd(tmp, name, ["edge", "--bus", bus_url, "--listen", f"127.0.0.1:{port}"],
                      port)


@dataclass(frozen=True, slots=True)
class Event:
    id: int | None
    data: dict
    arrival_ns: int  # kernel receive stamp, on time.monotonic_ns


class SSEClient:
    """Reads ``/c/NAME/events`` (HTTP/1.1, chunked) in a thread; keeps every event with the
    kernel's arrival stamp of the segment that completed it."""

    def __init__(self, port: int, channel: str = "main", last_event_id: int | None = None):
        self.events: list[Event] = []
        self.status = 0
        self.closed = threading.Event()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        head = f"GET /c/{channel}/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        if last_event_id is not None:
            head += f"Last-Event-ID: {last_event_id}\r\n"
        self.sock.sendall((head + "\r\n").encode())
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        offset = time.time_ns() - time.monotonic_ns()
        raw, body, headers_done = b"", b"", False
        space = socket.CMSG_SPACE(16)
        try:
            while True:
                data, anc, _, _ = self.sock.recvmsg(65536, space)
                now = time.monotonic_ns()
                if not data:
                    return
                stamp = now
                for level, kind, value in anc:
                    if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                        sec, nsec = struct.unpack("qq", value[:16])
                        stamp = min(now, sec * 1_000_000_000 + nsec - offset)
                raw += data
                if not headers_done:
                    if b"\r\n\r\n" not in raw:
                        continue
                    head, raw = raw.split(b"\r\n\r\n", 1)
                    self.status = int(head.split(b" ", 2)[1])
                    headers_done = True
                while True:  # de-chunk
                    line_end = raw.find(b"\r\n")
                    if line_end < 0:
                        break
                    size = int(raw[:line_end], 16)
                    if len(raw) < line_end + 2 + size + 2:
                        break
                    body += raw[line_end + 2 : line_end + 2 + size]
                    raw = raw[line_end + 4 + size :]
                *blocks, body = body.split(b"\n\n")
                for block in blocks:
                    self._block(block, stamp)
        except OSError:
            return
        finally:
            self.closed.set()

    def _block(self, block: bytes, stamp: int) -> None:
        event_id, data = None, None
        for line in block.split(b"\n"):
            if line.startswith(b"id: "):
                event_id = int(line[4:])
            elif line.startswith(b"data: "):
                data = json.loads(line[6:])
        if data is not None:
            self.events.append(Event(event_id, data, stamp))

    def wait_for_k(self, k: int, limit_s: float = 30.0) -> None:
        wait_for(lambda: any(e.data["k"] >= k for e in self.events), limit_s,
                 f"tick {k} at the client")

    def last_k(self) -> int:
        return self.events[-1].data["k"] if self.events else -1

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._thread.join(5)


def edge_ready(port: int, channel: str = "main") -> bool:
    """The edge serves the channel (its stream exists): a 200 on its events."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(f"GET /c/{channel}/events HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        s.settimeout(5)
        return s.recv(64).startswith(b"HTTP/1.1 200")


def wait_serving(edge: Proc, limit_s: float = START_LIMIT_S) -> None:
    wait_for(lambda: edge_ready(edge.port), limit_s, "the edge serving channel main",
             edge.proc, edge.log)


def words_by_index(events: list[Event]) -> dict[int, str]:
    """Global word index -> text, over the delta and full events received."""
    out: dict[int, str] = {}
    for e in events:
        for i, word in enumerate(e.data["words"]):
            out[e.data["w0"] + i] = word[0]
    return out
