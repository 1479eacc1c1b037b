"""A channel runs on exactly one daemon: the one holding its lease in Redis.

The lease is a key holding the holder's token with a time to live (``[bus] lease_ttl_ms``).
The holder renews it every third of that; a standby daemon configured for the same channel
tries to take it as often, and gets it once the holder stopped renewing (killed, or cut off
from Redis for a whole ttl): the channel moves within ttl + ttl/3 plus its start-up.

A Redis that restarts without its data has lost the key. The holder takes it back at its next
renewal (or with its next write, :mod:`subd.bus.publisher`), while a standby does not take a
lease from a Redis that has been up for less than one ttl: so a restart of Redis does not move
channels. A holder that finds the key held by someone else has lost it: ``lost`` is set, and
its channel stops publishing at once (the publishing script checks the lease on every write,
so a holder cut off from Redis can never write over the new holder's ticks).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from subd.bus.stream import ChannelKeys, holder_token

log = logging.getLogger("subd.bus.lease")

# 1: renewed (or taken back from a Redis that lost it); 0: someone else holds it
RENEW = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
elseif holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
DOWN_RETRY_S = 0.2


class ChannelLease:
    def __init__(self, redis: Any, keys: ChannelKeys, ttl_ms: int, channel: str) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl_ms = ttl_ms
        self.channel = channel
        self.token = holder_token()
        self.lost = asyncio.Event()
        self.held = False
        self._renew = redis.register_script(RENEW)
        self._release = redis.register_script(RELEASE)
        self._down = False

    async def acquire(self, stopping: Callable[[], bool] = lambda: False,
                      on_standby: Callable[[str], None] | None = None) -> bool:
        """Wait until this daemon holds the channel (a standby waits here, telling
        ``on_standby(holder)``); False if ``stopping()`` said so first."""
        said = None
        while not stopping():
            try:
                holder = await self._try_take()
                self._up()
            except (RedisError, OSError) as exc:
                self._went_down(exc)
                await asyncio.sleep(self.ttl_ms / 1000)  # a holder gets the first chance back
                continue
            if holder is None:
                self.held = True
                self.lost.clear()
                log.info("channel %s: lease taken (%s): this daemon runs it", self.channel,
                         self.token)
                return True
            if holder != said:
                said = holder
                log.info("channel %s: standby, the lease is held by %s", self.channel, holder)
                if on_standby is not None:
                    on_standby(holder)
            await asyncio.sleep(self.ttl_ms / 3000)
        return False

    async def _try_take(self) -> str | None:
        """None if taken now; else who holds it (or why it is not taken)."""
        holder = await self.redis.get(self.keys.lease)
        if holder is not None:
            return holder.decode(errors="replace")
        info = await self.redis.info("server")
        if int(info.get("uptime_in_seconds", 0)) * 1000 < self.ttl_ms:
            return "nobody (Redis restarted: the previous holder gets the first chance)"
        if await self.redis.set(self.keys.lease, self.token, nx=True, px=self.ttl_ms):
            return None
        return "another daemon"

    async def keep(self) -> None:
        """Renew until the lease is lost (then ``lost`` is set and this returns)."""
        while True:
            try:
                ok = await self._renew(keys=[self.keys.lease], args=[self.token, self.ttl_ms])
                self._up()
            except (RedisError, OSError) as exc:
                self._went_down(exc)
                await asyncio.sleep(DOWN_RETRY_S)
                continue
            if not ok:
                self.mark_lost()
                return
            await asyncio.sleep(self.ttl_ms / 3000)

    def mark_lost(self) -> None:
        if self.held:
            log.warning("channel %s: lease lost to another daemon: stopping it here",
                        self.channel)
        self.held = False
        self.lost.set()

    async def release(self) -> None:
        """Give the lease up (a clean stop): a standby takes the channel at its next try."""
        if not self.held:
            return
        self.held = False
        try:
            await self._release(keys=[self.keys.lease], args=[self.token])
        except (RedisError, OSError):
            pass  # it expires by itself

    def _went_down(self, exc: BaseException) -> None:
        if not self._down:
            self._down = True
            log.warning("channel %s: bus unreachable (%s); retrying", self.channel, exc)

    def _up(self) -> None:
        if self._down:
            self._down = False
            log.info("channel %s: bus reachable again", self.channel)
