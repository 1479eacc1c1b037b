"""The rig of ``subd bench chaos``: the real daemon (``subd run``) with two channels, what feeds
and watches it (an HTTP pusher, SSE readers that reconnect, a notify socket standing in for
systemd, RSS sampling), and where its processes are found.

Everything here observes the daemon from outside, as an operator's tools would.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from subd.bench.netutil import get_json

LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox")
CLIP_A = LIBRIVOX / "sense_and_sensibility_01_austen_64kb-0880.wav"
CLIP_B = LIBRIVOX / "sense_and_sensibility_01_austen_64kb-0930.wav"
TOKEN = "chaos-bench-push-token-0123"
WATCHDOG_S = 10  # as the shipped units' WatchdogSec
LATENCY_MS = 2000


def config_text(work: Path, port: int, latency_ms: int = LATENCY_MS, spare: bool = True) -> str:
    return f"""
[recognizer]
spare_process = {"true" if spare else "false"}
[tick]
latency_ms = {latency_ms}
max_latency_ms = 4000
[server]
port = {port}
push_token = "{TOKEN}"
[sinks]
enabled = ["srt", "sse"]
[sinks.sse]
fanout_workers = 1
[channels.file.source]
kind = "file"
path = "{work}/file.wav"
loop = true
[channels.file.sinks.srt]
directory = "{work}/srt-file"
[channels.file.events]
path = "{work}/file.jsonl"
[channels.push.source]
kind = "http"
quiet_after_ms = 3000
[channels.push.sinks.srt]
directory = "{work}/srt-push"
[channels.push.events]
path = "{work}/push.jsonl"
"""


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    kids = [int(c) for c in fh.read().split()]
                out += kids
                todo += kids
        except OSError:
            continue
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def rss_mb(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as fh:
                total += next(int(line.split()[1]) for line in fh
                              if line.startswith("VmRSS:")) / 1024
        except (OSError, StopIteration):
            pass
    return total


class Daemon:
    """``subd run`` as a subprocess; started again (and counted) if it ever exits."""

    def __init__(self, work: Path, port: int, notify_path: Path, spare: bool) -> None:
        self.work, self.port, self.spare = work, port, spare
        self.config = work / "subd.toml"
        self.config.write_text(config_text(work, port, spare=spare))
        self.log = open(work / "daemon.log", "ab")  # noqa: SIM115 - the daemon's lifetime
        self.env = {**os.environ, "NOTIFY_SOCKET": str(notify_path),
                    "WATCHDOG_USEC": str(WATCHDOG_S * 1_000_000), "PYTHONUNBUFFERED": "1"}
        self.exits: list[tuple[float, int]] = []
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "subd.cli", "run", "--config",
                                 str(self.config)], stdout=self.log, stderr=subprocess.STDOUT,
                                env=self.env)

    def check(self) -> None:
        code = self.proc.poll()
        if code is not None:
            self.exits.append((time.monotonic(), code))
            self.proc = self._spawn()

    def stage_pid(self, stage: str) -> int | None:
        try:
            return get_json(self.port, "/healthz")["stages"][stage]["pid"]
        except (OSError, KeyError, ValueError):
            return None

    def fanout_pids(self) -> list[int]:
        return [p for p in descendants(self.proc.pid) if "sse/worker.py" in cmdline(p)]

    def rss_mb(self) -> float:
        return rss_mb([self.proc.pid, *descendants(self.proc.pid)])

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        finally:
            self.log.close()


@dataclass
class Notify:
    """systemd's side of NOTIFY_SOCKET: the times of READY=1 and every WATCHDOG=1."""

    path: Path
    pings: list[float] = field(default_factory=list)
    ready_at: float | None = None

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        # a --keep directory of an earlier run still holds its socket file (bind: EADDRINUSE)
        self.path.unlink(missing_ok=True)
        self.sock.bind(str(self.path))
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self.sock.recv(65536).decode()
            except TimeoutError:
                continue
            except OSError:
                return
            now = time.monotonic()
            if "READY=1" in msg.split("\n") and self.ready_at is None:
                self.ready_at = now
            if "WATCHDOG=1" in msg.split("\n"):
                self.pings.append(now)

    def longest_gap_s(self, until: float) -> float:
        """The longest time without a ping since READY=1 (what systemd's watchdog measures)."""
        if self.ready_at is None:
            return float("inf")
        times = [self.ready_at, *[p for p in self.pings if p >= self.ready_at], until]
        return max(b - a for a, b in zip(times, times[1:], strict=False))

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


