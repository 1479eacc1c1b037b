"""The edge server: ``/c/NAME/events`` (SSE, with ``Last-Event-ID`` replay from the stream),
``/c/NAME/overlay`` and ``/healthz``, for any channel that has a stream on the bus.

Stateless: everything it serves comes from Redis, so any number of edges can stand behind a
load balancer and any of them can be killed and restarted. A channel is followed from its first
viewer on (its stream must exist: a name with none gets 404) and for as long as the edge runs.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from redis.exceptions import RedisError

from subd.bus.stream import ChannelKeys, connect
from subd.config import CHANNEL_NAME
from subd.edge.relay import ChannelFollower, RelaySink
from subd.errors import ConfigError
from subd.server.overlay import handle_overlay
from subd.server.safety import HttpLimits, make_app
from subd.sinks.sse.wire import SSEConfig, options_response
from subd.tasks import cancel_and_wait, start_task

log = logging.getLogger("subd.edge")
PRIME_WAIT_S = 5.0
BUS_PING_S = 1.0  # /healthz and the start-up check: a bus that does not answer a PING by then
EDGE_KEY = web.AppKey("subd_edge", object)


@dataclass(frozen=True, slots=True)
class EdgeConfig:
    bus_url: str
    host: str = "127.0.0.1"
    port: int = 8766
    prefix: str = "subd"
    max_channels: int = 256
    # replay: as many ticks as a stream keeps by default ([bus] stream_maxlen), ~3 MB a channel;
    # the fan-out worker at SCHED_FIFO just below the release loop: an edge runs no model
    sse: SSEConfig = field(default_factory=lambda: SSEConfig(
        fanout_workers=1, history_ticks=9000, fanout_priority=9))


class Edge:
    def __init__(self, config: EdgeConfig) -> None:
        self.config = config
        self.redis: Any = None
        self.followers: dict[str, ChannelFollower] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._lock = asyncio.Lock()
        self._stack = AsyncExitStack()
        self.port: int | None = None

    async def start(self) -> None:
        cfg = self.config
        self.redis = connect(cfg.bus_url)
        self._stack.push_async_callback(self.redis.aclose)
        app = make_app(HttpLimits(), None)
        app[EDGE_KEY] = self
        r = app.router
        r.add_get("/healthz", self._health)
        r.add_get("/c/{channel}/events", self._events, allow_head=False)
        r.add_route("OPTIONS", "/c/{channel}/events", self._options)
        r.add_get("/c/{channel}/overlay", handle_overlay)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._stack.push_async_callback(runner.cleanup)
        # first: the sinks end their viewers' responses, so the server's shutdown need not wait
        self._stack.push_async_callback(self._stop_followers)
        site = web.TCPSite(runner, cfg.host, cfg.port)
        try:
            await site.start()
        except OSError as exc:
            await self._stack.aclose()
            raise ConfigError(f"edge: cannot listen on {cfg.host}:{cfg.port}: "
                              f"{exc.strerror}") from None
        server = site._server  # noqa: SLF001 - the bound port when port = 0
        self.port = server.sockets[0].getsockname()[1] if server else cfg.port
        log.info("edge: serving http://%s:%d/c/NAME/events from %s", cfg.host, self.port,
                 cfg.bus_url)
        if (down := await self._bus_down()) is not None:
            log.warning("edge: bus %s unreachable (%s): viewers get 503 and /healthz says "
                        "degraded until it answers", cfg.bus_url, down)

    async def _bus_down(self) -> str | None:
        """Why the bus does not answer a PING within ``BUS_PING_S``; None when it does."""
        try:
            await asyncio.wait_for(self.redis.ping(), BUS_PING_S)
        except TimeoutError:
            return f"no answer in {BUS_PING_S:g} s"
        except (RedisError, OSError) as exc:
            return str(exc).rstrip(".") or type(exc).__name__
        return None

    async def close(self) -> None:
        await self._stack.aclose()

    async def _stop_followers(self) -> None:
        for task in self._tasks:
            await cancel_and_wait(task)
        for follower in self.followers.values():
            await follower.sink.close()
        self._tasks.clear()

    async def follower(self, name: str) -> ChannelFollower | None:
        """The channel's follower, started on first use; None if the bus has no such stream."""
        follower = self.followers.get(name)
        if follower is not None:
            return follower
        async with self._lock:
            if name in self.followers:
                return self.followers[name]
            if len(self.followers) >= self.config.max_channels:
                return None
            keys = ChannelKeys.of(self.config.prefix, name)
            if not await self.redis.exists(keys.stream):
                return None
            sink = RelaySink(self.config.sse)
            await sink.start()
            follower = ChannelFollower(self.redis, keys, name, sink)
            self.followers[name] = follower
            self._tasks += [start_task(follower.follow(), f"follow:{name}"),
                            start_task(follower.release(), f"release:{name}")]
            log.info("edge: following channel %s", name)
            return follower

    # -- HTTP ---------------------------------------------------------------------------------

    async def _lookup(self, request: web.Request) -> ChannelFollower | web.Response:
        name = request.match_info["channel"]
        if not CHANNEL_NAME.match(name):
            return web.json_response({"error": "no such channel"}, status=404)
        try:
            follower = await self.follower(name)
        except (RedisError, OSError) as exc:
            return web.json_response({"error": f"bus unreachable: {exc}"}, status=503)
        if follower is None:
            return web.json_response({"error": "no such channel on the bus"}, status=404)
        try:
            await asyncio.wait_for(follower.primed.wait(), PRIME_WAIT_S)
        except TimeoutError:
            return web.json_response({"error": "bus unreachable"}, status=503)
        return follower

    async def _events(self, request: web.Request) -> web.StreamResponse:
        got = await self._lookup(request)
        if isinstance(got, web.Response):
            return got
        return await got.sink.handle_events(request)

    async def _options(self, request: web.Request) -> web.StreamResponse:
        return options_response(self.config.sse.cors_origins, request)

    async def _health(self, request: web.Request) -> web.Response:
        channels = {name: {"bus_up": f.up, "last_k": f.sink.last_k,
                           "clients": f.sink.n_clients, "released": f.n_released,
                           "late": f.n_late, "release_p50_ms": f.release_error_ms(0.5),
                           "release_p99_ms": f.release_error_ms(0.99),
                           # (clients, us per client) of the latest write loops: this
                           # process, then each fan-out worker
                           "fanout": f.sink.fanout_shares}
                    for name, f in self.followers.items()}
        # the bus itself, too: an edge with no channel followed yet whose Redis is away would
        # say ok, and a load balancer would send it viewers it can only answer 503
        down = await self._bus_down()
        up = down is None and all(f.up for f in self.followers.values())
        body: dict[str, Any] = {"status": "ok" if up else "degraded", "bus_up": down is None,
                                "channels": channels}
        if down is not None:
            body["bus_error"] = down
        return web.json_response(body, status=200 if up else 503)
