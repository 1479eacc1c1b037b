"""Server-Sent Events sink: ``GET /events`` streams one event per tick.

Wire format (UTF-8, one event per tick, ``id`` = tick k)::

    retry: 1000\\n\\n                                  (once, on connect)
    id: 42\\ndata: {"type":"delta","k":42,...}\\n\\n       (every tick)
    : hb\\n\\n                                         (heartbeat when no tick was sent)

``delta`` events carry the words committed at the tick (``words`` as [text, start_ns, end_ns],
global index of the first in ``w0``), the tentative tail, cues closed at the tick and
``due_ns``/``audio_end_ns``. A ``full`` event (on connect, or when a reconnect's
``Last-Event-ID`` is older than the bounded history, or after a client was skipped forward)
carries the latest ``resync_words`` committed words and recent cues instead.

Fan-out never waits for a client: each event is encoded once, then written to every socket
without awaiting. A client whose unsent bytes exceed ``client_buffer_bytes`` is skipped (its
events dropped, a ``full`` resync sent when it catches up); one stalled for ``drop_after_ms`` is
disconnected. So a client that does not read costs bounded memory and never delays others.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.http import HttpVersion11

from subd.layout import CueLayout, LayoutConfig, token_of
from subd.sinks._config import check_range, from_mapping
from subd.tasks import cancel_and_wait
from subd.types import CaptionState, Cue

log = logging.getLogger(__name__)
NS_PER_MS = 1_000_000
HEARTBEAT = b": hb\n\n"


@dataclass(frozen=True, slots=True)
class SSEConfig:
    host: str = ""  # "" = no own server: the daemon mounts /events (subd.http.add_routes)
    port: int = 8080  # 0 = any free port (tests)
    retry_ms: int = 1000
    heartbeat_ms: int = 15000
    history_ticks: int = 300  # replay window for Last-Event-ID (10 s at 30 fps)
    resync_words: int = 200  # committed words carried by a full-state resync
    client_buffer_bytes: int = 16384  # unsent bytes per client before it is skipped forward
    drop_after_ms: int = 5000  # a client skipped for this long is disconnected
    max_clients: int = 4096
    socket_sndbuf_bytes: int = 32768  # kernel send buffer per client (0: system default); a
    # small one makes a non-reading client cheap to skip soon and bounds kernel memory
    cors_origins: tuple[str, ...] = ()  # allowed Origin values; "*" allows any
    latency_ms: int = 0  # the daemon's D: lets the overlay map audio time to capture time
    layout: LayoutConfig = field(default_factory=LayoutConfig)
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
        check_range(s, "socket_sndbuf_bytes", self.socket_sndbuf_bytes, 0, 64 << 20)
        check_range(s, "latency_ms", self.latency_ms, 0, 600_000)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], section: str = "sinks.sse") -> SSEConfig:
        return from_mapping(cls, section, data, section=section)


def encode_event(k: int, payload: Mapping[str, Any]) -> bytes:
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return b"id: %d\ndata: %s\n\n" % (k, data.encode())


def chunk(data: bytes) -> bytes:
    """HTTP/1.1 chunked framing (the response is chunked: it has no length)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def cue_json(cue: Cue) -> list[Any]:
    return [cue.index, cue.start_ns, cue.end_ns, list(cue.lines)]


class _Client:
    __slots__ = ("transport", "chunked", "done", "stalled_ns", "resync", "last_write_ns")

    def __init__(self, transport: asyncio.Transport, chunked: bool, now_ns: int) -> None:
        self.transport = transport
        self.chunked = chunked
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.stalled_ns: int | None = None
        self.resync = False
        self.last_write_ns = now_ns

    def finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


