"""SSE sink: exact bytes on the wire, heartbeats, replay/resync, slow clients, CORS."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from fractions import Fraction

import pytest

from subd.errors import ConfigError
from subd.layout.cues import token_of
from subd.server.standalone import serve_if_configured
from subd.sinks.sse.sink import SSEConfig, SSESink
from subd.testing.sinks import script_states, script_words
from subd.types import CaptionState, TaggedWord, Word

MS = 1_000_000


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunked = False
        self._buf = b""

    async def read_body(self) -> bytes:
        """The next piece of the response body (one chunk when chunked)."""
        if not self.chunked:
            return await self.reader.read(65536)
        size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
        data = await self.reader.readexactly(size + 2)
        assert data.endswith(b"\r\n")
        return data[:-2]

    async def next_block(self) -> bytes:
        """The next SSE block (event, retry or comment), with its blank-line terminator."""
        while b"\n\n" not in self._buf:
            piece = await asyncio.wait_for(self.read_body(), 10)
            if not piece:
                raise EOFError
            self._buf += piece
        block, self._buf = self._buf.split(b"\n\n", 1)
        return block + b"\n\n"

    async def next_event(self) -> tuple[int, dict]:
        while True:
            block = await self.next_block()
            if block.startswith(b"id: "):
                head, data = block.split(b"\ndata: ", 1)
                return int(head[4:]), json.loads(data)

    def close(self) -> None:
        self.writer.close()


async def connect(
    port: int, headers: dict[str, str] | None = None, version: str = "1.1", rcvbuf: int = 0,
    path: str = "/events", method: str = "GET",
) -> Conn:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    request = f"{method} {path} HTTP/{version}\r\nHost: 127.0.0.1:{port}\r\n{extra}\r\n"
    writer.write(request.encode())
    conn = Conn(reader, writer)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode().split("\r\n")
    conn.status = int(lines[0].split()[1])
    for line in lines[1:]:
        if ": " in line:
            key, value = line.split(": ", 1)
            conn.headers[key.lower()] = value
    conn.chunked = conn.headers.get("transfer-encoding") == "chunked"
    return conn


@asynccontextmanager
async def running(config: SSEConfig | None = None, **kw) -> AsyncIterator[SSESink]:
    config = config or SSEConfig(host="127.0.0.1", port=0, **kw)
    sink = serve_if_configured(SSESink(config))
    await sink.start()
    try:
        yield sink
    finally:
        await sink.close()


HELLO = TaggedWord(Word("hello", 0, 300 * MS), "hello", punct=",", case="cap")
STATE = CaptionState(k=7, due_ns=123456789, audio_end_ns=266666666, committed=(HELLO,),
                     tentative="wor")
# due_unix_ns: the same instant on CLOCK_REALTIME, read when the event is encoded (19 digits)
EVENT = (
    b'id: 7\ndata: {"type":"delta","k":7,"due_ns":123456789,"due_unix_ns":%d,'
    b'"audio_end_ns":266666666,"w0":0,'
    b'"words":[["Hello,",0,300000000]],"tentative":"wor","cues":[],"fallback":false,'
    b'"degraded":false}\n\n' % (10**18)
)
UNIX_NS = re.compile(rb'"due_unix_ns":(\d{19}),')


def same_event(got: bytes, want: bytes = EVENT) -> bool:
    """Byte for byte, but for due_unix_ns, which must be due_ns on CLOCK_REALTIME (+-50 ms)."""
    match = UNIX_NS.search(got)
    if match is None:
        return False
    unix = int(match.group(1))
    offset = time.time_ns() - time.monotonic_ns()
    if abs(unix - (123456789 + offset)) > 50 * MS:
        return False
    return UNIX_NS.sub(b'"due_unix_ns":%d,' % (10**18), got) == want


def test_wire_format_exact_bytes_http11_and_http10() -> None:
    async def main() -> None:
        async with running() as sink:
            c11 = await connect(sink.port)
            c10 = await connect(sink.port, version="1.0")
            assert c11.status == c10.status == 200
            assert c11.headers["content-type"] == "text/event-stream; charset=utf-8"
            assert c11.headers["cache-control"] == "no-cache"
            assert c11.chunked and not c10.chunked
            assert await c11.reader.readexactly(18) == b"d\r\nretry: 1000\n\n\r\n"
            sink.publish(STATE)
            framed = b"%x\r\n" % len(EVENT) + EVENT + b"\r\n"
            got = await c11.reader.readexactly(len(framed))
            assert got.startswith(b"%x\r\n" % len(EVENT)) and got.endswith(b"\r\n")
            assert same_event(got[got.index(b"\r\n") + 2 : -2])
            raw = b""
            while len(raw) < len(b"retry: 1000\n\n") + len(EVENT):
                raw += await asyncio.wait_for(c10.reader.read(65536), 10)
            assert raw.startswith(b"retry: 1000\n\n")
            assert same_event(raw[len(b"retry: 1000\n\n"):])
            c11.close()
            c10.close()

    asyncio.run(main())


def test_heartbeat_is_a_comment_line() -> None:
    async def main() -> None:
        async with running(heartbeat_ms=100) as sink:
            conn = await connect(sink.port)
            assert await conn.next_block() == b"retry: 1000\n\n"
            assert await conn.next_block() == b": hb\n\n"
            conn.close()

    asyncio.run(main())


def states(n: int | None = None, speed: int = 10) -> list[CaptionState]:
    out = list(script_states(script_words(), audio_per_tick=Fraction(speed)))
    return out[:n] if n else out


def test_last_event_id_replays_exactly_what_was_missed() -> None:
    async def main() -> None:
        async with running() as sink:
            first = await connect(sink.port)
            for state in states(10):
                sink.publish(state)
            seen = [await first.next_event() for _ in range(10)]
            again = await connect(sink.port, {"Last-Event-ID": "5"})
            assert await again.next_block() == b"retry: 1000\n\n"
            replay = [await again.next_event() for _ in range(4)]
            assert replay == seen[6:]
            first.close()
            again.close()

    asyncio.run(main())


def test_too_old_last_event_id_gets_full_resync() -> None:
    async def main() -> None:
        async with running(history_ticks=3) as sink:
            script = states(60)
            for state in script:
                sink.publish(state)
            conn = await connect(sink.port, {"Last-Event-ID": "2"})
            k, event = await conn.next_event()
            assert k == 59 and event["type"] == "full" and event["k"] == 59
            expected = [token_of(w).text for s in script for w in s.committed]
            assert event["w0"] == 0 and [w[0] for w in event["words"]] == expected
            conn.close()

    asyncio.run(main())


@pytest.mark.parametrize("cut", [3, 40, 95, 150])
def test_reconnect_with_last_event_id_loses_no_committed_word(cut: int) -> None:
    async def main() -> None:
        script = states(speed=10)
        expected = [token_of(w).text for s in script for w in s.committed]
        words: dict[int, str] = {}

        def take(event: dict) -> None:
            for i, w in enumerate(event["words"]):
                words[event["w0"] + i] = w[0]

        async with running(history_ticks=120) as sink:
            conn = await connect(sink.port)
            for state in script[:cut]:
                sink.publish(state)
            last = -1
            while last < cut // 2:  # read only part of what was sent, then drop the line
                last, event = await conn.next_event()
                take(event)
            conn.close()
            for state in script[cut : cut + 60]:  # published while disconnected
                sink.publish(state)
            conn = await connect(sink.port, {"Last-Event-ID": str(last)})
            for state in script[cut + 60 :]:
                sink.publish(state)
            while last < script[-1].k:
                last, event = await conn.next_event()
                assert event["type"] == "delta"  # replayed, no resync was needed
                take(event)
            conn.close()
        assert [words[i] for i in range(len(words))] == expected

    asyncio.run(main())


def test_client_that_does_not_read_is_skipped_then_resynced_then_dropped() -> None:
    now = [0]

    async def main() -> None:
        config = SSEConfig(host="127.0.0.1", port=0, client_buffer_bytes=4096,
                           drop_after_ms=5000)
        sink = serve_if_configured(SSESink(config, clock=lambda: now[0]))
        await sink.start()
        slow = await connect(sink.port, rcvbuf=4096)
        fast = await connect(sink.port)
        big = "x" * 60_000  # ~60 kB per event: kernel buffers fill after a few dozen
        script = states(400, speed=1)
        got = []
        for state in script:
            sink.publish(CaptionState(state.k, state.due_ns, state.audio_end_ns,
                                      state.committed, big + state.tentative))
            got.append((await fast.next_event())[0])
        assert got == list(range(400))  # the reader got every tick, in order
        assert sink.n_skipped > 0 and sink.n_clients == 2
        # The slow client now reads: old deltas, then a full resync, then live deltas again.
        ids, kinds = [], []
        reader = asyncio.create_task(_drain(slow, ids, kinds))
        for k in range(400, 440):
            sink.publish(CaptionState(k, 0, 0, (), "live"))
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        reader.cancel()
        assert "full" in kinds
        last_full = len(kinds) - 1 - kinds[::-1].index("full")
        assert set(kinds[last_full + 1 :]) == {"delta"}
        assert ids[last_full:] == list(range(ids[last_full], 440))  # live again, no gaps
        # A client that stops reading for longer than drop_after_ms is disconnected; the
        # others keep reading and stay.
        readers = [asyncio.create_task(_drain(c, [], [])) for c in (slow, fast)]
        stalled = await connect(sink.port, rcvbuf=4096)
        for k in range(440, 640):
            now[0] += 100 * MS
            sink.publish(CaptionState(k, 0, 0, (), big))
            await asyncio.sleep(0.002)
        assert sink.n_dropped == 1 and sink.n_clients == 2
        # ... with a reset: what it never read is discarded, not sent behind a FIN
        with pytest.raises(ConnectionResetError):
            while await asyncio.wait_for(stalled.reader.read(1 << 16), 10):
                pass
        for task in readers:
            task.cancel()
        stalled.close()
        slow.close()
        fast.close()
        await sink.close()

    asyncio.run(main())


async def _drain(conn: Conn, ids: list[int], kinds: list[str]) -> None:
    while True:
        k, event = await conn.next_event()
        ids.append(k)
        kinds.append(event["type"])


def test_cors_allowlist() -> None:
    async def main() -> None:
        async with running(cors_origins=("https://studio.example",)) as sink:
            ok = await connect(sink.port, {"Origin": "https://studio.example"})
            assert ok.status == 200
            assert ok.headers["access-control-allow-origin"] == "https://studio.example"
            bad = await connect(sink.port, {"Origin": "https://evil.example"})
            assert bad.status == 403 and "access-control-allow-origin" not in bad.headers
            same = await connect(sink.port, {"Origin": f"http://127.0.0.1:{sink.port}"})
            assert same.status == 200
            pre = await connect(sink.port, {"Origin": "https://studio.example"},
                                method="OPTIONS")
            assert pre.status == 204 and "Last-Event-ID" in pre.headers[
                "access-control-allow-headers"]
            for conn in (ok, bad, same, pre):
                conn.close()

    asyncio.run(main())


def test_too_many_clients_is_refused() -> None:
    async def main() -> None:
        async with running(max_clients=1) as sink:
            first = await connect(sink.port)
            second = await connect(sink.port)
            assert (first.status, second.status) == (200, 503)
            first.close()
            second.close()

    asyncio.run(main())


def test_bad_config_names_section_key_and_range() -> None:
    with pytest.raises(ConfigError, match=r"\[sinks.sse\] retry_ms = 5: must be in 100..600000"):
        SSEConfig.from_mapping({"retry_ms": 5})
    # cues are laid out once, by the pipeline ([layout]): a per-sink table is refused
    with pytest.raises(ConfigError, match=r"\[sinks.sse\] unknown key 'layout'"):
        SSEConfig.from_mapping({"layout": {"max_lines": 9}})


def test_prepare_then_publish_writes_the_same_bytes_once() -> None:
    async def main() -> None:
        async with running() as sink:
            early = await connect(sink.port)
            assert await early.next_block() == b"retry: 1000\n\n"
            sink.prepare(STATE)  # encoded at the look-ahead: nothing is written yet
            late = await connect(sink.port)  # connects between prepare and publish
            assert await late.next_block() == b"retry: 1000\n\n"
            sink.publish(STATE)
            nxt = CaptionState(k=8, due_ns=STATE.due_ns + 33 * MS, audio_end_ns=STATE.audio_end_ns,
                               committed=(), tentative="")
            sink.publish(nxt)  # published without prepare: encoded on the spot
            for conn in (early, late):
                assert same_event(await conn.next_block())  # tick 7 once, byte for byte
                assert (await conn.next_event())[0] == 8
                conn.close()

    asyncio.run(main())
