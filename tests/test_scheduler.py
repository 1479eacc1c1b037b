"""The tick scheduler on a fake clock: exact publication, fallbacks, stale slots, degraded
mode, and committed words that are never retracted under any interleaving of stage delays."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subd.clock import FakeClock
from subd.history import AudioHistory
from subd.pipeline.scheduler import PREPARE_NS, Pipeline, TickSettings
from subd.sinks.events_log import EventsLog, read_events
from subd.sources.live import FileSource
from subd.testing.recognizer import script_words
from subd.types import SAMPLE_RATE_HZ, AudioChunk, CaptionState
from subd.workers.hosts import FactorySpec, RecogniserHost, TagHost, TagRequest
from subd.workers.process import InlineWorker

MS = 1_000_000
T0_NS = 5_000_000_000


class ListSink:
    name = "list"

    def __init__(self) -> None:
        self.states: list[CaptionState] = []
        self.prepared: list[tuple[int, CaptionState]] = []  # (clock time, state)
        self.clock: FakeClock | None = None

    async def start(self) -> None: ...

    def prepare(self, state: CaptionState) -> None:
        self.prepared.append((self.clock.now_ns() if self.clock else 0, state))

    def publish(self, state: CaptionState) -> None:
        self.states.append(state)

    async def close(self) -> None: ...


class BurstSource:
    """All the audio arrives at once at t0 (a network burst)."""

    live = False
    pullable = True

    def __init__(self, audio: np.ndarray) -> None:
        self.audio = audio

    async def start(self, clock) -> int:
        return clock.now_ns()

    async def chunks(self):
        yield AudioChunk(0, self.audio)


@dataclass
class Run:
    pipeline: Pipeline
    sink: ListSink
    counters: object
    start: dict
    ticks: list[dict]
    script: list[tuple[str, int, int]] = field(default_factory=list)

    def committed_texts(self) -> list[str]:
        return [tw.text for s in self.sink.states for tw in s.committed]


def run_pipeline(tmp_path, *, seconds: float = 6.0, fps: str = "30", latency_ms: int = 1000,
                 lookahead_ms: int = 150, rec_delay=lambda r: 120 * MS,
                 tag_delay=lambda r: 5 * MS, burst: bool = False, min_update_ms: int = 200,
                 commit_delay_ms: int = 600) -> Run:
    n_words = int(seconds * 1000 - 400) // 400
    script = script_words(n_words)
    audio = np.zeros(int(seconds * SAMPLE_RATE_HZ), dtype=np.float32)
    path = tmp_path / "events.jsonl"

    async def main():
        clock = FakeClock(start_ns=T0_NS)
        history = AudioHistory(SAMPLE_RATE_HZ * 40)
        rec_spec = FactorySpec("subd.testing.recognizer:ScriptedRecognizer",
                               {"words": script, "commit_delay_ms": commit_delay_ms})
        rec = InlineWorker("recognise", RecogniserHost(rec_spec, history.capacity,
                                                       history=history), clock, rec_delay)
        tag = InlineWorker("tag", TagHost(None), clock, tag_delay)
        source = BurstSource(audio) if burst else FileSource(audio, chunk_ms=20)
        sink = ListSink()
        sink.clock = clock
        events = EventsLog(path)
        pipeline = Pipeline(
            clock=clock,
            settings=TickSettings(fps=fps, latency_ms=latency_ms, lookahead_ms=lookahead_ms,
                                  min_update_ms=min_update_ms, drain_timeout_s=60),
            source=source, recogniser=rec, tagger=tag, history=history, sinks=[sink],
            events=events)
        task = asyncio.ensure_future(pipeline.run())
        await clock.run_until_done(task, limit_ns=T0_NS + int((seconds + 120) * 1e9))
        events.close()
        return pipeline, sink, task.result()

    pipeline, sink, counters = asyncio.run(main())
    start, ticks = read_events(path)
    return Run(pipeline, sink, counters, start, ticks, script)


def expected_due_ns(k: int, fps: Fraction, latency_ms: int) -> int:
    return T0_NS + int((k + 1) * Fraction(10**9) / fps) + latency_ms * MS


def test_every_tick_is_published_exactly_at_its_due_time(tmp_path):
    run = run_pipeline(tmp_path, fps="30000/1001", latency_ms=1200)
    fps = Fraction(30000, 1001)
    assert run.start == {"type": "start", "t0_ns": T0_NS, "fps": "30000/1001",
                         "latency_ms": 1200, "lookahead_ms": 150}
    assert len(run.ticks) > 150
    for i, tick in enumerate(run.ticks):
        assert tick["k"] == i
        assert tick["due_ns"] == expected_due_ns(i, fps, 1200)
        assert tick["sent_ns"] == tick["due_ns"]
    assert run.counters.deadline_misses == 0
    assert run.counters.fallbacks == 0
    # each state was handed to the sink to prepare PREPARE_NS (4 ms) before it was published
    assert [state for _, state in run.sink.prepared] == run.sink.states
    for (t_ns, state) in run.sink.prepared:
        assert t_ns == state.due_ns - PREPARE_NS
    # every scripted word reached the viewer once, in order, after its audio ended
    assert run.committed_texts() == [w for w, _, _ in run.script]
    for state in run.sink.states:
        for tw in state.committed:
            assert tw.word.end_ns <= state.audio_end_ns


def test_events_log_lines_carry_committed_words_with_audio_times(tmp_path):
    run = run_pipeline(tmp_path, seconds=3.0)
    words = [c for t in run.ticks for c in t["committed"]]
    assert [c["w"] for c in words] == [w for w, _, _ in run.script]
    assert [(c["start_ms"], c["end_ms"]) for c in words] == [(s, e) for _, s, e in run.script]
    assert set(run.ticks[0]) == {"type", "k", "due_ns", "sent_ns", "fallback", "committed",
                                 "tentative"}
    # words show as tentative before they are committed
    assert any(t["tentative"] for t in run.ticks)


def test_a_late_tag_stage_publishes_the_previous_state_as_fallback(tmp_path):
    slow = set()

    def tag_delay(req: TagRequest) -> int:
        if req.k >= 60 and not slow:
            slow.add(req.k)
            return 50 * MS  # past the 40 ms look-ahead window, not yet 2 periods
        return 5 * MS

    run = run_pipeline(tmp_path, tag_delay=tag_delay, lookahead_ms=40)
    assert run.counters.degraded_ticks == 0
    fallbacks = [s for s in run.sink.states if s.fallback]
    assert fallbacks, "the late tick must be published as a fallback"
    assert run.counters.fallbacks == len(fallbacks)
    for s in fallbacks:
        prev = run.sink.states[s.k - 1]
        assert s.committed == () and s.tentative == prev.tentative
        assert s.due_ns == run.ticks[s.k]["due_ns"] == run.ticks[s.k]["sent_ns"]
    # the late result joined a later tick: nothing was lost or repeated
    assert run.committed_texts() == [w for w, _, _ in run.script]


def test_a_burst_of_audio_takes_no_slot_and_every_tick_is_on_time(tmp_path):
    """All the audio at once: it goes to the shared history only (a slot holds a tick's
    prepared state, not its audio), so the burst laps no slot and no tick falls back."""
    run = run_pipeline(tmp_path, burst=True, seconds=5.0)
    assert run.counters.stale_slots == 0
    assert [t["k"] for t in run.ticks] == list(range(len(run.ticks)))
    assert all(t["sent_ns"] == t["due_ns"] for t in run.ticks)
    assert len(run.ticks) > run.pipeline.ring.n_slots
    assert run.committed_texts() == [w for w, _, _ in run.script]


def test_cues_are_laid_out_once_in_the_pipeline_and_each_closes_once(tmp_path):
    """Every sink takes the cues from the state: each closed cue is in exactly one state, in
    order, holding the committed words in order; the last open cue closes at the last tick."""
    run = run_pipeline(tmp_path, seconds=14.0)
    closed = [c for s in run.sink.states for c in s.cues if c.committed]
    assert len(closed) >= 2
    assert [c.index for c in closed] == list(range(1, len(closed) + 1))
    assert " ".join(" ".join(c.lines) for c in closed).split() == run.committed_texts()
    assert all(c.committed for c in run.sink.states[-1].cues)
    fallbacks = [s for s in run.sink.states if s.fallback]
    assert all(not c.committed for s in fallbacks for c in s.cues)  # never a closed cue twice


def test_degraded_mode_starts_when_the_tag_stage_overruns_two_periods(tmp_path):
    period_ms = 1000 / 30

    def once_from_k45(factor: float):
        done = []

        def delay(req: TagRequest) -> int:
            if req.k >= 45 and not done:
                done.append(req.k)
                return int(factor * period_ms * MS)
            return 5 * MS

        return delay

    overrun = once_from_k45(3.0)

    run = run_pipeline(tmp_path, tag_delay=overrun)
    degraded = [s for s in run.sink.states if s.degraded]
    assert run.counters.degraded_ticks >= 1
    assert len(degraded) == run.counters.degraded_ticks
    assert all(not s.fallback for s in degraded)
    assert run.committed_texts() == [w for w, _, _ in run.script]

    calm = run_pipeline(tmp_path, tag_delay=once_from_k45(1.9))
    assert calm.counters.degraded_ticks == 0


def test_a_slow_recogniser_delays_words_but_never_stalls_the_clock(tmp_path):
    run = run_pipeline(tmp_path, rec_delay=lambda r: 900 * MS, latency_ms=800)
    assert all(t["sent_ns"] == t["due_ns"] for t in run.ticks)
    assert run.counters.recognition_behind > 0
    assert run.committed_texts() == [w for w, _, _ in run.script]


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), latency_ms=st.sampled_from([300, 700, 1500]),
       min_update_ms=st.sampled_from([0, 100, 300]), lookahead_ms=st.sampled_from([40, 150]))
def test_committed_words_are_never_retracted_under_any_interleaving(tmp_path, seed, latency_ms,
                                                                     min_update_ms, lookahead_ms):
    rng = random.Random(seed)
    run = run_pipeline(
        tmp_path, seconds=4.0, latency_ms=latency_ms, min_update_ms=min_update_ms,
        lookahead_ms=lookahead_ms,
        rec_delay=lambda r: rng.choice([1, 30, 120, 400, 1300]) * MS,
        tag_delay=lambda r: rng.choice([0, 3, 40, 90, 250]) * MS,
    )
    seen: list[str] = []
    for state in run.sink.states:
        for tw in state.committed:
            seen.append(tw.text)
            assert tw.word.end_ns <= state.audio_end_ns
        # committed text is a prefix of the script at every tick: nothing rewritten or dropped
        assert seen == [w for w, _, _ in run.script[: len(seen)]]
        # and what is committed on screen never shows up again in the tentative tail
        assert not {t.rstrip("?") for t in state.tentative.split()} & set(seen)
    assert seen == [w for w, _, _ in run.script]
    assert all(t["sent_ns"] == t["due_ns"] for t in run.ticks)


class DriftingCard:
    """A live sound card whose sample clock runs ``ppm`` fast; chunks arrive up to 10 ms late."""

    live = True
    pullable = False

    def __init__(self, seconds: float, ppm: float, chunk: int = 1600) -> None:
        self.n_chunks = int(seconds * SAMPLE_RATE_HZ) // chunk
        self.chunk = chunk
        self.rate_hz = SAMPLE_RATE_HZ * (1 + ppm * 1e-6)
        self.rng = random.Random(7)
        self.t_start = 0

    def captured_ns(self, sample: int) -> int:
        return self.t_start + int(sample / self.rate_hz * 1e9)

    async def start(self, clock) -> int:
        self.clock = clock
        self.t_start = clock.now_ns()
        await clock.sleep_until(self.captured_ns(self.chunk))
        return clock.now_ns() - self.chunk * 62_500

    async def chunks(self):
        silence = np.zeros(self.chunk, dtype=np.float32)
        for i in range(self.n_chunks):
            end = (i + 1) * self.chunk
            late = self.rng.randint(0, 10 * MS)
            await self.clock.sleep_until(self.captured_ns(end) + late, precise=False)
            yield AudioChunk(i * self.chunk, silence)


def test_latency_holds_against_a_sound_card_100_ppm_fast():
    card = DriftingCard(seconds=150, ppm=100)

    async def main():
        clock = FakeClock(start_ns=T0_NS, settle_turns=12)
        history = AudioHistory(SAMPLE_RATE_HZ * 40)
        rec = InlineWorker("recognise", RecogniserHost(
            FactorySpec("subd.testing.recognizer:ScriptedRecognizer", {"words": []}),
            history.capacity, history=history), clock, lambda r: 50 * MS)
        tag = InlineWorker("tag", TagHost(None), clock, lambda r: 2 * MS)
        sink = ListSink()
        pipeline = Pipeline(clock=clock, settings=TickSettings(latency_ms=1000, drain_timeout_s=5),
                            source=card, recogniser=rec, tagger=tag, history=history,
                            sinks=[sink])
        task = asyncio.ensure_future(pipeline.run())
        await clock.run_until_done(task, limit_ns=T0_NS + 200 * 10**9)
        return pipeline, sink

    pipeline, sink = asyncio.run(main())
    assert pipeline.grid.rate != 1  # the grid follows the card's clock
    errors_ms = []
    for state in sink.states[-300:-60]:  # the last seconds of audio
        captured = card.captured_ns(pipeline.grid.audio_end_sample(state.k))
        errors_ms.append((state.due_ns - captured - 10**9) / 1e6)
    # uncorrected, the card's clock would have pulled D off by ~15 ms after 150 s
    assert max(abs(e) for e in errors_ms) < 3.0, errors_ms[:5]
