"""Safe defaults for the daemon's HTTP server, as aiohttp middlewares.

Every endpoint is read-only (GET/HEAD; anything else gets 405) unless its handler is marked
:func:`accepts_writes`. A handler marked :func:`requires_token` (the audio push endpoint) needs
``Authorization: Bearer <token>``, compared in constant time (401 otherwise, and always 401 when
no token is configured). Request bodies are bounded (413) and a request must be answered within
``request_timeout_s`` (408): the limit ends once the response starts, so SSE and other streamed
responses run on. Handlers marked :func:`long_lived` (an upload streamed as one long body) are
exempt altogether and read their body through :func:`iter_body`, which bounds every pause.

Use ``app = make_app(limits, resolve_token(cfg_token), on_reject=count)`` in place of
``web.Application()``; it also sets the parser's header limits.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from subd.errors import ConfigError

log = logging.getLogger("subd.server.app")

TOKEN_ENV = "SUBD_PUSH_TOKEN"
TOKEN_CREDENTIAL = "subd-push-token"  # systemd LoadCredential= name
MIN_TOKEN_CHARS = 16
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

_WRITES = "_subd_accepts_writes"
_TOKEN = "_subd_requires_token"
_LONG = "_subd_long_lived"


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_body_bytes: int = 64 * 1024  # ordinary requests
    max_push_body_bytes: int | None = 1 << 20  # token endpoints (push); None: unbounded stream
    request_timeout_s: float = 10.0  # whole request, ordinary endpoints
    body_idle_timeout_s: float = 5.0  # longest pause between body bytes (slow-loris)
    push_chunk_bytes: int = 64 * 1024
    max_line_bytes: int = 4096  # request line / header line
    max_headers: int = 64
    linger_s: float = 1.0  # after refusing a request, drain its body this long, then close

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "request_timeout_s", "body_idle_timeout_s",
                     "push_chunk_bytes", "max_line_bytes", "max_headers"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"[http] {name} must be > 0, got {getattr(self, name)}")


# -- markers -----------------------------------------------------------------------------------

def accepts_writes(handler):
    """Allow methods other than GET/HEAD on this handler."""
    setattr(handler, _WRITES, True)
    return handler


def requires_token(handler):
    """Require the bearer token on this handler."""
    setattr(handler, _TOKEN, True)
    return handler


def long_lived(handler):
    """Exempt this handler from the total request time limit (streams)."""
    setattr(handler, _LONG, True)
    return handler


def push_endpoint(handler):
    """The audio push endpoint: writes, bearer token, body up to ``max_push_body_bytes``.
    A push that streams one long body is also marked :func:`long_lived`."""
    return requires_token(accepts_writes(handler))


def _marked(request: web.Request, marker: str) -> bool:
    return bool(getattr(request.match_info.handler, marker, False))


# -- token -------------------------------------------------------------------------------------

def resolve_token(configured: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The push token: the config value, else ``$SUBD_PUSH_TOKEN``, else the systemd credential
    ``subd-push-token``; None when none is set (then every push is refused)."""
    env = os.environ if env is None else env
    token = configured or env.get(TOKEN_ENV) or None
    source = "[server] push_token" if configured else TOKEN_ENV
    if token is None and env.get("CREDENTIALS_DIRECTORY"):
        path = Path(env["CREDENTIALS_DIRECTORY"]) / TOKEN_CREDENTIAL
        if path.is_file():
            token, source = path.read_text().strip() or None, f"credential {path}"
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"push token from {source} is too short: {len(token)} characters, "
            f"at least {MIN_TOKEN_CHARS} required"
        )
    return token


def bearer_ok(header: str | None, token: str | None) -> bool:
    if token is None or not header:
        return False
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- body reading ------------------------------------------------------------------------------

async def iter_body(
    request: web.Request, limits: HttpLimits, max_bytes: int | None
) -> AsyncIterator[bytes]:
    """Yield the body in chunks; 408 after a pause longer than the idle limit, 413 past
    ``max_bytes`` (None: unbounded)."""
    total = 0
    while True:
        try:
            async with asyncio.timeout(limits.body_idle_timeout_s):
                chunk = await request.content.read(limits.push_chunk_bytes)
        except TimeoutError:
            raise _refused(request, 408, "body_idle") from None
        if not chunk:
            return
        total += len(chunk)
        if max_bytes is not None and total > max_bytes:
            raise _refused(request, 413, "too_large")
        yield chunk


