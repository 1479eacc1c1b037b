"""SSE wire format and configuration: event encoding, chunk framing, CORS, ``[sinks.sse]``, and
:class:`TickEvent`, the buffer a tick's ``delta`` event is encoded into once, in its slot."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from subd.layout.cues import token_of
from subd.types import CaptionState, Cue
from subd.validate import check_range, from_mapping

NS_PER_MS = 1_000_000
HEARTBEAT = b": hb\n\n"
TICK_EVENT_BYTES = 1024  # a tick event's buffer to start with (most are 200-600 bytes)


@dataclass(frozen=True, slots=True)
class SSEConfig:
    host: str = ""  # "" = no own server: the daemon mounts /events (subd.server.app.add_routes)
    port: int = 8080  # 0 = any free port (tests)
    retry_ms: int = 1000
    heartbeat_ms: int = 15000
    history_ticks: int = 300  # replay window for Last-Event-ID (10 s at 30 fps)
    resync_words: int = 200  # committed words carried by a full-state resync
    client_buffer_bytes: int = 16384  # unsent bytes per client before it is skipped forward
    drop_after_ms: int = 5000  # a client skipped for this long is disconnected
    max_clients: int = 4096
    fanout_workers: int = 0  # extra processes writing to clients (0: all from this one); a
    # send costs ~4 us of kernel time, so 500 readers take ~2 ms from one core
    fanout_priority: int = 0  # the workers' SCHED_FIFO priority (0: normal scheduling); below
    # the publisher's 10, so they never delay it, and above any normal process, so neither
    # the readers' wake-ups nor other load can hold a tick back (see worker.main)
    socket_sndbuf_bytes: int = 32768  # kernel send buffer per client (0: system default); a
    # small one makes a non-reading client cheap to skip soon and bounds kernel memory
    cors_origins: tuple[str, ...] = ()  # allowed Origin values; "*" allows any
    latency_ms: int = 0  # the daemon's D: lets the overlay map audio time to capture time
    section: str = "sinks.sse"

    def __post_init__(self) -> None:
        s = self.section
        check_range(s, "port", self.port, 0, 65535)
        check_range(s, "retry_ms", self.retry_ms, 100, 600_000)
        check_range(s, "heartbeat_ms", self.heartbeat_ms, 100, 600_000)
        check_range(s, "history_ticks", self.history_ticks, 1, 1_000_000)
        check_range(s, "resync_words", self.resync_words, 1, 100_000)
        check_range(s, "client_buffer_bytes", self.client_buffer_bytes, 1024, 64 << 20)
        check_range(s, "drop_after_ms", self.drop_after_ms, 100, 3_600_000)
        check_range(s, "max_clients", self.max_clients, 1, 1_000_000)
        check_range(s, "fanout_workers", self.fanout_workers, 0, 64)
        check_range(s, "fanout_priority", self.fanout_priority, 0, 9)
        check_range(s, "socket_sndbuf_bytes", self.socket_sndbuf_bytes, 0, 64 << 20)
        check_range(s, "latency_ms", self.latency_ms, 0, 600_000)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], section: str = "sinks.sse") -> SSEConfig:
        return from_mapping(cls, section, data, section=section)


def unix_ns(monotonic_ns: int) -> int:
    """The CLOCK_REALTIME time (NTP/PTP-disciplined: the clock every machine shares) of the
    instant that is ``monotonic_ns`` on this host's monotonic clock."""
    return monotonic_ns + time.time_ns() - time.monotonic_ns()


def monotonic_of(unix_time_ns: int) -> int:
    """This host's monotonic time of the instant that is ``unix_time_ns`` on CLOCK_REALTIME."""
    return unix_time_ns - time.time_ns() + time.monotonic_ns()


def delta_payload(state: CaptionState, w0: int, words: list[list[Any]],
                  cues: list[list[Any]]) -> dict[str, Any]:
    """A ``delta`` event: ``due_ns`` on the writing host's monotonic clock, ``due_unix_ns`` the
    same instant on CLOCK_REALTIME (what an edge on another machine releases it by)."""
    return _payload("delta", state, {}, w0, words, cues)


def full_payload(state: CaptionState, latency_ns: int, w0: int, words: list[list[Any]],
                 cues: list[list[Any]]) -> dict[str, Any]:
    """A ``full`` resync event: the latest ``words`` (the first one's index ``w0``) and cues."""
    return _payload("full", state, {"latency_ns": latency_ns}, w0, words, cues)


def _payload(kind: str, state: CaptionState, extra: dict[str, Any], w0: int,
             words: list[list[Any]], cues: list[list[Any]]) -> dict[str, Any]:
    # the keys' order is the wire format's (clients and edges may compare bytes)
    return {"type": kind, "k": state.k, "due_ns": state.due_ns,
            "due_unix_ns": unix_ns(state.due_ns), "audio_end_ns": state.audio_end_ns, **extra,
            "w0": w0, "words": words, "tentative": state.tentative, "cues": cues,
            "fallback": state.fallback, "degraded": state.degraded}