class SSESink:
    name = "sse"

    def __init__(
        self, config: SSEConfig | None = None, *, clock: Callable[[], int] = time.monotonic_ns
    ) -> None:
        self.config = config or SSEConfig()
        self._clock = clock
        self._layout = CueLayout(self.config.layout)
        self._history: deque[tuple[int, bytes]] = deque(maxlen=self.config.history_ticks)
        self._words: deque[list[Any]] = deque(maxlen=self.config.resync_words)
        self._cues: deque[list[Any]] = deque(maxlen=4)
        self._n_words = 0
        self._last: CaptionState | None = None
        self._full: bytes | None = None  # cached full event for the current tick
        self._clients: dict[_Client, None] = {}  # insertion-ordered set
        self._heartbeat: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self.n_skipped = 0  # events not sent to a slow client
        self.n_dropped = 0  # clients disconnected for not reading

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SSESink:
        return cls(SSEConfig.from_mapping(data))

    @property
    def n_clients(self) -> int:
        return len(self._clients)

    def buffered_bytes(self) -> int:
        """Bytes queued in user space for all clients (bounded by the fan-out policy)."""
        return sum(c.transport.get_write_buffer_size() for c in self._clients)

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self._heartbeat = asyncio.create_task(self._heartbeats(), name="sse-heartbeat")
        if self.config.host:
            from subd.http import make_app

            self._runner = web.AppRunner(make_app(self), access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.config.host, self.config.port)
            await site.start()
            server = site._server  # noqa: SLF001 - the bound port when port = 0
            self.port = server.sockets[0].getsockname()[1] if server else self.config.port
            log.info("SSE on http://%s:%d/events", self.config.host, self.port)

    async def close(self) -> None:
        await cancel_and_wait(self._heartbeat)
        for client in list(self._clients):
            client.finish()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- publishing (event loop, never blocks) -----------------------------------------

    def publish(self, state: CaptionState) -> None:
        closed = self._layout.push(state.committed, state.audio_end_ns, state.tentative)
        words = [[w.text, w.start_ns, w.end_ns] for w in map(token_of, state.committed)]
        cues = [cue_json(c) for c in closed]
        payload = {
            "type": "delta",
            "k": state.k,
            "due_ns": state.due_ns,
            "audio_end_ns": state.audio_end_ns,
            "w0": self._n_words,
            "words": words,
            "tentative": state.tentative,
            "cues": cues,
            "fallback": state.fallback,
            "degraded": state.degraded,
        }
        event = encode_event(state.k, payload)
        self._history.append((state.k, event))
        self._words.extend(words)
        self._cues.extend(cues)
        self._n_words += len(words)
        self._last = state
        self._full = None
        framed = chunk(event)
        now = self._clock()
        limit = self.config.client_buffer_bytes
        lagging = []
        # Clients that keep up are served first, in one tight loop; the rest (stalled, due a
        # resync, closing, HTTP/1.0) after them, so a slow client never delays a reader.
        for client in self._clients:
            transport = client.transport
            if (
                client.stalled_ns is None
                and client.chunked
                and not client.resync
                and transport.get_write_buffer_size() <= limit
                and not transport.is_closing()
            ):
                transport.write(framed)
                client.last_write_ns = now
            else:
                lagging.append(client)
        for client in lagging:
            self._offer(client, event, framed, now)

    def _offer(self, client: _Client, event: bytes, framed: bytes, now: int) -> None:
        transport = client.transport
        if transport.is_closing():
            self._remove(client)
            return
        if transport.get_write_buffer_size() > self.config.client_buffer_bytes:
            self.n_skipped += 1
            if client.stalled_ns is None:
                client.stalled_ns = now
                client.resync = True
            elif now - client.stalled_ns > self.config.drop_after_ms * NS_PER_MS:
                self.n_dropped += 1
                log.info("SSE client dropped: not reading for %d ms", self.config.drop_after_ms)
                transport.abort()  # unsent bytes are discarded: memory is freed now
                self._remove(client)
            return
        client.stalled_ns = None
        if client.resync:
            client.resync = False
            event = self.full_event()
            framed = chunk(event)
        transport.write(framed if client.chunked else event)
        client.last_write_ns = now

    def _remove(self, client: _Client) -> None:
        self._clients.pop(client, None)
        client.finish()

    def full_event(self) -> bytes:
        """The full-state resync event for the latest tick (cached per tick)."""
        if self._full is None:
            state = self._last
            if state is None:
                return b""
            payload = {
                "type": "full",
                "k": state.k,
                "due_ns": state.due_ns,
                "audio_end_ns": state.audio_end_ns,
                "latency_ns": self.config.latency_ms * NS_PER_MS,
                "w0": self._n_words - len(self._words),
                "words": list(self._words),
                "tentative": state.tentative,
                "cues": list(self._cues),
                "fallback": state.fallback,
                "degraded": state.degraded,
            }
            self._full = encode_event(state.k, payload)
        return self._full

    def catch_up(self, last_event_id: int | None) -> bytes:
        """What a (re)connecting client gets after ``retry:``: a replay or a full resync."""
        if self._last is None:
            return b""
        if last_event_id is not None and self._history:
            oldest = self._history[0][0]
            if oldest <= last_event_id + 1 and last_event_id <= self._last.k:
                return b"".join(e for k, e in self._history if k > last_event_id)
        return self.full_event()

    async def _heartbeats(self) -> None:
        period_s = self.config.heartbeat_ms / 1000
        while True:
            await asyncio.sleep(min(period_s, self.config.drop_after_ms / 1000) / 2)
            now = self._clock()
            for client in list(self._clients):
                if client.transport.is_closing():
                    self._remove(client)
                elif now - client.last_write_ns >= self.config.heartbeat_ms * NS_PER_MS:
                    framed = chunk(HEARTBEAT) if client.chunked else HEARTBEAT
                    self._offer(client, HEARTBEAT, framed, now)

    # -- HTTP ----------------------------------------------------------------------------

    def _cors(self, request: web.Request) -> dict[str, str] | None:
        """CORS headers for an allowed (or absent/same-host) Origin; None if refused."""
        origin = request.headers.get("Origin")
        if origin is None:
            return {}
        allowed = self.config.cors_origins
        same_host = origin.split("://", 1)[-1] == request.host
        if "*" in allowed or origin in allowed or same_host:
            return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        return None

    async def handle_options(self, request: web.Request) -> web.Response:
        cors = self._cors(request)
        if cors is None:
            return web.Response(status=403, text="origin not allowed\n")
        cors["Access-Control-Allow-Methods"] = "GET, OPTIONS"
        cors["Access-Control-Allow-Headers"] = "Last-Event-ID, Cache-Control"
        return web.Response(status=204, headers=cors)

    async def handle_events(self, request: web.Request) -> web.StreamResponse:
        cors = self._cors(request)
        if cors is None:
            origin = request.headers.get("Origin", "")
            return web.Response(status=403, text=f"origin {origin!r} not allowed\n")
        if len(self._clients) >= self.config.max_clients:
            return web.Response(status=503, text="too many event clients\n")
        headers = {
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            **cors,
        }
        resp = web.StreamResponse(status=200, headers=headers)
        chunked = request.version >= HttpVersion11
        if chunked:
            resp.enable_chunked_encoding()
        else:
            resp.force_close()
        await resp.prepare(request)
        transport = request.transport
        if transport is None or transport.is_closing():
            return resp
        raw_id = request.headers.get("Last-Event-ID") or request.query.get("lastEventId")
        last_id = int(raw_id) if raw_id and raw_id.strip().isdigit() else None
        # From here to the first write nothing awaits, so no tick can slip in between.
        if self.config.socket_sndbuf_bytes:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF,
                                self.config.socket_sndbuf_bytes)
        client = _Client(transport, chunked, self._clock())  # type: ignore[arg-type]
        self._clients[client] = None
        try:
            await resp.write(b"retry: %d\n\n" % self.config.retry_ms + self.catch_up(last_id))
            await client.done
        finally:
            self._clients.pop(client, None)
        return resp

