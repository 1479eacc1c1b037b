"""Sinks are plugins: entry points for built-ins and third parties; OBS over obs-websocket v5."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
import sys
import tomllib
from fractions import Fraction
from pathlib import Path

import pytest
from aiohttp import WSMsgType, web

from subd.errors import ConfigError
from subd.sinks import Sink, available_sinks, load_sink_factory
from subd.sinks.files import FileSinkConfig, SRTSink, VTTSink
from subd.sinks.obs import OBSConfig, OBSSink
from subd.sinks.sse.sink import SSESink
from subd.sinks.text import TextSink
from subd.testing.sinks import script_states, script_words

ROOT = Path(__file__).resolve().parents[1]
BUILT_INS = {
    "sse": "subd.sinks.sse.sink:SSESink",
    "srt": "subd.sinks.files:SRTSink",
    "vtt": "subd.sinks.files:VTTSink",
    "obs": "subd.sinks.obs:OBSSink",
}


def test_built_in_sinks_are_registered_as_entry_points() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    table = project["project"]["entry-points"]["subd.sinks"]
    for name, target in BUILT_INS.items():
        assert table.get(name) == target, f"pyproject.toml lacks subd.sinks {name} = {target}"


def test_a_third_party_sink_is_found_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    dist = tmp_path / "acme_captions-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-captions\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[subd.sinks]\nacme = acme_sink:AcmeSink\n")
    (tmp_path / "acme_sink.py").write_text(
        "class AcmeSink:\n    name = 'acme'\n"
        "    async def start(self): pass\n"
        "    def publish(self, state): pass\n"
        "    async def close(self): pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "acme" in available_sinks()
    factory = load_sink_factory("acme")
    assert isinstance(factory(), Sink)
    with pytest.raises(ConfigError, match="unknown sink 'nope'"):
        load_sink_factory("nope")
    monkeypatch.delitem(sys.modules, "acme_sink", raising=False)


def test_built_ins_implement_the_sink_protocol(tmp_path: Path) -> None:
    sinks = [SSESink(), SRTSink(FileSinkConfig(directory=str(tmp_path))),
             VTTSink(FileSinkConfig(directory=str(tmp_path))), OBSSink(), TextSink()]
    for sink in sinks:
        assert isinstance(sink, Sink)
    assert [s.name for s in sinks] == ["sse", "srt", "vtt", "obs", "text"]
    assert {s.name for s in sinks} <= set(available_sinks())


class FakeOBS:
    """A local obs-websocket v5 server: Hello/Identify/Identified/Request/RequestResponse."""

    def __init__(self, password: str) -> None:
        self.password = password
        self.captions: list[str] = []
        self.identified = 0
        self.auth_failures = 0
        self.port = 0

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=("obswebsocket.json",))
        await ws.prepare(request)
        assert ws.ws_protocol == "obswebsocket.json"
        salt, challenge = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
        await ws.send_json({"op": 0, "d": {"obsWebSocketVersion": "5.5.0", "rpcVersion": 1,
                                           "authentication": {"challenge": challenge,
                                                              "salt": salt}}})
        identify = await ws.receive_json()
        secret = base64.b64encode(hashlib.sha256((self.password + salt).encode()).digest())
        expected = base64.b64encode(hashlib.sha256(secret + challenge.encode()).digest())
        if identify["op"] != 1 or identify["d"].get("authentication") != expected.decode():
            self.auth_failures += 1
            await ws.close(code=4009, message=b"Authentication failed.")
            return ws
        self.identified += 1
        await ws.send_json({"op": 2, "d": {"negotiatedRpcVersion": 1}})
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            req = msg.json()
            assert req["op"] == 6
            d = req["d"]
            ok = d["requestType"] == "SendStreamCaption" and isinstance(
                d.get("requestData", {}).get("captionText"), str)
            if ok:
                self.captions.append(d["requestData"]["captionText"])
            await ws.send_json({"op": 7, "d": {
                "requestType": d["requestType"], "requestId": d["requestId"],
                "requestStatus": {"result": ok, "code": 100 if ok else 204}}})
        return ws

    async def start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/", self.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001
        return runner


async def feed_obs(sink: OBSSink, server: FakeOBS, *, want_captions: bool) -> None:
    await sink.start()
    for state in script_states(script_words(), audio_per_tick=Fraction(10)):
        sink.publish(state)
        await asyncio.sleep(0.005)
    for _ in range(200):  # let the last caption through
        if not want_captions or (sink._pending is None and sink.n_acked == sink.n_sent):
            break
        await asyncio.sleep(0.02)
    await sink.close()


def test_obs_receives_committed_captions_after_authenticating() -> None:
    async def main() -> tuple[FakeOBS, OBSSink]:
        server = FakeOBS("s3cret")
        runner = await server.start()
        sink = OBSSink(OBSConfig(url=f"ws://127.0.0.1:{server.port}/", password="s3cret",
                                 min_interval_ms=0))
        await feed_obs(sink, server, want_captions=True)
        await runner.cleanup()
        return server, sink

    server, sink = asyncio.run(main())
    assert server.identified == 1 and server.auth_failures == 0
    assert server.captions and sink.n_acked == len(server.captions) and sink.n_rejected == 0
    for caption in server.captions:
        lines = caption.split("\n")
        assert len(lines) <= 2 and all(len(line) <= 32 for line in lines)  # CEA-608 sized
    assert server.captions[-1].endswith("good night.")
    spoken = " ".join(server.captions)
    assert "Lyon, 25 percent" in spoken.replace("\n", " ")


def test_obs_wrong_password_is_counted_and_never_crashes_the_sink() -> None:
    async def main() -> tuple[FakeOBS, OBSSink]:
        server = FakeOBS("right")
        runner = await server.start()
        sink = OBSSink(OBSConfig(url=f"ws://127.0.0.1:{server.port}/", password="wrong",
                                 reconnect_ms=50))
        await feed_obs(sink, server, want_captions=False)
        await runner.cleanup()
        return server, sink

    server, sink = asyncio.run(main())
    assert server.auth_failures >= 1 and server.identified == 0 and server.captions == []
    assert sink.n_connect_failures >= 1 and not sink.connected


def test_obs_absent_is_retried_quietly() -> None:
    async def main() -> OBSSink:
        sink = OBSSink(OBSConfig(url="ws://127.0.0.1:9/", reconnect_ms=20))
        await sink.start()
        for state in list(script_states(script_words()))[:50]:
            sink.publish(state)
            await asyncio.sleep(0.002)
        await sink.close()
        return sink

    sink = asyncio.run(main())
    assert sink.n_connect_failures >= 1 and sink.n_sent == 0


def test_obs_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"\[sinks.obs\] url = 'http://x'"):
        OBSConfig(url="http://x")
    with pytest.raises(ConfigError, match=r"\[sinks.obs\] mode"):
        OBSSink.from_mapping({"mode": "paint-on"})
