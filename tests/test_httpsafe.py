"""Safe HTTP defaults on a real aiohttp server on loopback: tokens, size and time limits."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from subd.errors import ConfigError
from subd.server.safety import (
    HttpLimits,
    accepts_writes,
    bearer_ok,
    is_loopback,
    iter_body,
    long_lived,
    make_app,
    push_endpoint,
    read_body,
    resolve_token,
)

TOKEN = "t0k3n-0123456789abcdef"
LIMITS = HttpLimits(
    max_body_bytes=1024,
    max_push_body_bytes=8192,
    request_timeout_s=0.5,
    body_idle_timeout_s=0.3,
)


def _app(rejected: list[str], token: str | None = TOKEN) -> web.Application:
    app = make_app(LIMITS, token, on_reject=rejected.append)

    async def status(request):
        return web.json_response({"ok": True})

    @push_endpoint
    async def push(request):
        n_bytes = 0
        async for chunk in iter_body(request, LIMITS, LIMITS.max_push_body_bytes):
            n_bytes += len(chunk)
        return web.json_response({"received": n_bytes})

    @accepts_writes
    async def note(request):
        body = await read_body(request, LIMITS)
        return web.json_response({"received": len(body)})

    async def slow(request):
        await asyncio.sleep(30)
        return web.Response(text="never")

    @long_lived
    async def stream(request):
        await asyncio.sleep(LIMITS.request_timeout_s * 2)
        return web.Response(text="streamed")

    async def sse(request):  # not marked: the limit ends once the stream has started
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for k in range(3):
            await asyncio.sleep(LIMITS.request_timeout_s)
            await resp.write(b"data: %d\n\n" % k)
        return resp

    app.router.add_route("*", "/status", status)
    app.router.add_get("/get-only", status)
    app.router.add_post("/c/a/push", push)
    app.router.add_post("/note", note)
    app.router.add_get("/slow", slow)
    app.router.add_get("/events", stream)
    app.router.add_get("/sse", sse)
    return app


async def _raw(server: TestServer, data: bytes, then: bytes = b"", pause_s: float = 0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(data)
    await writer.drain()
    if pause_s:
        await asyncio.sleep(pause_s)
        writer.write(then)
    response = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    await writer.wait_closed()
    return response


def _serve(test, token: str | None = TOKEN) -> list[str]:
    rejected: list[str] = []

    async def main():
        async with TestServer(_app(rejected, token), host="127.0.0.1") as server:
            async with ClientSession() as session:
                await test(server, session)

    asyncio.run(main())
    return rejected


def test_push_needs_the_bearer_token():
    async def test(server, session):
        url = server.make_url("/c/a/push")
        async with session.post(url, data=b"\0" * 100) as resp:
            assert resp.status == 401
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        bad = {"Authorization": "Bearer " + "x" * len(TOKEN)}
        async with session.post(url, data=b"\0" * 100, headers=bad) as resp:
            assert resp.status == 401
        good = {"Authorization": "bearer " + TOKEN}
        async with session.post(url, data=b"\0" * 100, headers=good) as resp:
            assert resp.status == 200
            assert (await resp.json()) == {"received": 100}

    assert _serve(test) == ["unauthorized", "unauthorized"]


def test_push_without_a_configured_token_is_always_refused():
    async def test(server, session):
        headers = {"Authorization": "Bearer "}
        async with session.post(server.make_url("/c/a/push"), data=b"x", headers=headers) as resp:
            assert resp.status == 401

    assert _serve(test, token=None) == ["unauthorized"]


def test_oversized_bodies_get_413():
    async def test(server, session):
        async with session.post(server.make_url("/note"), data=b"x" * 2000) as resp:
            assert resp.status == 413  # Content-Length over the limit: refused up front

        async def chunks():
            for _ in range(10):
                yield b"y" * 500

        async with session.post(server.make_url("/note"), data=chunks()) as resp:
            assert resp.status == 413  # chunked, no length: refused while reading
        auth = {"Authorization": f"Bearer {TOKEN}"}
        big = b"z" * 9000
        async with session.post(server.make_url("/c/a/push"), data=big, headers=auth) as resp:
            assert resp.status == 413
        async with session.post(server.make_url("/note"), data=b"x" * 1000) as resp:
            assert resp.status == 200

    assert _serve(test) == ["too_large"] * 3


def test_slow_body_times_out_with_408():
    async def test(server, session):
        head = (b"POST /note HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"a" * 10)
        response = await _raw(server, head)
        assert response.startswith(b"HTTP/1.1 408")
        auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
        head = (b"POST /c/a/push HTTP/1.1\r\nHost: x\r\n" + auth
                + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        response = await _raw(server, head)
        assert response.startswith(b"HTTP/1.1 408")

    rejected = _serve(test)
    assert rejected == ["body_idle", "body_idle"]


def test_slow_handler_times_out_but_streams_do_not():
    async def test(server, session):
        async with session.get(server.make_url("/slow")) as resp:
            assert resp.status == 408
        async with session.get(server.make_url("/events")) as resp:
            assert resp.status == 200
            assert await resp.text() == "streamed"
        async with session.get(server.make_url("/sse")) as resp:
            assert resp.status == 200
            assert await resp.text() == "data: 0\n\ndata: 1\n\ndata: 2\n\n"

    assert _serve(test) == ["timeout"]


def test_read_only_endpoints_refuse_writes():
    async def test(server, session):
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            async with session.request(method, server.make_url("/status")) as resp:
                assert resp.status == 405
                assert set(resp.headers["Allow"].replace(" ", "").split(",")) == {"GET", "HEAD"}
        async with session.post(server.make_url("/get-only")) as resp:
            assert resp.status == 405  # the router's own answer
        async with session.head(server.make_url("/status")) as resp:
            assert resp.status == 200
        async with session.get(server.make_url("/status")) as resp:
            assert resp.status == 200
        async with session.get(server.make_url("/status"), data=b"x" * 10) as resp:
            assert resp.status == 413  # a GET carries no body

    assert _serve(test) == ["read_only"] * 4 + ["too_large"]


def test_header_flood_is_refused_by_the_parser():
    async def test(server, session):
        headers = b"".join(b"X-H%d: v\r\n" % i for i in range(200))
        response = await _raw(server, b"GET /status HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        assert response.split(b" ", 2)[1] in (b"400", b"431")
        async with session.get(server.make_url("/status")) as resp:
            assert resp.status == 200  # and the server is still fine

    _serve(test)


def test_token_sources_and_validation(tmp_path):
    assert resolve_token(TOKEN, env={"SUBD_PUSH_TOKEN": "e" * 20}) == TOKEN
    assert resolve_token(None, env={"SUBD_PUSH_TOKEN": "e" * 20}) == "e" * 20
    (tmp_path / "subd-push-token").write_text("c" * 32 + "\n")
    assert resolve_token(None, env={"CREDENTIALS_DIRECTORY": str(tmp_path)}) == "c" * 32
    assert resolve_token(None, env={}) is None
    with pytest.raises(ConfigError, match="too short"):
        resolve_token("short", env={})


def test_bearer_parsing_and_loopback():
    assert bearer_ok(f"Bearer {TOKEN}", TOKEN)
    assert not bearer_ok(f"Basic {TOKEN}", TOKEN)
    assert not bearer_ok(f"Bearer {TOKEN}x", TOKEN)
    assert not bearer_ok(None, TOKEN)
    assert not bearer_ok("Bearer ", None)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")


def test_server_survives_the_abuse_bench_and_still_serves():
    from subd.bench.abuse import Target, _requests, run_abuse

    n_kinds = len(_requests(Target("127.0.0.1", 1), __import__("random").Random(0)))

    async def test(server, session):
        target = Target("127.0.0.1", server.port, push_path="/c/a/push")
        outcomes = await run_abuse(target, n_requests=3 * n_kinds, concurrency=8)
        assert sum(outcomes.values()) == 3 * n_kinds
        assert outcomes["401"] >= 6  # no token, wrong token (and chunked garbage) refused
        assert outcomes["timeout"] == 0  # every bad request got an answer or a hang-up
        async with session.get(server.make_url("/status")) as resp:
            assert resp.status == 200

    rejected = _serve(test)
    assert rejected.count("unauthorized") >= 6
