"""One channel on an edge: read its stream, release each tick at its due time.

:class:`RelaySink` is the SSE sink (same clients, fan-out workers, replay, resync and slow
client policy) fed with payloads that the daemon already laid out and numbered: it only puts
this host's ``due_ns`` in and encodes. :class:`ChannelFollower` reads the stream with
``XREAD BLOCK`` and hands each tick to the sink like the daemon's publisher does: ``prepare`` at
due − 4 ms (the fan-out workers get it with its release time), a spin to the due time on this
host's monotonic clock, ``publish``. Entries arrive ``[bus] lead_ms`` ahead, so the bus's own
latency is hidden; one that arrives after its due time (Redis was away) goes out at once, late,
so that its committed words still reach the viewers.

On start the follower reads the last ``history_ticks`` entries first, so a viewer reconnecting
with ``Last-Event-ID`` to a freshly started edge gets its replay, not a resync.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from redis.exceptions import RedisError

from subd.bus.stream import ChannelKeys, decode_entry
from subd.clock import MonotonicClock
from subd.pipeline.contracts import PREPARE_NS
from subd.pipeline.gcpace import PACER
from subd.sinks.sse.sink import SSESink
from subd.sinks.sse.wire import NS_PER_MS, SSEConfig, monotonic_of
from subd.types import CaptionState

log = logging.getLogger("subd.edge")
READ_BLOCK_MS = 1000
READ_COUNT = 256
DOWN_RETRY_S = 0.2
RELEASE_ERRORS_KEPT = 300
LATE_NS = 2_000_000  # a release this far past its due time is counted late


class RelaySink(SSESink):
    """The SSE sink, fed with the daemon's payloads (see the module docstring)."""

    def __init__(self, config: SSEConfig) -> None:
        super().__init__(config)
        self._payloads: dict[int, dict[str, Any]] = {}

    def state_of(self, payload: dict[str, Any]) -> CaptionState:
        """Tick k on this host's clock; its payload is kept for ``_encode``."""
        due_ns = monotonic_of(payload["due_unix_ns"])
        payload["due_ns"] = due_ns  # the host that writes the event: this one
        latency_ns = payload.pop("latency_ns", None)
        if isinstance(latency_ns, int) and latency_ns // NS_PER_MS != self.config.latency_ms:
            from dataclasses import replace

            self.config = replace(self.config, latency_ms=latency_ns // NS_PER_MS)
        self._payloads[payload["k"]] = payload
        return CaptionState(payload["k"], due_ns, payload["audio_end_ns"],
                            tentative=str(payload.get("tentative", "")),
                            fallback=bool(payload.get("fallback")),
                            degraded=bool(payload.get("degraded")))

    def _encode(self, state: CaptionState) -> Any:
        payload = self._payloads.pop(state.k)
        self._n_words = payload["w0"]  # the daemon's word index: an edge starts mid-stream
        return self._encoded(state, payload)

    @property
    def last_k(self) -> int:
        return self._last.k if self._last is not None else -1


class ChannelFollower:
    def __init__(self, redis: Any, keys: ChannelKeys, name: str, sink: RelaySink) -> None:
        self.redis = redis
        self.keys = keys
        self.name = name
        self.sink = sink
        self.primed = asyncio.Event()  # the stream's recent history is in the sink
        self.up = True
        self.n_late = 0  # ticks released more than LATE_NS after their due time
        self.n_released = 0
        self.last_unix_ns = 0  # due_unix_ns of the latest tick released
        # release time - due time of the latest ticks that came in time (/healthz)
        self.release_errors_ns: deque[int] = deque(maxlen=RELEASE_ERRORS_KEPT)
        self._queue: asyncio.Queue[CaptionState | None] = asyncio.Queue()
        self._clock = MonotonicClock()

    async def follow(self) -> None:
        """Read the stream for ever (reconnecting when Redis is away)."""
        last_id: bytes | str = "0-0"
        history_read = False
        while True:
            try:
                if not history_read:
                    recent = await self.redis.xrevrange(self.keys.stream,
                                                        count=self.sink.config.history_ticks)
                    if recent:
                        last_id = recent[0][0]
                    self._take(reversed(recent))
                    self._queue.put_nowait(None)  # primed once the release loop is here
                    history_read = True
                got = await self.redis.xread({self.keys.stream: last_id}, count=READ_COUNT,
                                             block=READ_BLOCK_MS)
                self._set_up(True)
            except (RedisError, OSError) as exc:
                self._set_up(False, exc)
                await asyncio.sleep(DOWN_RETRY_S)
                continue
            for _, entries in got:
                if entries:
                    last_id = entries[-1][0]
                    self._take(entries)

    def _take(self, entries: Any) -> None:
        for _, fields in entries:
            payload = decode_entry(fields)
            if payload is None:
                log.warning("channel %s: an entry that is not a tick event skipped", self.name)
                continue
            if payload["due_unix_ns"] <= self.last_unix_ns:
                continue  # already released (read again after a reconnect)
            self.last_unix_ns = payload["due_unix_ns"]
            self._queue.put_nowait(self.sink.state_of(payload))

    async def release(self) -> None:
        """Each tick to the sink at its due time: prepared PREPARE_NS (4 ms) before it, then a
        sleep and a spin to its due time, published."""
        PACER.acquire()  # collections right after publishing, never just before
        try:
            while True:
                state = await self._queue.get()
                if state is None:  # the stream's history is in the sink: viewers may come
                    self.primed.set()
                    continue
                await self._clock.sleep_until(state.due_ns - PREPARE_NS, precise=False)
                self.sink.prepare(state)
                sent_ns = await self._clock.sleep_until(state.due_ns)
                self.sink.publish(state)
                self.n_released += 1
                if sent_ns - state.due_ns > LATE_NS:
                    self.n_late += 1
                if self.primed.is_set():
                    self.release_errors_ns.append(sent_ns - state.due_ns)
                PACER.after_publish()
        finally:
            PACER.release()

    def release_error_ms(self, q: float) -> float | None:
        """The q-quantile of this edge's own release error (its spin's end minus T(k)) over
        the latest ticks; None before any."""
        if not self.release_errors_ns:
            return None
        ordered = sorted(self.release_errors_ns)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6

    def _set_up(self, up: bool, exc: BaseException | None = None) -> None:
        if up == self.up:
            return
        self.up = up
        if up:
            log.info("channel %s: bus reachable again", self.name)
        else:
            log.warning("channel %s: bus unreachable (%s); retrying", self.name, exc)
