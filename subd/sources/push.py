"""HTTP push: ``POST /push`` hands raw PCM chunks to a :class:`QueueSource`."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from subd.errors import AudioInputError
from subd.sources.live import QueueSource, pcm_to_float
from subd.types import SAMPLE_RATE_HZ

log = logging.getLogger("subd.sources")


_REASONS = {400: "push_bad_audio", 401: "push_token", 410: "push_ended", 413: "push_too_large",
            503: "push_queue_full"}


def make_push_handler(source: QueueSource, *, token: str = "", fmt: str = "s16le",
                      rate_hz: int = SAMPLE_RATE_HZ, channels: int = 1,
                      max_bytes: int = 1 << 20,
                      on_reject: Callable[[str], None] | None = None,
                      ) -> Callable[[Any], Awaitable[Any]]:
    """An aiohttp handler for ``POST /push``: the body is raw interleaved PCM, ``?format=``
    s16le or f32le, ``?rate=`` and ``?channels=`` (defaults: ``fmt``, ``rate_hz``,
    ``channels``), mixed to mono and resampled to 16 kHz here; ``?end=1`` ends the stream.
    Bearer token required when ``token`` is set. A chunk with a NaN sample is refused (400).
    Every refusal is logged and counted: ``on_reject(reason)``, a reason of ``_REASONS``."""
    from aiohttp import web

    from subd.sources.pcm import PcmSpec, ToMono16k

    # the pusher's format's converter, its resampler's state running on across chunks (one: a
    # pusher that changes its rate or channels starts a new one)
    to_mono: list[ToMono16k] = [ToMono16k(rate_hz, channels)]

    def error(text: str, status: int = 400) -> web.Response:
        log.warning("refused audio push to %s: %s (%d)", source.name, text, status)
        if on_reject is not None:
            on_reject(_REASONS[status])
        return web.json_response({"error": text}, status=status)

    async def handler(request: web.Request) -> web.StreamResponse:
        if token and request.headers.get("Authorization", "") != f"Bearer {token}":
            return error("missing or wrong bearer token", 401)
        if request.content_length is not None and request.content_length > max_bytes:
            return error(f"chunk over {max_bytes} bytes", 413)
        if source.ended:
            return error("stream already ended", 410)
        query = request.query
        try:
            spec = PcmSpec.parse(query.get("format", fmt), query.get("rate", rate_hz),
                                 query.get("channels", channels))
        except AudioInputError as exc:  # "bad --rate ...": named as the query says it
            return error(str(exc).replace("bad --", "bad ?"))
        raw = await request.content.read(max_bytes + 1)
        if len(raw) > max_bytes:
            return error(f"chunk over {max_bytes} bytes", 413)
        if len(raw) % spec.frame_bytes:
            return error("body is not whole frames" if spec.channels > 1
                         else "body is not whole samples")
        try:
            samples = pcm_to_float(raw, spec.fmt)
        except AudioInputError as exc:
            return error(str(exc))
        if (to_mono[0].rate_hz, to_mono[0].channels) != (spec.rate_hz, spec.channels):
            to_mono[0] = ToMono16k(spec.rate_hz, spec.channels)
        samples = to_mono[0](samples)
        if samples.shape[0] and not source.push(samples):
            return error("ingest queue full", 503)
        if query.get("end") in ("1", "true"):
            source.end()
        return web.Response(status=204)

    return handler
