"""The operations endpoints: ``/healthz`` (the whole daemon, or ``/c/NAME/healthz`` for one
channel) and ``/metrics`` (Prometheus text format).

They read what the service hands the server (a health monitor with ``report()`` and
``channel(name)``, a metrics registry with ``render()``), so the server needs nothing from
:mod:`subd.service`.
"""

from __future__ import annotations

import asyncio
import functools
import json
from concurrent.futures import ThreadPoolExecutor
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
        # Rendering is pure Python: 10 ms for 4 channels' ~600 series, which on the event
        # loop made every scrape publish ticks up to 17 ms late. It runs in a thread of its
        # own (not the default executor, which blocking source reads may fill), and the tick
        # clock takes the interpreter lock back in time (subd.clock.share_gil_within_spin).
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(_render_thread(), metrics.render)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    return handle_metrics


@functools.cache
def _render_thread() -> ThreadPoolExecutor:
    from subd.clock import drop_realtime_priority  # the loop's SCHED_FIFO is not for it

    return ThreadPoolExecutor(1, thread_name_prefix="subd-metrics",
                              initializer=drop_realtime_priority)
