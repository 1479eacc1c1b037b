"""SSE wire format and configuration: event encoding, chunk framing, CORS, ``[sinks.sse]``."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from subd.types import CaptionState, Cue
from subd.validate import check_range, from_mapping

NS_PER_MS = 1_000_000
HEARTBEAT = b": hb\n\n"


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
    return {
        "type": "delta",
        "k": state.k,
        "due_ns": state.due_ns,
        "due_unix_ns": unix_ns(state.due_ns),
        "audio_end_ns": state.audio_end_ns,
        "w0": w0,
        "words": words,
        "tentative": state.tentative,
        "cues": cues,
        "fallback": state.fallback,
        "degraded": state.degraded,
    }


def encode_event(k: int, payload: Mapping[str, Any]) -> bytes:
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return b"id: %d\ndata: %s\n\n" % (k, data.encode())


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
