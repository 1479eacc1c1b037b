"""A daemon channel on the bus: wait for its lease (standby), keep it while the channel runs,
publish its ticks (:class:`~subd.bus.publisher.BusPublisher`), give it up on a clean stop."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from subd.bus.lease import ChannelLease
from subd.bus.publisher import BusPublisher
from subd.bus.stream import ChannelKeys, connect
from subd.config import BusConfig, Config
from subd.errors import ConfigError
from subd.sinks.sse.wire import SSEConfig
from subd.tasks import cancel_and_wait, start_task

log = logging.getLogger("subd.bus.channel")
SINK_NAME = "bus"  # the publisher's place among a channel's sinks (not a configured sink)


class LeaseLost(RuntimeError):
    """Another daemon holds this channel now: it stopped here (and waits as a standby)."""


class ChannelBus:
    def __init__(self, config: BusConfig, channel: str, lookahead_ms: int) -> None:
        if config.lead_ms >= lookahead_ms:
            raise ConfigError(f"[bus] lead_ms = {config.lead_ms}: must be below the channel "
                              f"{channel}'s lookahead_ms ({lookahead_ms}): the state is built "
                              f"at T(k) - lead, after the last stages had their window")
        self.config = config
        self.channel = channel
        self.redis: Any = None
        self.lease: ChannelLease | None = None
        self._keeper: asyncio.Task[None] | None = None

    @classmethod
    def configured(cls, config: Config, channel: str, lookahead_ms: int) -> ChannelBus | None:
        bus = config.section("bus", BusConfig)
        return cls(bus, channel, lookahead_ms) if bus.url else None

    @property
    def prepare_ns(self) -> int:
        """When the scheduler builds a tick's state: T(k) minus this."""
        return self.config.lead_ms * 1_000_000

    @property
    def lost(self) -> asyncio.Event:
        assert self.lease is not None
        return self.lease.lost

    async def __aenter__(self) -> ChannelBus:
        self.redis = connect(self.config.url)
        keys = ChannelKeys.of(self.config.prefix, self.channel)
        self.lease = ChannelLease(self.redis, keys, self.config.lease_ttl_ms, self.channel)
        return self

    async def acquire(self, stopping: Any = lambda: False, on_standby: Any = None) -> bool:
        """Wait for the lease (a standby waits here), then keep it renewed; False if
        ``stopping()`` said so first."""
        assert self.lease is not None
        if not await self.lease.acquire(stopping, on_standby):
            return False
        self._keeper = start_task(self.lease.keep(), f"lease:{self.channel}")
        return True

    def publisher(self, sse_options: dict[str, Any] | None) -> BusPublisher:
        """The sink-like writer; ``sse_options``: the channel's [sinks.sse] table (its D goes
        into the edges' full resyncs; the cues come laid out in each tick's state)."""
        assert self.lease is not None
        opts = {k: v for k, v in (sse_options or {}).items() if k == "latency_ms"}
        return BusPublisher(self.config, self.lease, SSEConfig.from_mapping(opts))

    async def __aexit__(self, *exc: object) -> None:
        await cancel_and_wait(self._keeper)
        self._keeper = None
        if self.lease is not None:
            await self.lease.release()
        if self.redis is not None:
            await self.redis.aclose()


async def run_held(bus: ChannelBus, channel: Any, run_once: Any) -> None:
    """Run ``run_once`` (the channel's pipeline) only while this daemon holds the lease: a
    standby waits for it; a lost lease stops the pipeline at once (``channel.abort()``) and
    raises :class:`LeaseLost`, so the supervisor restarts the channel, as a standby."""
    async with bus:
        channel.ready.set()  # the daemon serves its other channels meanwhile
        health = channel.ctx.health  # a standby is healthy: its clock runs elsewhere

        def standby(holder: str) -> None:
            health.set_state(bus.channel, "standby", f"the lease is held by {holder}")

        if not await bus.acquire(lambda: channel.stopping, standby):
            return  # stopped while a standby
        health.set_state(bus.channel, "running")  # with a fresh start-up grace
        channel.bus = bus
        watcher = start_task(_stop_when_lost(bus.lost, channel.abort),
                             f"lease-watch:{bus.channel}")
        try:
            await run_once()
        finally:
            channel.bus = None
            await cancel_and_wait(watcher)
    if bus.lost.is_set() and not channel.stopping:
        raise LeaseLost(f"channel {bus.channel}: another daemon holds its lease now")


async def _stop_when_lost(lost: asyncio.Event, abort: Any) -> None:
    await lost.wait()
    while True:  # again until the run ends: it may still be starting its pipeline
        abort()
        await asyncio.sleep(0.05)
