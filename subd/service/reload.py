"""A channel's configuration reload, in two steps: ``prepare`` builds and checks everything a
new configuration changes (sinks, latency, events log), ``commit`` switches over between two
ticks (the prompt too: the next update carries it); a channel whose source or tick rate changed
is restarted instead (``needs_restart``).
:class:`ChannelReload` is mixed into :class:`~subd.service.channel.DaemonChannel`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from subd.config import ChannelSpec
from subd.errors import ConfigError
from subd.service.build import build_layout, build_sink, layout_key, sink_options
from subd.sinks.events_log import EventsLog

log = logging.getLogger("subd.service.daemon")


@dataclass
class ReloadPlan:
    """What a reload will change on one channel, built (and checked) before anything changes."""

    spec: ChannelSpec
    sinks: dict[str, tuple[Any, dict[str, Any]]] = field(default_factory=dict)  # name -> new
    events_path: str | None = None

    async def discard(self) -> None:
        self.sinks.clear()  # built, never started: nothing to close


class ChannelReload:
    """The reload half of :class:`~subd.service.channel.DaemonChannel` (which owns every
    attribute used here: spec, ctx, pipeline, sinks, events)."""

    name: str
    spec: ChannelSpec
    ctx: Any
    pipeline: Any
    sinks: dict[str, Any]
    events: EventsLog | None
    _sink_opts: dict[str, dict[str, Any]]
    _layout_key: tuple[str, str] | None

    def needs_restart(self, spec: ChannelSpec) -> bool:
        """A new source or tick rate cannot be switched to on a running pipeline."""
        same_tick = dataclasses.replace(self.spec.tick, latency_ms=0) == \
            dataclasses.replace(spec.tick, latency_ms=0)
        return self.pipeline is None or not same_tick or self.spec.source != spec.source

    async def prepare(self, spec: ChannelSpec) -> ReloadPlan:
        tick = spec.tick
        if not tick.lookahead_ms < tick.latency_ms <= self.spec.tick.max_latency_ms:
            raise ConfigError(f"[channels.{self.name}.tick] latency_ms = {tick.latency_ms}: "
                              f"must be in {tick.lookahead_ms + 1}.."
                              f"{self.spec.tick.max_latency_ms} (max_latency_ms at start)")
        plan = ReloadPlan(spec)
        cfg = self.ctx.config
        for name in spec.sinks.enabled:
            opts = sink_options(cfg, name, spec)
            old = self._sink_opts.get(name)
            if "latency_ms" in opts and old is not None:
                old = {**old, "latency_ms": opts["latency_ms"]}  # SSE: patched in place
            if name in self.sinks and old == opts:
                continue  # unchanged
            plan.sinks[name] = (build_sink(name, opts), opts)  # checks the options
        if spec.events.path != self.spec.events.path:
            plan.events_path = spec.events.path
        return plan

    async def commit(self, plan: ReloadPlan, layout: Any | None) -> None:
        p, spec = self.pipeline, plan.spec
        if spec.tick.latency_ms != p.settings.latency_ms:
            for attempt in range(20):
                try:
                    p.set_latency(spec.tick.latency_ms)
                    break
                except RuntimeError:
                    if attempt == 19:
                        raise
                    await asyncio.sleep(0.05)
        sse = self.sse
        if sse is not None and hasattr(sse.config, "latency_ms"):
            sse.config = dataclasses.replace(sse.config, latency_ms=spec.tick.latency_ms)
        old = {n: s for n, s in self.sinks.items()
               if (n not in spec.sinks.enabled or n in plan.sinks) and n != "bus"}
        sinks = {n: self.sinks[n] if n not in plan.sinks else plan.sinks[n][0]
                 for n in spec.sinks.enabled}
        if "bus" in self.sinks:  # the bus publisher (subd.bus.channel.SINK_NAME) stays
            sinks["bus"] = self.sinks["bus"]
        self.sinks, p.sinks[:] = sinks, list(sinks.values())  # one step: no tick is missed
        for name, (_, opts) in plan.sinks.items():
            self._sink_opts[name] = opts
        for sink in old.values():  # finalise the old files before the new sinks adopt them
            await sink.close()
        for name in plan.sinks:
            try:
                await sinks[name].start()
            except Exception:  # noqa: BLE001 - cannot roll back now; the others run on
                log.exception("reload: channel %s: sink %s did not start", self.name, name)
        plan.sinks.clear()
        if plan.events_path is not None:
            self._swap_events(plan.events_path)
        key = layout_key(self.ctx.layout_spec, self.ctx.config)
        if layout is not None and key != self._layout_key:  # [layout] or its factory changed
            p.set_layout(build_layout(self.ctx.layout_spec, self.ctx.config))  # its own
            self._layout_key = key
        prompt = spec.prompt_in(self.ctx.config.recognizer)
        if prompt != p.prompt:  # the next update carries it to the recogniser
            log.info("reload: channel %s: names and terms to expect now %r", self.name, prompt)
            p.prompt = prompt
        self.spec = spec

    def _swap_events(self, path: str) -> None:
        from subd.pipeline.ticks import fps_text

        p = self.pipeline
        new = EventsLog(path) if path else None
        if new is not None:
            g = p.grid
            new.write_start(g.t0_ns, fps_text(g.fps), g.latency_ns // 1_000_000,
                            g.lookahead_ns // 1_000_000)
        old, self.events, p.events = self.events, new, new
        if old is not None:
            old.close()
