"""What the daemons and the edges agree on: key names, the entry format, the connection.

One stream per channel, ``PREFIX:{CHANNEL}:events``; each entry has one field ``e``, the tick's
SSE ``delta`` payload as JSON (the daemon's layout, word index and ``due_unix_ns``), so an edge
relays it without laying anything out again. The channel's lease is ``PREFIX:{CHANNEL}:lease``.
The braces are a Redis Cluster hash tag: a channel's two keys live in one slot, so the
publishing script may touch both.

The tick number ``k`` and the word index ``w0`` on the bus continue across daemons: a daemon
that takes a channel over starts where the stream ends, so viewers' ``Last-Event-ID`` stays
meaningful and no word index is reused.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

FIELD = b"e"


@dataclass(frozen=True, slots=True)
class ChannelKeys:
    stream: str
    lease: str

    @classmethod
    def of(cls, prefix: str, channel: str) -> ChannelKeys:
        return cls(f"{prefix}:{{{channel}}}:events", f"{prefix}:{{{channel}}}:lease")


def connect(url: str, *, timeout_s: float = 2.0) -> Any:
    """An asyncio Redis client that fails fast (no retries inside a command): the callers keep
    their own backlog and retry, so a Redis that is away never blocks a tick."""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return aioredis.Redis.from_url(url, socket_timeout=timeout_s,
                                   socket_connect_timeout=timeout_s,
                                   retry=Retry(NoBackoff(), 0), health_check_interval=0)


def holder_token() -> str:
    """Who holds a lease, readable in the logs of the other daemons: host, pid, and a random
    part (a restarted daemon with the same pid is someone else)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def encode_entry(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def decode_entry(fields: dict[bytes, bytes]) -> dict[str, Any] | None:
    """The payload of a stream entry; None for one that is not a tick event of this format."""
    raw = fields.get(FIELD)
    if raw is None:
        return None
    try:
        payload = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(payload, dict) or payload.get("type") != "delta":
        return None
    for key in ("k", "due_unix_ns", "audio_end_ns", "w0"):
        if not isinstance(payload.get(key), int):
            return None
    if not isinstance(payload.get("words"), list) or not isinstance(payload.get("cues"), list):
        return None
    return payload


async def stream_end(redis: Any, keys: ChannelKeys) -> tuple[int, int]:
    """(next k, next word index) after the last entry of the stream; (0, 0) if it is empty."""
    last = await redis.xrevrange(keys.stream, count=1)
    if not last:
        return 0, 0
    payload = decode_entry(last[0][1])
    if payload is None:
        return 0, 0
    return payload["k"] + 1, payload["w0"] + len(payload["words"])
