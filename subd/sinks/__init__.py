"""Sinks: where published caption states go (SSE, overlay, SRT/VTT files, plugins).

A sink implements :class:`Sink`. The publisher calls ``publish`` once per tick from the event
loop; it must return at once (queue, never block or await I/O inline), so that one slow sink can
never delay the clock or another sink. A sink may also define ``prepare(state)``: the
publisher calls it at T(k) − 2 ms with the state it will publish at T(k), so the sink can lay
out and encode ahead and ``publish`` only writes (the SSE sink does). Sinks are looked up by
name in the entry-point group ``subd.sinks``; the built-in sinks register the same way (see
pyproject.toml).

May import: ``subd.layout`` and the top-level modules; never ``subd.server``, ``subd.pipeline``
or ``subd.service`` (they call the sinks, not the other way round).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from subd.types import CaptionState

ENTRY_POINT_GROUP = "subd.sinks"
LOG_EVERY = 100  # a failure repeated at every tick is logged the first time, then every 100th


def worth_logging(n: int) -> bool:
    """Log the ``n``-th occurrence of one repeated failure? (30 lines a second otherwise)"""
    return n == 1 or n % LOG_EVERY == 0


@runtime_checkable
class Sink(Protocol):
    name: str

    async def start(self) -> None: ...

    def publish(self, state: CaptionState) -> None: ...

    async def close(self) -> None: ...


def available_sinks() -> dict[str, Any]:
    """Name -> factory for every sink registered under ``subd.sinks``."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_sink_factory(name: str) -> Any:
    eps = available_sinks()
    if name not in eps:
        from subd.errors import ConfigError

        known = ", ".join(sorted(eps)) or "none"
        raise ConfigError(f"unknown sink {name!r} (registered sinks: {known})")
    return eps[name].load()
