"""The daemon's side of the bus: a channel's tick events, written to its Redis stream ahead of
their due time.

It sits among the channel's sinks: ``prepare(state)``, called by the scheduler at
T(k) − ``[bus] lead_ms``, encodes the tick (its cues as the pipeline laid them out, so an
edge's events are the daemon's own) and queues its ``delta`` payload; a writer task sends it with
``XADD … MAXLEN ~`` while the event loop waits for T(k), so the entry is in Redis before the
tick is due and the bus's latency hides inside the lead. ``publish`` only catches a tick that
was never prepared.

The entry is not the SSE event the pipeline encodes into the tick's slot (``prepare_event``,
which this sink leaves alone): it is another document. Its ``k`` and ``w0`` continue the
channel's stream across daemons (this daemon's tick 0 is the stream's ``k0``), it carries
``latency_ns`` for the edges, and it is bare JSON for a Redis field, with no ``id:``/``data:``
lines or chunk framing; an edge re-encodes it for its own clients anyway (``due_ns`` is on its
clock). So it is encoded here, once per tick.

Every write goes through one script that first checks the lease: a daemon that lost its
channel can never write over the new holder's ticks. While Redis is away the payloads wait in
a bounded backlog (``backlog_ticks``, the oldest dropped and counted beyond it) and are written
in order once it is back: a committed word is lost only if Redis itself lost it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque

from redis.exceptions import RedisError

from subd.bus.lease import DOWN_RETRY_S, ChannelLease
from subd.bus.stream import encode_entry, stream_end
from subd.config import BusConfig
from subd.sinks.sse.wire import SSEConfig, delta_payload, delta_rows
from subd.tasks import cancel_and_wait, start_task
from subd.types import CaptionState

log = logging.getLogger("subd.bus.publisher")

# KEYS: lease, stream; ARGV: token, ttl_ms, maxlen, payload... 1: written; 0: the lease is
# someone else's. A lease that is gone (Redis lost it, or it expired while Redis was away and
# nobody took it) is taken back.
PUBLISH = """
local holder = redis.call('GET', KEYS[1])
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
elseif holder ~= ARGV[1] then
  return 0
end
for i = 4, #ARGV do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[i])
end
return 1
"""
BATCH = 64  # entries a script call writes while catching up


class BusPublisher:
    name = "bus"

    def __init__(self, config: BusConfig, lease: ChannelLease,
                 sse: SSEConfig | None = None) -> None:
        self.config = config
        self.lease = lease
        self.redis = lease.redis
        self.keys = lease.keys
        sse = sse or SSEConfig()
        self._latency_ns = sse.latency_ms * 1_000_000  # D, for the edges' full resyncs
        self._script = self.redis.register_script(PUBLISH)
        self._k0 = 0  # bus k of this pipeline's tick 0 (the stream's continuation)
        self._w0 = 0  # bus word index of this pipeline's first committed word
        self._n_words = 0
        self._last_k = -1  # the pipeline's latest prepared tick
        self._backlog: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._down = False
        self.n_written = 0
        self.n_lost = 0  # dropped from a full backlog while Redis was away

    async def start(self) -> None:
        self._k0, self._w0 = await stream_end(self.redis, self.keys)
        log.info("channel %s: publishing to the bus from tick %d, word %d", self.lease.channel,
                 self._k0, self._w0)
        self._task = start_task(self._writer(), f"bus:{self.lease.channel}")

    # -- the scheduler's calls (event loop, never block) ------------------------------------

    def prepare(self, state: CaptionState) -> None:
        if state.k <= self._last_k or self.lease.lost.is_set():
            return
        self._last_k = state.k
        words, cues = delta_rows(state)  # cues as the pipeline laid them out, once
        bus_state = dataclasses.replace(state, k=self._k0 + state.k)
        payload = delta_payload(bus_state, self._w0 + self._n_words, words, cues)
        payload["latency_ns"] = self._latency_ns  # an edge takes it out of the event
        self._n_words += len(words)
        if len(self._backlog) >= self.config.backlog_ticks:
            self._backlog.popleft()
            self.n_lost += 1
            if self.n_lost in (1, 10, 100) or self.n_lost % 1000 == 0:
                log.error("channel %s: bus backlog full: %d ticks dropped", self.lease.channel,
                          self.n_lost)
        self._backlog.append(encode_entry(payload))
        self._wake.set()

    def publish(self, state: CaptionState) -> None:
        self.prepare(state)  # a tick that was not prepared (a sink error) goes out now, late

    # -- writing ----------------------------------------------------------------------------

    async def _writer(self) -> None:
        cfg = self.config
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._backlog:
                batch = [self._backlog[i] for i in range(min(BATCH, len(self._backlog)))]
                try:
                    ok = await self._script(
                        keys=[self.keys.lease, self.keys.stream],
                        args=[self.lease.token, cfg.lease_ttl_ms, cfg.stream_maxlen, *batch])
                except (RedisError, OSError) as exc:
                    if not self._down:
                        self._down = True
                        log.warning("channel %s: bus unreachable (%s): ticks wait in a "
                                    "backlog", self.lease.channel, exc)
                    await asyncio.sleep(DOWN_RETRY_S)
                    continue
                if not ok:
                    self._backlog.clear()
                    self.lease.mark_lost()
                    return
                if self._down:
                    self._down = False
                    log.info("channel %s: bus reachable again: %d ticks written late",
                             self.lease.channel, len(self._backlog))
                for _ in batch:
                    self._backlog.popleft()
                self.n_written += len(batch)

    async def close(self, timeout_s: float = 1.0) -> None:
        """Write what is queued (the last ticks of a drain), for at most ``timeout_s``."""
        task, self._task = self._task, None
        if task is None:
            return
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._backlog and not task.done() and \
                asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        if self._backlog:
            log.warning("channel %s: %d ticks not written to the bus at close",
                        self.lease.channel, len(self._backlog))
        await cancel_and_wait(task)
