"""The HTTP side of subd: ``GET /events`` (SSE) and ``GET /overlay`` (browser page) of a sink,
and the daemon's own server (:func:`serve_daemon`).

An SSE sink configured with a ``host`` serves :func:`make_app` by itself. The daemon serves,
behind the safety middlewares of :mod:`subd.server.safety` (read-only unless marked, bearer token on
push, size and time limits): ``/healthz``, ``/metrics`` and per channel ``/c/NAME/events``,
``/c/NAME/overlay``, ``/c/NAME/push`` and ``/c/NAME/healthz``; a daemon configured without
``[channels]`` also serves its one channel at ``/events``, ``/overlay`` and ``/push``.
Channel routes look the channel up per request, so channels added or restarted by a reload are
served at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from subd.server.ops import health_handler, metrics_handler
from subd.server.overlay import handle_overlay

if TYPE_CHECKING:
    from subd.sinks.sse.sink import SSESink

log = logging.getLogger("subd.server.app")
DAEMON_KEY = web.AppKey("subd_daemon", object)
SINK_WAIT_S = 5.0


def add_routes(app: web.Application, sse: SSESink, *, overlay: bool = True) -> None:
    app.router.add_get("/events", sse.handle_events, allow_head=False)
    app.router.add_route("OPTIONS", "/events", sse.handle_options)
    if overlay:
        app.router.add_get("/overlay", handle_overlay)


def make_app(sse: SSESink, *, overlay: bool = True) -> web.Application:
    app = web.Application()
    add_routes(app, sse, overlay=overlay)
    return app


# ---- the daemon's server: channels under /c/NAME/, health, metrics, push ---------------------


def _channel(request: web.Request) -> Any:
    daemon = request.app[DAEMON_KEY]
    name = request.match_info.get("channel")
    if name is None:  # the root aliases of a one-channel daemon
        return next(iter(daemon.channels.values()), None)
    return daemon.channels.get(name)


def _missing(what: str) -> web.Response:
    return web.json_response({"error": what}, status=404)


async def _events(request: web.Request) -> web.StreamResponse:
    ch = _channel(request)
    if ch is None or "sse" not in ch.spec.sinks.enabled and ch.sse is None:
        return _missing("no such channel, or it has no sse sink")
    for _ in range(int(SINK_WAIT_S / 0.1)):  # a channel restarting: its sink is back soon
        if ch.sse is not None:
            return await ch.sse.handle_events(request)
        await asyncio.sleep(0.1)
    return web.json_response({"error": "the channel is not running"}, status=503)


async def _events_options(request: web.Request) -> web.StreamResponse:
    ch = _channel(request)
    sse = ch.sse if ch is not None else None
    if sse is None:
        return _missing("no such channel, or it has no sse sink")
    return await sse.handle_options(request)


def _takes_push(request: web.Request) -> bool:
    """The channel is configured for HTTP push audio: running, or not yet (the model loading,
    a restart), when its handler is not there."""
    daemon = request.app[DAEMON_KEY]
    if daemon.source is not None:  # one given source (subd stream): never pushed to
        return False
    name = request.match_info.get("channel")
    specs = daemon.config.channel_specs()
    spec = specs[0] if name is None else next((s for s in specs if s.name == name), None)
    return spec is not None and spec.source.kind == "http"


async def _push(request: web.Request) -> web.StreamResponse:
    if not _takes_push(request):
        return _missing("no such channel, or it takes no HTTP audio (source kind = \"http\")")
    health = request.app[DAEMON_KEY].health
    for _ in range(int(SINK_WAIT_S / 0.1)):  # a channel starting or restarting: soon up
        ch = _channel(request)
        if ch is not None and ch.push_handler is not None:
            return await ch.push_handler(request)
        state = health.channel(ch.name) if ch is not None else None
        if state is not None and state.state == "standby":  # another daemon holds it (subd.bus)
            return web.json_response({"error": f"a standby: {state.state_detail}"}, status=503)
        await asyncio.sleep(0.1)
    return web.json_response({"error": "the channel is not running; push again later"},
                             status=503, headers={"Retry-After": "1"})


async def _channel_health(request: web.Request) -> web.Response:
    daemon = request.app[DAEMON_KEY]
    name = request.match_info["channel"]
    return await health_handler(daemon.health, name)(request)


async def serve_daemon(daemon: Any, stack: Any) -> None:
    """Start the daemon's HTTP server (closed by ``stack``); sets ``daemon.bound_port``."""
    from subd.errors import ConfigError
    from subd.server.overlay import handle_overlay
    from subd.server.safety import HttpLimits, is_loopback, push_endpoint
    from subd.server.safety import make_app as safe_app

    limits = HttpLimits()
    rejected = daemon.metrics.http_rejected
    app = safe_app(limits, daemon.push_token, on_reject=lambda reason: rejected.labels(
        reason).inc())
    app[DAEMON_KEY] = daemon
    r = app.router
    r.add_get("/healthz", health_handler(daemon.health))
    r.add_get("/metrics", metrics_handler(daemon.metrics))
    prefixes = ["/c/{channel}"]
    if not daemon.config.channels:
        prefixes.append("")  # one channel from the top-level sections: also at the root
    for prefix in prefixes:
        r.add_get(f"{prefix}/events", _events, allow_head=False)
        r.add_route("OPTIONS", f"{prefix}/events", _events_options)
        r.add_get(f"{prefix}/overlay", handle_overlay)
        r.add_post(f"{prefix}/push", push_endpoint(_push))
    r.add_get("/c/{channel}/healthz", _channel_health)
    runner = web.AppRunner(app, access_log=None)  # parser limits: make_app's handler_args
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    host, port = daemon.serve
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    server = site._server  # noqa: SLF001 - the bound port when port = 0
    daemon.bound_port = server.sockets[0].getsockname()[1] if server else port
    if not is_loopback(host):
        log.warning("listening on %s, not loopback: every client that reaches this address "
                    "can read the captions, /metrics and /healthz", host)
    if daemon.config.channels:
        for spec in daemon.config.channels:
            log.info("serving http://%s:%d/c/%s/events", host, daemon.bound_port, spec.name)
    else:
        log.info("serving http://%s:%d/events", host, daemon.bound_port)
