"""An SSE sink served on its own address (``[sinks.sse] host``/``port``, the fan-out bench).

The sink itself never owns an HTTP server: this wrapper starts the sink, then an aiohttp server
that mounts the sink's ``/events`` and the overlay, and closes both in the reverse order. Every
other attribute is the sink's, so callers use it as the sink.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

log = logging.getLogger("subd.server")


class ServedSink:
    def __init__(self, sink: Any, host: str, port: int = 0) -> None:
        self.sink, self.host, self.requested_port = sink, host, port
        self.port: int | None = None
        self._runner: web.AppRunner | None = None

    def __getattr__(self, name: str) -> Any:  # only called for what this wrapper lacks
        return getattr(self.sink, name)

    async def start(self) -> None:
        from subd.server.app import make_app

        await self.sink.start()
        self._runner = web.AppRunner(make_app(self.sink), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.requested_port)
        await site.start()
        server = site._server  # noqa: SLF001 - the bound port when port = 0
        self.port = server.sockets[0].getsockname()[1] if server else self.requested_port
        log.info("SSE on http://%s:%d/events", self.host, self.port)

    def publish(self, state: Any) -> None:
        self.sink.publish(state)

    def prepare(self, state: Any) -> None:
        self.sink.prepare(state)

    async def close(self) -> None:
        await self.sink.close()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()


def serve_if_configured(sink: Any) -> Any:
    """The sink, wrapped in its own server when its configuration names a host."""
    host = getattr(getattr(sink, "config", None), "host", "")
    if not host or not hasattr(sink, "handle_events"):
        return sink
    return ServedSink(sink, host, sink.config.port)
