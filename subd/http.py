"""The HTTP side of subd's sinks: ``GET /events`` (SSE) and ``GET /overlay`` (browser page).

The daemon mounts these on its own aiohttp application with :func:`add_routes`; an SSE sink
configured with a ``host`` serves :func:`make_app` by itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from subd.sinks.overlay import handle_overlay

if TYPE_CHECKING:
    from subd.sinks.sse import SSESink


def add_routes(app: web.Application, sse: SSESink, *, overlay: bool = True) -> None:
    app.router.add_get("/events", sse.handle_events, allow_head=False)
    app.router.add_route("OPTIONS", "/events", sse.handle_options)
    if overlay:
        app.router.add_get("/overlay", handle_overlay)


def make_app(sse: SSESink, *, overlay: bool = True) -> web.Application:
    app = web.Application()
    add_routes(app, sse, overlay=overlay)
    return app
