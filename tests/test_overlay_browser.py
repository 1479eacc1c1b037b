"""Real headless Chromium opens /overlay against a running server and finds the words.

The captions come from a *feeder*: here a scripted publisher at 30 ticks/s into an SSE sink
serving /events and /overlay. ``FEEDER`` is the one place to swap in a running ``subd stream``
(any async context manager yielding the base URL of a server with /overlay and /events).
A screenshot is kept as artifacts/overlay.png.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from subd.server.standalone import serve_if_configured
from subd.sinks.sse.sink import SSEConfig, SSESink
from subd.testing.sinks import feed, script_states, script_words

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


@asynccontextmanager
async def scripted_feeder(states=None) -> AsyncIterator[str]:
    """Serve /events and /overlay, and play ``states`` (default: the English script) once a
    client watches."""
    states = states if states is not None else script_states(script_words())
    sink = serve_if_configured(SSESink(SSEConfig(host="127.0.0.1", port=0, latency_ms=0)))
    await sink.start()

    async def feed_once_watched() -> None:
        # the page's EventSource connects first: under load Chromium can take seconds to start,
        # and a script fed before anyone watched would test the race, not the overlay
        while sink.n_clients == 0:
            await asyncio.sleep(0.05)
        await feed([sink], states)

    task = asyncio.create_task(feed_once_watched(), name="feeder")
    try:
        yield f"http://127.0.0.1:{sink.port}"
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        await sink.close()


FEEDER = scripted_feeder


@asynccontextmanager
async def chromium() -> AsyncIterator[CDP]:
    profile = tempfile.mkdtemp(prefix="subd-chromium-")
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}",
        "--remote-debugging-port=0", "--remote-allow-origins=*", "--window-size=1280,720",
        "about:blank",
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        # its own temporary files in the profile too: killed, it leaves them behind
        # (/tmp/org.chromium.Chromium.*, a few a suite run)
        env={**os.environ, "TMPDIR": profile},
    )
    try:
        ws_url = None
        while ws_url is None:
            line = await asyncio.wait_for(proc.stderr.readline(), 30)
            if not line:
                raise RuntimeError("chromium exited before DevTools came up")
            if m := re.search(rb"DevTools listening on (ws://\S+)", line):
                ws_url = m.group(1).decode()
        drain = asyncio.create_task(proc.stderr.read())
        port = int(re.search(r":(\d+)/", ws_url).group(1))
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as resp:
                pages = [t for t in await resp.json() if t["type"] == "page"]
            async with session.ws_connect(pages[0]["webSocketDebuggerUrl"],
                                          max_msg_size=0) as ws:
                yield CDP(ws)
        drain.cancel()
    finally:
        proc.kill()
        await proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


class CDP:
    """Minimal Chrome DevTools Protocol client (commands only; events are ignored)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.n = 0

    async def call(self, method: str, **params: object) -> dict:
        self.n += 1
        await self.ws.send_json({"id": self.n, "method": method, "params": params})
        while True:
            msg = json.loads((await asyncio.wait_for(self.ws.receive(), 30)).data)
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    async def js(self, expression: str) -> object:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")


async def wait_for_words(cdp: CDP, words: list[str], timeout_s: float = 30) -> str:
    """Poll the DOM until every word has been shown as committed text; returns what was seen."""
    seen = ""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        text = await cdp.js(
            "Array.from(document.querySelectorAll('#captions .committed'))"
            ".map(e => e.innerText).join(' ')"
        )
        seen += " " + (text or "").replace("\n", " ")
        if all(w in seen for w in words):
            return seen
        await asyncio.sleep(0.1)
    raise AssertionError(f"words {words} not all shown; saw: {seen[-300:]!r}")


def test_overlay_shows_words_in_real_chromium() -> None:
    async def main() -> None:
        async with FEEDER() as base, chromium() as cdp:
            await cdp.call("Page.navigate", url=f"{base}/overlay?debug=1&size=40&lines=2")
            await wait_for_words(cdp, ["Good", "evening", "news."])  # "news." only committed
            assert await cdp.js("document.querySelector('.line') !== null")
            style = await cdp.js(
                "[getComputedStyle(document.body).backgroundColor,"
                " document.querySelectorAll('script[src],link,img').length,"
                " getComputedStyle(document.querySelector('.line')).fontSize]"
            )
            assert style == ["rgba(0, 0, 0, 0)", 0, "40px"]  # transparent, self-contained
            stats = await cdp.js("window.subdOverlay")
            assert stats["connected"] and stats["missing"] == 0 and stats["events"] > 10
            assert stats["achievedLeadMs"] < 0  # no playout delay: words come after speech
            debug = await cdp.js("document.getElementById('debug').innerText")
            assert "achieved=" in debug and "L=0ms" in debug
            transparent = {"r": 0, "g": 0, "b": 0, "a": 0}
            await cdp.call("Emulation.setDefaultBackgroundColorOverride", color=transparent)
            shot = await cdp.call("Page.captureScreenshot", format="png")
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "overlay.png").write_bytes(base64.b64decode(shot["data"]))
            # Predictive subtitles: the program is delayed by 4 s, words lead it by 150 ms.
            await cdp.call("Page.navigate", url=f"{base}/overlay?delay=4000&lead=150")
            for _ in range(200):
                stats = await cdp.js("window.subdOverlay")
                if stats and stats["achievedLeadMs"] is not None:
                    break
                await asyncio.sleep(0.1)
            assert stats["minLeadMs"] == 150 and stats["cfg"]["delayMs"] == 4000

    asyncio.run(main())
    assert (ARTIFACTS / "overlay.png").stat().st_size > 1000


def test_overlay_shows_the_rest_of_a_word_joined_to_it() -> None:
    """A word committed cut short and its rest (``Word.joined``, the delta row's fourth
    element) read as one word in the roll-up overlay: "letterpress", not "letter press"."""
    words = list(script_words("Types composed to form letter press today."))
    i = next(i for i, tw in enumerate(words) if tw.text == "press")
    words[i] = dataclasses.replace(words[i], word=dataclasses.replace(words[i].word,
                                                                      joined=True))

    async def main() -> None:
        async with scripted_feeder(script_states(words)) as base, chromium() as cdp:
            await cdp.call("Page.navigate", url=f"{base}/overlay?size=40&lines=2")
            seen = await wait_for_words(cdp, ["letterpress", "today."])
            assert "letter press" not in seen

    asyncio.run(main())


def test_overlay_rejects_bad_query_with_one_line() -> None:
    async def main() -> tuple[int, str]:
        async with FEEDER() as base, aiohttp.ClientSession() as session:
            async with session.get(f"{base}/overlay?size=9999") as resp:
                return resp.status, await resp.text()

    status, text = asyncio.run(main())
    assert status == 400 and text == "overlay: size='9999' out of range (6..300)\n"
