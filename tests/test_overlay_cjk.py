"""Chinese captions in real headless Chromium: the overlay joins CJK words without spaces, sets
Latin words apart, shows full-width marks, keeps lines within 16 characters, and draws the
characters with a CJK font (Debian's fonts-noto-cjk), not boxes. Screenshot:
artifacts/overlay-zh.png."""

from __future__ import annotations

import asyncio
import base64
from fractions import Fraction

import pytest
from test_cjk_layout import TEXT, tagged, words
from test_overlay_browser import ARTIFACTS, CHROMIUM, chromium, scripted_feeder

from subd.layout.cjk import line_faults
from subd.testing.sinks import script_states

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
SPOKEN = TEXT + "欢迎使用 Debian 系统,谢谢。"


def chinese_feeder():
    states = script_states(tagged(words(SPOKEN, chars_per_s=8.0)), commit_lag_ms=300,
                           audio_per_tick=Fraction(2), tail_ms=30_000)
    return scripted_feeder(states)


async def lines_when(cdp, wanted: str, timeout_s: float = 40) -> list[str]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    seen: list[str] = []
    while loop.time() < deadline:
        seen = await cdp.js("Array.from(document.querySelectorAll('#captions .line'))"
                            ".map(e => e.innerText)") or []
        if wanted in "".join(seen):
            return seen
        await asyncio.sleep(0.1)
    raise AssertionError(f"{wanted!r} not shown; saw {seen!r}")


async def fonts_of(cdp, selector: str) -> list[str]:
    await cdp.call("DOM.enable")
    await cdp.call("CSS.enable")
    for _ in range(20):
        # the overlay redraws its lines when a tentative word commits: a node looked up just
        # before that is gone by the time its fonts are asked for (look it up again)
        root = await cdp.call("DOM.getDocument")
        node = await cdp.call("DOM.querySelector", nodeId=root["root"]["nodeId"],
                              selector=selector)
        try:
            fonts = await cdp.call("CSS.getPlatformFontsForNode", nodeId=node["nodeId"])
        except RuntimeError as e:
            if "Could not find node" not in str(e):
                raise
            await asyncio.sleep(0.1)
            continue
        return [f["familyName"] for f in fonts["fonts"] if f["glyphCount"] > 0]
    raise AssertionError(f"{selector!r} was redrawn at every look-up")


def test_overlay_shows_chinese_captions_in_chromium() -> None:
    async def main() -> None:
        async with chinese_feeder() as base, chromium() as cdp:
            await cdp.call("Page.navigate", url=f"{base}/overlay?size=48&lines=2&lang=zh")
            # the last words: CJK words joined, a Latin word spaced, full-width marks
            lines = await lines_when(cdp, "谢谢。")
            assert [f for line in lines for f in line_faults(line, 16)] == []
            assert "使用 Debian 系统，谢谢。" in "".join(lines)
            fonts = await fonts_of(cdp, "#captions .committed")
            assert any("CJK" in f for f in fonts), fonts  # drawn with a CJK face, not boxes
            await cdp.call("Emulation.setDefaultBackgroundColorOverride",
                           color={"r": 0, "g": 0, "b": 0, "a": 0})
            shot = await cdp.call("Page.captureScreenshot", format="png")
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "overlay-zh.png").write_bytes(base64.b64decode(shot["data"]))
            # pop-on cues laid out by the server follow the same rules
            await cdp.call("Page.navigate", url=f"{base}/overlay?mode=popon&lang=zh")
            cue_lines = await lines_when(cdp, "。")
            assert [f for line in cue_lines for f in line_faults(line, 16)] == []

    asyncio.run(main())
    assert (ARTIFACTS / "overlay-zh.png").stat().st_size > 1000
