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

Fan-out never waits for a client: each event is encoded once (in the daemon by the pipeline,
into the tick's slot, for every SSE sink of the channel: ``prepare_event``), then written to
every socket without awaiting. A client whose unsent bytes exceed ``client_buffer_bytes`` is
skipped (its events dropped, a ``full`` resync sent when it catches up); one stalled for
``drop_after_ms`` is disconnected. So a client that does not read costs bounded memory and never
delays others.

With ``fanout_workers`` > 0, processes (:mod:`subd.sinks.sse.worker`) share the writing, in
parallel with this one, same policy everywhere. Shares are balanced by measured time, not by
count: each process times its tight write loop per client (measured: a worker 3.6-4.4 us, this
one 0.6-0.9 us more, for asyncio's transports); a new client goes where it would be written
first, and while this process's loop would still end later than a worker's after giving one
client away, it hands one over per tick (``_rebalance``). The last reader of each process is
then written at about the same moment, which is the fan-out's latency.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http import HttpVersion11

from subd.sinks.sse.clients import (  # noqa: F401 - quickest: named by tests
    FanoutBalance,
    _Client,
    _write_now,
    quickest,
)
from subd.sinks.sse.link import WorkerLink
from subd.sinks.sse.wire import (
    HEARTBEAT,
    NS_PER_MS,
    SSEConfig,
    TickEvent,
    chunk,
    cors_headers,
    delta_payload,
    delta_rows,
    encode_event,
    full_payload,
    options_response,
    set_sndbuf,
)
from subd.sinks.sse.worker import moving_average, reset_on_close
from subd.tasks import cancel_and_wait, start_task
from subd.types import CaptionState

log = logging.getLogger(__name__)
RETIRE_PER_TURN = 16
MAX_HOLD_NS = 50_000_000  # a prepared tick is held by the workers at most this long


@dataclass(frozen=True, slots=True)
class _Prepared:
    """Tick k encoded at the look-ahead (bytes, or views of its slot's buffer), written at T(k)."""

    state: CaptionState
    event: bytes | memoryview
    framed: bytes | memoryview
    words: list[list[Any]]
    cues: list[list[Any]]


class SSESink(FanoutBalance):
    name = "sse"

    def __init__(
        self, config: SSEConfig | None = None, *, clock: Callable[[], int] = time.monotonic_ns
    ) -> None:
        self.config = config or SSEConfig()
        self._clock = clock
        self._history: deque[tuple[int, bytes]] = deque(maxlen=self.config.history_ticks)
        self._words: deque[list[Any]] = deque(maxlen=self.config.resync_words)
        self._cues: deque[list[Any]] = deque(maxlen=4)
        self._n_words = 0
        self._last: CaptionState | None = None
        self._full: bytes | None = None  # cached full event for the current tick
        self._prepared: _Prepared | None = None  # tick encoded by prepare(), not published yet
        self._handoffs: deque[_Client] = deque()  # clients to hand over once it is published
        self._clients: dict[_Client, None] = {}  # insertion-ordered set, written here
        self._remote: dict[int, _Client] = {}  # client id -> client, written by a worker
        self._links: list[WorkerLink] = []
        self._failed: list[WorkerLink] = []  # reaped on close
        self._link_deaths: list[float] = []  # monotonic s of recent fan-out worker deaths
        self._retiring: deque[tuple[_Client, bool]] = deque()  # (client, dropped), see _retire
        self._next_id = 0
        self._heartbeat: asyncio.Task[None] | None = None
        self._n_skipped = 0
        self.n_dropped = 0  # clients disconnected for not reading
        self._n_fast = 0  # clients in the latest tight write loop here
        self._send_ns = 0.0  # its time per client, moving average (0: not measured yet)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SSESink:
        return cls(SSEConfig.from_mapping(data))

    @property
    def n_clients(self) -> int:
        return len(self._clients) + len(self._remote)

    @property
    def n_worker_clients(self) -> int:
        """Clients written to by fan-out worker processes (the rest by this one)."""
        return len(self._remote)

    @property
    def worker_pids(self) -> list[int]:
        return [link.proc.pid for link in self._links]

    @property
    def fanout_shares(self) -> list[tuple[int, float]]:
        """(clients, us per client) of the latest tight write loop: this process, then each
        worker as it last reported."""
        return [(self._n_fast, self._send_ns / 1000),
                *((link.n_fast, link.send_ns / 1000) for link in self._links)]

    @property
    def n_skipped(self) -> int:
        """Events not sent to a slow client (workers' counts as last reported)."""
        return self._n_skipped + sum(link.n_skipped for link in self._links)

    def buffered_bytes(self) -> int:
        """Bytes queued in user space for all clients (bounded by the fan-out policy)."""
        local = sum(c.transport.get_write_buffer_size() for c in self._clients)
        return local + sum(link.buffered_bytes for link in self._links)

    # -- lifecycle ---------------------------------------------------------------------

    def _new_link(self) -> WorkerLink:
        cfg = self.config
        return WorkerLink(client_buffer_bytes=cfg.client_buffer_bytes, priority=cfg.fanout_priority,
                          drop_after_ms=cfg.drop_after_ms, heartbeat_ms=cfg.heartbeat_ms,
                          on_gone=self._gone, on_fail=self._link_failed)

    async def start(self) -> None:
        self._links = [self._new_link() for _ in range(self.config.fanout_workers)]
        for link in list(self._links):
            await link.wait_ready()  # a failed one is logged and left out: this one serves
        self._heartbeat = start_task(self._heartbeats(), "sse-heartbeat")

    async def close(self) -> None:
        await cancel_and_wait(self._heartbeat)
        for link in [*self._links, *self._failed]:  # workers first: no write after the last chunk
            await link.close()
        self._links, self._failed = [], []
        for client in [*self._clients, *self._remote.values(), *(c for c, _ in self._retiring)]:
            client.finish()

    # -- publishing (event loop, never blocks) -----------------------------------------

    def prepare(self, state: CaptionState) -> None:
        """At the look-ahead (T(k) - 4 ms): encode tick k, and send it to the fan-out
        workers, which write it at T(k) themselves. ``publish`` then only writes."""
        self._take(state, None)

    def prepare_event(self, tick: TickEvent) -> None:
        """``prepare``, with tick k as the pipeline encoded it once in its slot, for every
        SSE sink of the channel. Its word index is the channel's: a sink present from the
        first tick counts the same; one built by a reload takes it up (as an edge does)."""
        self._take(tick.state, tick)

    def _take(self, state: CaptionState, tick: TickEvent | None) -> None:
        if self._prepared is not None:  # prepared and never published: it goes out now
            self.publish(self._prepared.state)
        if tick is not None:
            self._n_words = tick.w0
        self._prepared = prepared = self._encode(state) if tick is None else \
            _Prepared(state, tick.event, tick.framed, tick.words, tick.cues)
        now = self._clock()
        if self._links:
            # the workers' release time is on the monotonic clock; a test's fake clock gives
            # a bounded hold only
            hold_ns = min(max(state.due_ns - now, 0), MAX_HOLD_NS)
            release_ns = time.monotonic_ns() + hold_ns if hold_ns else 0
            for link in self._links:
                link.tick(now, prepared.framed, release_ns)

    def publish(self, state: CaptionState) -> None:
        """At T(k): write tick k (encoded by ``prepare``, or now if it was not) to the clients
        of this process; clients handed over meanwhile go to their workers afterwards."""
        prepared = self._prepared
        if prepared is None or prepared.state.k != state.k:
            if prepared is not None:
                self.publish(prepared.state)
            prepared = self._encode(state)
            for link in self._links:
                link.tick(self._clock(), prepared.framed)
        self._prepared = None
        event, framed = prepared.event, prepared.framed
        now = self._clock()
        lagging = []
        n_short = 0
        t0 = time.monotonic_ns()
        # Clients that keep up (nothing unsent) are served first, in one tight loop; the rest
        # (a backlog, stalled, due a resync, closing, HTTP/1.0) after them, so a slow client
        # never delays a reader.
        for client in self._clients:
            if client.stalled_ns is not None or not client.chunked or client.resync or \
                    client.fd < 0 or client.transport.is_closing() or \
                    client.transport.get_write_buffer_size():
                lagging.append(client)
                continue
            if not _write_now(client, framed):
                n_short += 1
            client.last_write_ns = now
        self._n_fast = len(self._clients) - len(lagging)
        self._send_ns = moving_average(self._send_ns, time.monotonic_ns() - t0, self._n_fast,
                                       n_short)
        if not isinstance(event, bytes):
            # what outlives this tick (the replay history, a lagging client's unsent bytes
            # in its transport) is copied out of the slot buffer, encoded again N ticks on
            event = bytes(event)
            if lagging:
                framed = chunk(event)
        self._history.append((state.k, event))
        self._words.extend(prepared.words)
        self._cues.extend(prepared.cues)
        self._n_words += len(prepared.words)
        self._last = state
        self._full = None
        for client in lagging:
            self._offer(client, event, framed, now)
        if any(link.n_ready for link in self._links):
            full = chunk(self.full_event())
            for link in self._links:
                if link.n_ready:
                    link.full(full)
        while self._handoffs:
            self._hand_off(self._handoffs.popleft())
        self._rebalance()

    def _encode(self, state: CaptionState) -> _Prepared:
        words, cues = delta_rows(state)
        return self._encoded(state, delta_payload(state, self._n_words, words, cues))

    @staticmethod
    def _encoded(state: CaptionState, payload: dict[str, Any]) -> _Prepared:
        """Tick k's delta ``payload`` as event bytes (an edge's relay sink encodes payloads
        that came over the bus, laid out by the daemon, with this)."""
        event = encode_event(state.k, payload)
        return _Prepared(state, event, chunk(event), payload["words"], payload["cues"])

    def _offer(self, client: _Client, event: bytes, framed: bytes, now: int) -> None:
        transport = client.transport
        if transport.is_closing():
            self._retire(client, dropped=False)
            return
        if transport.get_write_buffer_size() > self.config.client_buffer_bytes:
            self._n_skipped += 1
            if client.stalled_ns is None:
                client.stalled_ns = now
                client.resync = True
            elif now - client.stalled_ns > self.config.drop_after_ms * NS_PER_MS:
                self.n_dropped += 1
                self._retire(client, dropped=True)  # reset: its unsent bytes are discarded
            return
        client.stalled_ns = None
        if client.resync:
            client.resync = False
            event = self.full_event()
            framed = chunk(event)
        transport.write(framed if client.chunked else event)
        client.last_write_ns = now

    def _retire(self, client: _Client, *, dropped: bool) -> None:
        """Disconnect soon, RETIRE_PER_TURN a loop turn: closing costs ~20 us a client, and
        hundreds dropped at one tick must not hold the loop (and the publisher) for ms."""
        self._forget(client)
        self._retiring.append((client, dropped))
        if len(self._retiring) == 1:
            asyncio.get_running_loop().call_soon(self._retire_some)

    def _retire_some(self) -> None:
        n_dropped = 0
        for _ in range(min(RETIRE_PER_TURN, len(self._retiring))):
            client, dropped = self._retiring.popleft()
            if dropped:  # asyncio's abort() is a plain close: make it a reset
                sock = client.transport.get_extra_info("socket")
                if sock is not None:
                    reset_on_close(sock)
            if dropped or not client.transport.is_closing():
                client.transport.abort()
            n_dropped += dropped
            client.finish()
        if n_dropped:
            log.info("SSE: %d clients dropped: not reading for %d ms", n_dropped,
                     self.config.drop_after_ms)
        if self._retiring:
            asyncio.get_running_loop().call_soon(self._retire_some)

    def _forget(self, client: _Client) -> None:
        self._clients.pop(client, None)
        if self._remote.pop(client.id, None) is not None and client.link is not None:
            client.link.n_clients -= 1
            client.link.remove(client.id)
            client.link = None

    def full_event(self) -> bytes:
        """The full-state resync event for the latest tick (cached per tick)."""
        if self._full is None:
            state = self._last
            if state is None:
                return b""
            payload = full_payload(state, self.config.latency_ms * NS_PER_MS,
                                   self._n_words - len(self._words), list(self._words),
                                   list(self._cues))
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
            for client in list(self._remote.values()):
                if client.transport.is_closing():
                    self._retire(client, dropped=False)
            for link in self._links:
                link.heartbeat(now)
            for client in list(self._clients):
                if client.transport.is_closing():
                    self._retire(client, dropped=False)
                elif now - client.last_write_ns >= self.config.heartbeat_ms * NS_PER_MS:
                    framed = chunk(HEARTBEAT) if client.chunked else HEARTBEAT
                    self._offer(client, HEARTBEAT, framed, now)

    # -- HTTP ----------------------------------------------------------------------------

    async def handle_options(self, request: web.Request) -> web.Response:
        return options_response(self.config.cors_origins, request)

    async def handle_events(self, request: web.Request) -> web.StreamResponse:
        cors = cors_headers(self.config.cors_origins, request)
        if cors is None:
            origin = request.headers.get("Origin", "")
            return web.Response(status=403, text=f"origin {origin!r} not allowed\n")
        if self.n_clients >= self.config.max_clients:
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
        set_sndbuf(transport, self.config.socket_sndbuf_bytes)
        self._next_id += 1
        client = _Client(self._next_id, transport, chunked, self._clock())  # type: ignore[arg-type]
        self._clients[client] = None
        try:
            await resp.write(b"retry: %d\n\n" % self.config.retry_ms + self.catch_up(last_id))
            self._hand_off(client)
            await client.done
        finally:
            self._forget(client)
        return resp

