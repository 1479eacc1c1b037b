"""``GET /overlay``: one self-contained HTML page (an OBS/CasparCG/vMix browser source).

The page (overlay.html, package data) opens ``/events`` with EventSource and shows committed
text with the tentative tail styled apart, on a transparent background. Query parameters:

=========  ==========================================================  =========
font       CSS font family                                  Noto Sans + CJK faces
lang       zh | ja | ... : the page's language (ja: Japanese glyph forms)  (none)
size       font size in px (6..300)                                    36
color      CSS colour of the text                                      #ffffff
position   top | middle | bottom                                       bottom
lines      lines shown (1..8)                                          2
chars      characters per line (10..120)                               42
cjk_chars  characters per line of Chinese/Japanese text (4..60)        16
mode       rollup (words as committed) | popon (whole cues)            rollup
delay      playout delay L of the program, ms (0..600000)              0
lead       show words this many ms before they are heard (0..10000)    150
box        1: dark box behind the lines, 0: outlined text              1
debug      1: show k, L, lead and the achieved lead in a corner        0
events     URL of the event stream                                     events
=========  ==========================================================  =========

Predictive subtitles: with the program delayed by L, each word is shown ``lead`` ms before the
viewer hears it; a word that arrives too late for that is shown at once, and the achieved lead is
reported (``window.subdOverlay.achievedLeadMs`` / ``minLeadMs``, and the debug corner).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from aiohttp import web

_RANGES = {
    "size": (6, 300),
    "lines": (1, 8),
    "chars": (10, 120),
    "cjk_chars": (4, 60),
    "delay": (0, 600_000),
    "lead": (0, 10_000),
}
_CHOICES = {"position": ("top", "middle", "bottom"), "mode": ("rollup", "popon"),
            "box": ("0", "1"), "debug": ("0", "1")}
_LANG = re.compile(r"^[a-z]{2,3}(-[A-Za-z]{2,4})?$")
_SAFE_TEXT = re.compile(r"^[#\w ,.'\"()%/:-]{1,120}$")


@cache
def overlay_html() -> bytes:
    return resources.files("subd.server").joinpath("overlay.html").read_bytes()


def check_query(query: dict[str, str]) -> str | None:
    """A one-line complaint about the first bad query parameter, or None."""
    for key, (lo, hi) in _RANGES.items():
        if key in query:
            try:
                value = float(query[key])
            except ValueError:
                return f"overlay: {key}={query[key]!r} is not a number ({lo}..{hi})"
            if not lo <= value <= hi:
                return f"overlay: {key}={query[key]!r} out of range ({lo}..{hi})"
    for key, choices in _CHOICES.items():
        if key in query and query[key] not in choices:
            return f"overlay: {key}={query[key]!r} must be one of {', '.join(choices)}"
    if "lang" in query and not _LANG.match(query["lang"]):
        return f"overlay: lang={query['lang']!r} is not a language code (zh, ja, zh-Hant)"
    for key in ("font", "color", "events"):
        if key in query and not _SAFE_TEXT.match(query[key]):
            return f"overlay: {key}={query[key]!r} has characters that are not allowed"
    return None


async def handle_overlay(request: web.Request) -> web.Response:
    problem = check_query(dict(request.query))
    if problem is not None:
        return web.Response(status=400, text=problem + "\n")
    return web.Response(
        body=overlay_html(),
        content_type="text/html",
        charset="utf-8",
        headers={
            "Cache-Control": "no-cache",
            # Self-contained: nothing but inline style/script and the event stream loads.
            "Content-Security-Policy": (
                "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
                "connect-src 'self' http: https:"
            ),
        },
    )
