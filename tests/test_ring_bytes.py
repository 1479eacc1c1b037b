"""A tick's SSE event lives in its slot: encoded once by the pipeline, into a buffer made once,
and those very bytes reach a real client; a tick whose slot is gone is still published, from
the ring's spare buffer, and counted."""

from __future__ import annotations

import asyncio
import json
import time
import tracemalloc

import numpy as np
import pytest
from test_sse import Conn, connect

from subd.clock import FakeClock
from subd.history import AudioHistory
from subd.pipeline.ring import SlotRing
from subd.pipeline.scheduler import Pipeline, TickSettings
from subd.server.standalone import serve_if_configured
from subd.sinks.sse import wire
from subd.sinks.sse.sink import SSEConfig, SSESink
from subd.sources.live import FileSource
from subd.testing.recognizer import script_words
from subd.types import SAMPLE_RATE_HZ, CaptionState, TaggedWord, Word
from subd.workers.hosts import FactorySpec, RecogniserHost, TagHost
from subd.workers.process import InlineWorker

MS = 1_000_000
T0_NS = 5_000_000_000
UNIX_OFFSET_NS = 1_700_000_000_000_000_000  # due_unix_ns made deterministic for the reference


class SlotTap:
    """A sink after the SSE sink: it takes tick k's event as the SSE sink does (checking that it
    is tick k's slot, or the ring's spare when the slot is gone), and at T(k) copies the bytes
    it was handed, as they are when the SSE sink writes them."""

    name = "tap"

    def __init__(self) -> None:
        self.pipeline: Pipeline | None = None
        self._held: dict[int, tuple[memoryview, bytearray, bool]] = {}
        self.framed: dict[int, bytes] = {}
        self.buffer: dict[int, bytearray] = {}
        self.slotless: list[int] = []

    async def start(self) -> None: ...

    def prepare_event(self, tick: wire.TickEvent) -> None:
        ring = self.pipeline.ring
        slot = ring.get(tick.k)
        assert tick is (slot.event if slot is not None else ring.spare)
        self._held[tick.k] = (tick.framed, tick.buffer, slot is None)

    def publish(self, state: CaptionState) -> None:
        framed, buffer, slotless = self._held.pop(state.k)
        self.framed[state.k] = bytes(framed)
        self.buffer[state.k] = buffer
        if slotless:
            self.slotless.append(state.k)

    async def close(self) -> None: ...


class OwnEncoding:
    """A second SSE sink that is given states only, as every sink was before the slot held
    the bytes: it encodes each tick itself. The reference for byte-for-byte equality."""

    name = "own"

    def __init__(self) -> None:
        self.sink = SSESink()
        self.events: dict[int, bytes] = {}

    async def start(self) -> None: ...

    def prepare(self, state: CaptionState) -> None:
        self.sink.prepare(state)

    def publish(self, state: CaptionState) -> None:
        self.sink.publish(state)
        k, event = self.sink._history[-1]  # noqa: SLF001 - the bytes it wrote
        self.events[k] = wire.chunk(event)

    async def close(self) -> None: ...


class LapAt:
    """A burst's effect on the ring: tick k's slot is taken by tick k + N while tick k is not
    yet published: before it is prepared (at T(k − 1)), or after (at T(k) − 4 ms)."""

    name = "lap"

    def __init__(self, k: int, *, prepared: bool) -> None:
        self.k, self.prepared = k, prepared
        self.pipeline: Pipeline | None = None

    async def start(self) -> None: ...

    def _lap(self) -> None:
        ring = self.pipeline.ring
        assert ring.get(self.k) is not None
        ring.acquire(self.k + ring.n_slots)

    def prepare(self, state: CaptionState) -> None:
        if self.prepared and state.k == self.k:
            self._lap()

    def publish(self, state: CaptionState) -> None:
        if not self.prepared and state.k == self.k - 1:
            self._lap()

    async def close(self) -> None: ...