class Pusher:
    """Pushes a clip, looped, as s16le PCM in 100 ms requests at real time; can pause."""

    def __init__(self, port: int, clip: Path) -> None:
        import soundfile as sf

        audio, _ = sf.read(str(clip), dtype="int16")
        self.pcm = np.asarray(audio).tobytes()
        self._looped = self.pcm * 2  # a request may run over the clip's end
        self.port = port
        self.paused_until = 0.0
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        step, pos, t0 = 3200, 0, time.monotonic()
        sent = 0
        while not self._stop.is_set():
            if time.monotonic() < self.paused_until:
                time.sleep(0.05)
                t0, sent = time.monotonic(), 0  # resume at real time, not in a burst
                continue
            data = self._looped[pos:pos + step]
            pos = (pos + step) % len(self.pcm)
            req = urllib.request.Request(
                f"http://127.0.0.1:{self.port}/c/push/push", data=data, method="POST",
                headers={"Authorization": f"Bearer {TOKEN}"})
            try:
                urllib.request.urlopen(req, timeout=5).close()
            except OSError:
                pass  # the daemon is starting, or was restarted: keep pacing
            sent += step
            time.sleep(max(0.0, t0 + sent / 32000 - time.monotonic()))

    def pause(self, seconds: float) -> None:
        self.paused_until = time.monotonic() + seconds

    def close(self) -> None:
        self._stop.set()


class Reader:
    """An SSE client of one channel that reconnects with Last-Event-ID. Records the closed
    cues it was sent (by index) and when each committed word arrived."""

    def __init__(self, port: int, channel: str) -> None:
        self.port, self.channel = port, channel
        self.cues: dict[int, tuple[int, str]] = {}  # index -> (start ms, text)
        self.words: list[tuple[float, int]] = []  # (arrival monotonic s, word start ns)
        self.audio_end_ns = 0
        self.last_id: str | None = None
        self.reconnects = 0
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            headers = {"Last-Event-ID": self.last_id} if self.last_id else {}
            req = urllib.request.Request(
                f"http://127.0.0.1:{self.port}/c/{self.channel}/events", headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    for raw in resp:
                        if self._stop.is_set():
                            return
                        self._line(raw.decode(errors="replace").rstrip("\n"))
            except OSError:
                pass
            self.reconnects += 1
            time.sleep(0.2)

    def _line(self, line: str) -> None:
        if line.startswith("id: "):
            self.last_id = line[4:]
        elif line.startswith("data: "):
            event = json.loads(line[6:])
            now = time.monotonic()
            self.audio_end_ns = max(self.audio_end_ns, event.get("audio_end_ns", 0))
            for _, start_ns, _ in event.get("words", []) if event["type"] == "delta" else ():
                self.words.append((now, start_ns))
            for index, start_ns, _end_ns, lines in event.get("cues", []):
                self.cues[index] = (start_ns // 1_000_000, "\n".join(lines))

    def close(self) -> None:
        self._stop.set()


def idle_clients(port: int, channel: str, n: int) -> list[socket.socket]:
    """SSE clients that connect and never read (a stalled viewer): the daemon must drop them
    without delaying anyone."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(f"GET /c/{channel}/events HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        socks.append(s)
    return socks