async def read_body(request: web.Request, limits: HttpLimits) -> bytes:
    """The whole (small) body of an ordinary write request, within the limits."""
    parts = [c async for c in iter_body(request, limits, limits.max_body_bytes)]
    return b"".join(parts)


# -- middlewares -------------------------------------------------------------------------------

_REASONS = {401: "Unauthorized", 405: "Method Not Allowed", 408: "Request Timeout",
            413: "Payload Too Large"}
_REJECT_HOOK = web.AppKey("subd_reject_hook", object)
# aiohttp >= 3.12 wants typed keys on requests; older versions take plain strings.
_DEADLINE = (web.RequestKey("subd_request_deadline", asyncio.Timeout)
             if hasattr(web, "RequestKey") else "subd_request_deadline")


async def _started(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: the handler answered in time; lift its deadline (streams go on)."""
    deadline = request.get(_DEADLINE)
    if deadline is not None:
        deadline.reschedule(None)


def _refused(request: web.Request, status: int, reason: str) -> web.HTTPException:
    """Count and log a refusal; the exception to raise. The connection is closed after it."""
    hook = request.app.get(_REJECT_HOOK)
    if hook is not None:
        hook(reason)
    log.warning("refused HTTP request: %s (%d)", reason, status)
    headers = {"Connection": "close"}
    text = _REASONS[status]
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="subd"'
        return web.HTTPUnauthorized(headers=headers, text=text)
    if status == 405:
        return web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"], headers=headers,
                                        text=text)
    if status == 413:
        size = request.content_length or 0
        return web.HTTPRequestEntityTooLarge(max_size=size, actual_size=size, headers=headers,
                                             text=text)
    return web.HTTPRequestTimeout(headers=headers, text=text)


def safety_middleware(limits: HttpLimits, token: str | None):
    @web.middleware
    async def safety(request: web.Request, handler):
        if request.match_info.http_exception is not None:
            return await handler(request)  # the router's own 404/405
        writes = _marked(request, _WRITES)
        if request.method not in READ_METHODS and not writes:
            raise _refused(request, 405, "read_only")
        if _marked(request, _TOKEN) and not bearer_ok(request.headers.get("Authorization"),
                                                       token):
            raise _refused(request, 401, "unauthorized")
        limit = limits.max_push_body_bytes if _marked(request, _TOKEN) else limits.max_body_bytes
        length = request.content_length
        if length is not None and limit is not None and length > limit:
            raise _refused(request, 413, "too_large")
        if not writes and (length or request.headers.get("Transfer-Encoding")):
            if length is None or length > 0:
                raise _refused(request, 413, "too_large")  # read-only requests carry no body
        if _marked(request, _LONG):
            return await handler(request)
        try:
            async with asyncio.timeout(limits.request_timeout_s) as deadline:
                # Once the response has started (SSE, any stream) it may last: see _started.
                request[_DEADLINE] = deadline
                try:
                    return await handler(request)
                finally:
                    del request[_DEADLINE]  # a response prepared after this needs no lifting
        except TimeoutError:
            raise _refused(request, 408, "timeout") from None

    return safety


def make_app(
    limits: HttpLimits,
    token: str | None,
    on_reject: Callable[[str], None] | None = None,
    extra_middlewares: tuple = (),
) -> web.Application:
    """A ``web.Application`` with the safety middleware, limits and ``on_reject(reason)``."""
    app = web.Application(
        middlewares=(safety_middleware(limits, token), *extra_middlewares),
        client_max_size=limits.max_body_bytes,
        handler_args=handler_args(limits),
    )
    app.on_response_prepare.append(_started)
    if on_reject is not None:
        app[_REJECT_HOOK] = on_reject
    return app


def handler_args(limits: HttpLimits) -> dict:
    """Parser limits for ``web.AppRunner(app, handler_args=...)`` (header-flood protection)."""
    return {
        "max_line_size": limits.max_line_bytes,
        "max_field_size": limits.max_line_bytes,
        "max_headers": limits.max_headers,
        "keepalive_timeout": 15.0,
        "lingering_time": limits.linger_s,
    }