async def read_chunks(conn: Conn, out: list[bytes]) -> None:
    """The response body as it came, one HTTP/1.1 chunk (size line and all) at a time."""
    try:
        while True:
            size_line = await conn.reader.readuntil(b"\r\n")
            size = int(size_line.strip(), 16)
            data = await conn.reader.readexactly(size + 2)
            if size == 0:
                return
            out.append(size_line + data)
    except (asyncio.IncompleteReadError, ConnectionError):
        return


def run(monkeypatch, extra_sinks: list, seconds: float = 4.0) -> dict:
    """A real pipeline (scripted recogniser, fake clock) publishing to an SSE sink served by
    aiohttp, read by a real HTTP client connected before the first tick."""
    monkeypatch.setattr(wire, "unix_ns", lambda ns: ns + UNIX_OFFSET_NS)
    own_encodes: list[int] = []
    encode = SSESink._encode

    def counted(self, state):
        own_encodes.append(id(self))
        return encode(self, state)

    monkeypatch.setattr(SSESink, "_encode", counted)
    script = script_words(int(seconds * 1000 - 400) // 400)
    audio = np.zeros(int(seconds * SAMPLE_RATE_HZ), dtype=np.float32)

    async def main() -> dict:
        served = serve_if_configured(SSESink(SSEConfig(host="127.0.0.1", port=0)))
        await served.start()
        conn = await connect(served.port)
        retry = b"d\r\nretry: 1000\n\n\r\n"
        assert await asyncio.wait_for(conn.reader.readexactly(len(retry)), 10) == retry
        chunks: list[bytes] = []
        reader = asyncio.ensure_future(read_chunks(conn, chunks))
        clock = FakeClock(start_ns=T0_NS)
        history = AudioHistory(SAMPLE_RATE_HZ * 40)
        rec_spec = FactorySpec("subd.testing.recognizer:ScriptedRecognizer",
                               {"words": script, "commit_delay_ms": 600})
        rec = InlineWorker("recognise", RecogniserHost(rec_spec, history.capacity,
                                                       history=history), clock,
                           lambda r: 120 * MS)
        tag = InlineWorker("tag", TagHost(None), clock, lambda r: 5 * MS)
        tap, own = SlotTap(), OwnEncoding()
        pipeline = Pipeline(
            clock=clock, settings=TickSettings(latency_ms=1000, drain_timeout_s=60),
            source=FileSource(audio, chunk_ms=20), recogniser=rec, tagger=tag,
            history=history, sinks=[served, tap, own, *extra_sinks])
        for sink in (tap, *extra_sinks):
            sink.pipeline = pipeline
        task = asyncio.ensure_future(pipeline.run())
        await clock.run_until_done(task, limit_ns=T0_NS + int((seconds + 120) * 1e9))
        counters = task.result()
        deadline = time.monotonic() + 10
        while len(chunks) < counters.ticks and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        conn.close()
        # a client resuming from tick 5 (Last-Event-ID): the replay is kept as copies, so the
        # slot buffers encoded again since then do not show through
        late = await connect(served.port, headers={"Last-Event-ID": "5"})
        size = int((await asyncio.wait_for(late.reader.readuntil(b"\r\n"), 10)).strip(), 16)
        replay = (await asyncio.wait_for(late.reader.readexactly(size + 2), 10))[:-2]
        late.close()
        await served.close()
        reader.cancel()
        return {"pipeline": pipeline, "counters": counters, "chunks": chunks, "tap": tap,
                "own": own, "sse": served.sink, "own_encodes": own_encodes, "script": script,
                "replay": replay}

    return asyncio.run(main())


def events_of(chunks: list[bytes]) -> list[dict]:
    out = []
    for framed in chunks:
        block = framed[framed.index(b"\r\n") + 2 : -2]
        assert block.startswith(b"id: ") and block.endswith(b"\n\n"), block
        out.append(json.loads(block.split(b"\ndata: ", 1)[1]))
    return out


def words_by_index(events: list[dict]) -> list[str]:
    words: dict[int, str] = {}
    for event in events:
        for i, w in enumerate(event["words"]):
            assert words.setdefault(event["w0"] + i, w[0]) == w[0]
    assert sorted(words) == list(range(len(words)))  # no index skipped or reused
    return [words[i] for i in range(len(words))]


def test_the_client_gets_the_bytes_encoded_once_into_each_slot(monkeypatch) -> None:
    r = run(monkeypatch, [])
    pipeline, tap, chunks = r["pipeline"], r["tap"], r["chunks"]
    ring = pipeline.ring
    n_ticks = r["counters"].ticks
    assert n_ticks > 2 * ring.n_slots  # every slot is used at least twice
    # tick k on the wire is, byte for byte and framing included, what tick k's slot held
    assert len(chunks) == n_ticks
    assert chunks == [tap.framed[k] for k in range(n_ticks)]
    # ... which is what a sink encoding every state itself (as before) writes
    assert chunks == [r["own"].events[k] for k in range(n_ticks)]
    # encoded once a tick, by the pipeline, into the slots: the served sink encoded nothing
    assert id(r["sse"]) not in r["own_encodes"]
    assert sum(s.event.n_encoded for s in ring._slots) == n_ticks  # noqa: SLF001
    assert tap.slotless == [] and ring.spare.n_encoded == 0 and ring.spare_count == 0
    # the buffers were made with the ring and reused: tick k was encoded into the same
    # bytearray as tick k - N, never into a new one
    assert all(s.event.n_grown == 0 for s in ring._slots)  # noqa: SLF001
    for k in range(ring.n_slots, n_ticks):
        assert tap.buffer[k] is tap.buffer[k - ring.n_slots]
    assert len({id(b) for b in tap.buffer.values()}) == ring.n_slots
    assert r["replay"] == b"retry: 1000\n\n" + b"".join(
        framed[framed.index(b"\r\n") + 2 : -2] for framed in chunks[6:])
    # every word reached the client once, in order, at its channel index
    events = events_of(chunks)
    assert [e["k"] for e in events] == list(range(n_ticks))
    assert words_by_index(events) == [w for w, _, _ in r["script"]]
    assert r["counters"].fallbacks == 0 and r["counters"].stale_slots == 0


def test_a_tick_whose_slot_was_lapped_reaches_the_client_and_is_counted(monkeypatch) -> None:
    gone_k, after_k = 45, 60  # slot taken before tick 45 was prepared; after 60 was
    r = run(monkeypatch, [LapAt(gone_k, prepared=False), LapAt(after_k, prepared=True)])
    pipeline, tap, chunks, counters = r["pipeline"], r["tap"], r["chunks"], r["counters"]
    ring = pipeline.ring
    # both slots were taken while busy: counted stale
    assert counters.stale_slots == 2 and ring.last_stale_k == after_k
    # tick 45 had no slot at T(k) − 4 ms: published on time as a fallback, its event encoded
    # in the ring's spare buffer (counted)
    assert tap.slotless == [gone_k] and ring.spare_count == 1 and ring.spare.n_encoded == 1
    assert counters.fallbacks == 1 and counters.deadline_misses == 0
    assert len(chunks) == counters.ticks
    assert chunks[gone_k] == tap.framed[gone_k] == r["own"].events[gone_k]
    events = events_of(chunks)
    assert [e["k"] for e in events] == list(range(counters.ticks))
    assert events[gone_k]["fallback"] is True and events[gone_k]["words"] == []
    assert events[gone_k]["tentative"] == events[gone_k - 1]["tentative"]
    # tick 60 lost its slot after it was encoded: its bytes, still in the buffer (encoded
    # again only at the next tick of that slot), went out as they were, not as a fallback
    assert chunks[after_k] == tap.framed[after_k] == r["own"].events[after_k]
    assert events[after_k]["fallback"] is False
    # every tick's bytes are the ones the pipeline encoded; the SSE sink encoded none itself
    assert chunks == [tap.framed[k] for k in range(counters.ticks)]
    assert id(r["sse"]) not in r["own_encodes"]
    # no word lost or repeated: the lapped tick's words came with the next ticks
    assert words_by_index(events) == [w for w, _, _ in r["script"]]


def test_a_slot_buffer_grows_only_for_a_longer_event_and_views_out_stay_valid() -> None:
    ring = SlotRing(4)
    word = TaggedWord(Word("hello", 0, 300 * MS), "hello", punct=",", case="cap")

    def encode(k: int, n_words: int) -> wire.TickEvent:
        slot = ring.acquire(k)
        state = CaptionState(k=k, due_ns=k * 33 * MS, audio_end_ns=0,
                             committed=(word,) * n_words)
        slot.state = state
        slot.event.encode(state, 0)
        return slot.event

    event = encode(0, 1)
    first = event.buffer
    ring.release(0)
    assert event.state is None and bytes(event.framed) == b""  # nothing held for the tick
    event = encode(4, 3)  # the same slot, a short event: the same buffer
    assert event.buffer is first and event.n_grown == 0
    held = event.framed  # a view handed out (a sink's prepared tick)
    held_bytes = bytes(held)
    ring.release(4)
    event = encode(8, 400)  # longer than the buffer: a new one, once
    assert event.buffer is not first and event.n_grown == 1
    assert len(event.buffer) > wire.TICK_EVENT_BYTES
    assert bytes(held) == held_bytes  # a view out still reads its tick (the old buffer)
    assert json.loads(bytes(event.event).split(b"data: ", 1)[1])["words"][399][0] == "Hello,"
    big = event.buffer
    event = encode(12, 2)
    assert event.buffer is big and event.n_grown == 1
    # an event goes to the spare only when its slot is gone, and that is counted
    assert ring.event_for(12) is event and ring.spare_count == 0
    ring.acquire(16)  # tick 12's slot, taken before 12 was published: stale
    assert ring.event_for(12) is ring.spare and ring.spare_count == 1


@pytest.mark.parametrize("n_words", [0, 1, 37])
def test_tick_event_is_byte_for_byte_the_sse_encoding(monkeypatch, n_words: int) -> None:
    monkeypatch.setattr(wire, "unix_ns", lambda ns: ns + UNIX_OFFSET_NS)
    word = TaggedWord(Word("naïve", 0, 300 * MS), "naïve", punct=".", case="cap")
    state = CaptionState(k=123456, due_ns=7 * MS, audio_end_ns=5 * MS,
                         committed=(word,) * n_words, tentative="日本 wor", fallback=n_words == 0)
    event = wire.TickEvent(64)
    event.encode(state, 41)
    want = wire.encode_event(state.k, wire.delta_payload(state, 41, *wire.delta_rows(state)))
    assert bytes(event.event) == want and bytes(event.framed) == wire.chunk(want)


def test_steady_state_ticks_keep_no_new_memory_in_the_ring() -> None:
    """Ring after ring of ticks encoded and published: the slots' buffers are the ones made
    at the start, and nothing the ring or the encoding keeps grows."""
    ring = SlotRing(40)
    word = TaggedWord(Word("hello", 0, 300 * MS), "hello", punct=",", case="cap")
    buffers = [s.event.buffer for s in ring._slots]  # noqa: SLF001

    def tick(k: int) -> None:
        slot = ring.acquire(k)
        slot.state = CaptionState(k=k, due_ns=k * 33 * MS, audio_end_ns=k * 33 * MS,
                                  committed=(word,) * (k % 4), tentative="wor")
        slot.event.encode(slot.state, k)
        ring.release(k)

    for k in range(200):  # warm up
        tick(k)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for k in range(200, 2200):
        tick(k)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename")
                if stat.traceback[0].filename.endswith(("ring.py", "wire.py")))
    assert grown < 4096, f"the ring grew by {grown} bytes"
    assert all(a is b for a, b in zip(buffers, (s.event.buffer for s in ring._slots),  # noqa: SLF001
                                      strict=True))
    assert ring.stale_count == 0 and ring.spare_count == 0
