"""The operations endpoints: ``/healthz`` (the whole daemon, or ``/c/NAME/healthz`` for one
channel) and ``/metrics`` (Prometheus text format).

They read what the service hands the server (a health monitor with ``report()`` and
``channel(name)``, a metrics registry with ``render()``), so the server needs nothing from
:mod:`subd.service`.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST


def json_response(body: dict, status: int) -> web.Response:
    return web.Response(
        text=json.dumps(body, separators=(",", ":")),
        status=status,
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


def health_handler(monitor: Any, channel: str | None = None):
    """aiohttp handler for ``/healthz`` (whole daemon) or ``/c/NAME/healthz`` (one channel)."""

    async def handle_health(request: web.Request) -> web.Response:
        if channel is None:
            report = monitor.report()
            return json_response(report.to_json(), report.http_status)
        ch = monitor.channel(channel)
        if ch is None:
            return json_response({"status": "fail", "problems": ["unknown channel"]}, 404)
        body = {"status": "ok" if ch.serving else "fail", "channel": channel} | ch.to_json()
        return json_response(body, 200 if ch.serving else 503)

    return handle_health


def metrics_handler(metrics: Any):
    """An aiohttp handler serving ``metrics`` in the Prometheus text format."""

    async def handle_metrics(request: web.Request) -> web.Response:
        # Rendering is pure Python; a few hundred series take well under a millisecond.
        body = metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    return handle_metrics