def delta_rows(state: CaptionState) -> tuple[list[list[Any]], list[list[Any]]]:
    """A tick's committed words and closed cues as a ``delta`` event carries them: a word is
    ``[text, start_ns, end_ns]``, and ``[text, start_ns, end_ns, 1]`` for the rest of the word
    before it (``Word.joined``: shown without a space)."""
    words = [[w.text, w.start_ns, w.end_ns, *((1,) if w.glue_before else ())]
             for w in map(token_of, state.committed)]
    return words, [cue_json(c) for c in state.cues if c.committed]  # laid out by the pipeline


def _json(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def encode_event(k: int, payload: Mapping[str, Any]) -> bytes:
    return b"id: %d\ndata: %s\n\n" % (k, _json(payload))


class TickEvent:
    """Tick k's ``delta`` event, encoded once (by the pipeline, at T(k) − prepare, into tick
    k's slot) and written by every SSE sink of the channel.

    The bytes are kept framed as one HTTP/1.1 chunk, ``<size>\\r\\n<event>\\r\\n``, in a
    buffer made once: :attr:`framed` (HTTP/1.1 clients, fan-out workers) and :attr:`event`
    (HTTP/1.0 clients, the replay history) are views of it, valid until the buffer is encoded
    again (its slot's next tick, N ticks on): a sink that keeps bytes longer (the replay
    history, a client's unsent backlog) copies them. The buffer grows only for an event longer
    than any before it, by replacing it (a bytearray with views out cannot be resized, and
    views still out keep the old one). ``w0`` is the channel's index of the tick's first
    word, the same for every sink: the count of words published before the tick.
    """

    __slots__ = ("state", "w0", "words", "cues", "buffer", "n_encoded", "n_grown", "_view",
                 "_start", "_stop", "_n")

    def __init__(self, n_bytes: int = TICK_EVENT_BYTES) -> None:
        self.buffer = bytearray(n_bytes)
        self._view = memoryview(self.buffer)
        self.n_encoded = 0  # ticks encoded into this buffer
        self.n_grown = 0  # times the buffer was replaced by a larger one
        self.clear()

    def clear(self) -> None:
        """Nothing held for a tick (the bytes stay: views handed out are still valid)."""
        self.state: CaptionState | None = None
        self.w0 = 0
        self.words: Sequence[list[Any]] = ()  # no allocation: the ring calls this every tick
        self.cues: Sequence[list[Any]] = ()
        self._start = self._stop = self._n = 0

    @property
    def k(self) -> int:
        return self.state.k if self.state is not None else -1

    @property
    def event(self) -> memoryview:
        return self._view[self._start:self._stop]

    @property
    def framed(self) -> memoryview:
        return self._view[:self._n]

    def encode(self, state: CaptionState, w0: int) -> None:
        """``state`` as a ``delta`` event whose first word has index ``w0``, byte for byte what
        ``chunk(encode_event(...))`` makes."""
        words, cues = delta_rows(state)
        data = _json(delta_payload(state, w0, words, cues))
        head = b"id: %d\ndata: " % state.k
        n_event = len(head) + len(data) + 2
        size = b"%x\r\n" % n_event
        start = len(size)
        n = start + n_event + 2
        if n > len(self.buffer):
            self.buffer = bytearray(max(n, 2 * len(self.buffer)))
            self._view = memoryview(self.buffer)
            self.n_grown += 1
        buf = self.buffer  # slice assignments of equal length: never a resize
        buf[:start] = size
        i = start + len(head)
        buf[start:i] = head
        j = i + len(data)
        buf[i:j] = data
        buf[j:n] = b"\n\n\r\n"
        self.state, self.w0, self.words, self.cues = state, w0, words, cues
        self._start, self._stop, self._n = start, n - 2, n
        self.n_encoded += 1


def chunk(data: bytes) -> bytes:
    """HTTP/1.1 chunked framing (the response is chunked: it has no length)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def cue_json(cue: Cue) -> list[Any]:
    return [cue.index, cue.start_ns, cue.end_ns, list(cue.lines)]


def cors_headers(allowed: tuple[str, ...], request: web.Request) -> dict[str, str] | None:
    """CORS headers for an allowed (or absent/same-host) Origin; None if refused."""
    origin = request.headers.get("Origin")
    if origin is None:
        return {}
    same_host = origin.split("://", 1)[-1] == request.host
    if "*" in allowed or origin in allowed or same_host:
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
    return None


def options_response(allowed: tuple[str, ...], request: web.Request) -> web.Response:
    """The CORS preflight answer for ``OPTIONS /events``."""
    cors = cors_headers(allowed, request)
    if cors is None:
        return web.Response(status=403, text="origin not allowed\n")
    cors["Access-Control-Allow-Methods"] = "GET, OPTIONS"
    cors["Access-Control-Allow-Headers"] = "Last-Event-ID, Cache-Control"
    return web.Response(status=204, headers=cors)


def set_sndbuf(transport: asyncio.BaseTransport, n_bytes: int) -> None:
    """A small kernel send buffer makes a non-reading client cheap to skip, and bounded."""
    sock = transport.get_extra_info("socket")
    if n_bytes and sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, n_bytes)
