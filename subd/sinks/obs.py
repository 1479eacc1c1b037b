"""OBS Studio through obs-websocket v5: committed captions as ``SendStreamCaption`` requests.

OBS encodes the caption text as CEA-608 into the outgoing stream, hence 32-character lines by
default. Protocol (obs-websocket 5.x, subprotocol ``obswebsocket.json``): the server sends
Hello (op 0) with an optional auth challenge; we answer Identify (op 1) with
``base64(sha256(base64(sha256(password + salt)) + challenge))``; the server confirms with
Identified (op 2); each caption is a Request (op 6) answered by a RequestResponse (op 7).

Only committed text is sent (broadcast captions cannot show revisions). ``publish`` only keeps
the latest text; a background task sends it at most every ``min_interval_ms``, reconnects after
failures, and counts rejected requests. OBS being absent or refusing never stalls the daemon.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from subd.layout.cues import LayoutConfig, RollUp
from subd.sinks import worth_logging
from subd.tasks import cancel_and_wait, start_task
from subd.types import CaptionState, Cue
from subd.validate import check_choice, check_range, from_mapping

log = logging.getLogger(__name__)
SUBPROTOCOL = "obswebsocket.json"
OP_HELLO, OP_IDENTIFY, OP_IDENTIFIED, OP_REQUEST, OP_RESPONSE = 0, 1, 2, 6, 7
CLOSE_AUTH_FAILED = 4009


@dataclass(frozen=True, slots=True)
class OBSConfig:
    url: str = "ws://127.0.0.1:4455"
    password: str = ""
    password_env: str = ""  # name of an environment variable holding the password
    mode: str = "rollup"  # rollup: last lines as words commit; popon: each finished cue
    min_interval_ms: int = 300
    reconnect_ms: int = 2000
    connect_timeout_ms: int = 5000
    # roll-up lines (popon cues come laid out by the pipeline: the channel's [layout])
    layout: LayoutConfig = field(
        default_factory=lambda: LayoutConfig(max_chars_per_line=32, section="sinks.obs.layout")
    )
    section: str = "sinks.obs"

    def __post_init__(self) -> None:
        s = self.section
        if not self.url.startswith(("ws://", "wss://")):
            from subd.errors import ConfigError

            raise ConfigError(f"[{s}] url = {self.url!r}: must start with ws:// or wss://")
        check_choice(s, "mode", self.mode, ("rollup", "popon"))
        check_range(s, "min_interval_ms", self.min_interval_ms, 0, 60_000)
        check_range(s, "reconnect_ms", self.reconnect_ms, 10, 600_000)
        check_range(s, "connect_timeout_ms", self.connect_timeout_ms, 10, 600_000)


def obs_auth(password: str, salt: str, challenge: str) -> str:
    secret = base64.b64encode(hashlib.sha256((password + salt).encode()).digest()).decode()
    return base64.b64encode(hashlib.sha256((secret + challenge).encode()).digest()).decode()


class OBSSink:
    name = "obs"

    def __init__(self, config: OBSConfig | None = None) -> None:
        self.config = config or OBSConfig()
        self._rollup = RollUp(self.config.layout)
        self._open: Cue | None = None  # popon: the latest tick's open cue
        self._pending: str | None = None
        self._last_sent: str | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connected = False
        self.n_sent = 0
        self.n_acked = 0
        self.n_rejected = 0
        self.n_connect_failures = 0

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> OBSSink:
        return cls(from_mapping(OBSConfig, "sinks.obs", data))

    def _password(self) -> str:
        if self.config.password_env:
            return os.environ.get(self.config.password_env, "")
        return self.config.password

    async def start(self) -> None:
        self._task = start_task(self._run(), "obs-websocket")

    def publish(self, state: CaptionState) -> None:
        if self.config.mode == "rollup":
            if not state.committed:
                return
            self._rollup.push(state.committed)
            text = "\n".join(line.committed for line in self._rollup.display() if line.committed)
        else:
            self._open = next((c for c in state.cues if not c.committed), None)
            cues = [c for c in state.cues if c.committed]  # laid out by the pipeline
            if not cues:
                return
            text = "\n".join(cues[-1].lines)
        if text and text != self._last_sent:
            self._pending = text
            self._wake.set()

    async def close(self) -> None:
        if self.config.mode == "popon" and self._open is not None and self.connected:
            self._pending = "\n".join(self._open.lines)  # the last cue, cut short
            self._wake.set()
            await asyncio.sleep(0)
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        timeout = aiohttp.ClientWSTimeout(ws_close=self.config.connect_timeout_ms / 1000)
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    async with session.ws_connect(
                        self.config.url, protocols=(SUBPROTOCOL,), timeout=timeout,
                        heartbeat=10.0,
                    ) as ws:
                        await self._identify(ws)
                        self.connected = True
                        log.info("OBS: connected to %s", self.config.url)
                        await self._serve(ws)
                except (aiohttp.ClientError, OSError, TimeoutError, ConnectionError) as exc:
                    self._connect_failed(str(exc) or type(exc).__name__)
                finally:
                    self.connected = False
                await asyncio.sleep(self.config.reconnect_ms / 1000)

    def _connect_failed(self, why: str) -> None:
        self.n_connect_failures += 1
        if self.n_connect_failures == 1 or self.n_connect_failures % 30 == 0:
            log.warning("OBS: %s (%s); %d failures, retrying every %d ms", self.config.url,
                        why, self.n_connect_failures, self.config.reconnect_ms)

    async def _identify(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        wait_s = self.config.connect_timeout_ms / 1000
        hello = await ws.receive(timeout=wait_s)
        if hello.type != aiohttp.WSMsgType.TEXT or hello.json().get("op") != OP_HELLO:
            raise ConnectionError("no obs-websocket Hello")
        d = hello.json()["d"]
        identify: dict[str, Any] = {"rpcVersion": 1, "eventSubscriptions": 0}
        auth = d.get("authentication")
        if auth:
            identify["authentication"] = obs_auth(
                self._password(), auth["salt"], auth["challenge"]
            )
        await ws.send_json({"op": OP_IDENTIFY, "d": identify})
        reply = await ws.receive(timeout=wait_s)
        if reply.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
            code = ws.close_code
            if code == CLOSE_AUTH_FAILED:
                raise ConnectionError("authentication failed: check the obs-websocket password")
            raise ConnectionError(f"closed during Identify (code {code})")
        if reply.type != aiohttp.WSMsgType.TEXT or reply.json().get("op") != OP_IDENTIFIED:
            raise ConnectionError("no Identified reply")

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        reader = start_task(self._read(ws), "obs-websocket-reader")
        try:
            while not reader.done():
                if self._pending is None:
                    waiter = start_task(self._wake.wait(), "obs-wake")
                    await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    self._wake.clear()
                    continue
                text, self._pending = self._pending, None
                await ws.send_json({"op": OP_REQUEST, "d": {
                    "requestType": "SendStreamCaption",
                    "requestId": uuid.uuid4().hex,
                    "requestData": {"captionText": text},
                }})
                self._last_sent = text
                self.n_sent += 1
                await asyncio.sleep(self.config.min_interval_ms / 1000)
            reader.result()
        finally:
            reader.cancel()

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = msg.json()
            if data.get("op") != OP_RESPONSE:
                continue
            status = data.get("d", {}).get("requestStatus", {})
            if status.get("result"):
                self.n_acked += 1
            else:
                self.n_rejected += 1
                if worth_logging(self.n_rejected):
                    log.warning("OBS refused a caption (code %s: %s); %d refused so far",
                                status.get("code"), status.get("comment", ""), self.n_rejected)
        raise ConnectionError(f"connection closed (code {ws.close_code})")
