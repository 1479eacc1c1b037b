"""The batched recogniser's scheduler (issue 17, Build 2): which channels' requests make the next
batch (first captions first, then by due time, at most the host's rows), and late work degraded
instead of queued: answered from the channel's last reading, with no decode.

Runs on the CPU, on a fake clock: the batch host here only notes what each batch held (the
engine's own batching is tests/test_batched_policy.py's).
"""

from __future__ import annotations

import asyncio

from subd.clock import FakeClock
from subd.gpu.scheduler import CostModel, GpuScheduler, Update
from subd.history import AudioHistory
from subd.pipeline.deadline import UpdatePlanner
from subd.pipeline.ticks import TickGrid
from subd.recognise.streaming import StreamingRecognizer
from subd.service.batching import BatchingSharedWorker, ForChannels
from subd.service.multiplex import ForChannel
from subd.sources.decode import load_audio
from subd.types import SAMPLE_RATE_HZ
from subd.workers.hosts import FactorySpec, FinishRequest, RecogniserHost, UpdateRequest
from subd.workers.process import InlineWorker
from tests.test_deadline import MS, T0_NS, _run_pipeline
from tests.test_streaming import _ScriptedEngine

BATCH_MS = 100


class NotingHost:
    """Stands in for BatchedMultiplexHost: answers every request of a batch with itself, and
    notes each batch as (channel, decode) pairs (decode None: not an update)."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, bool | None]]] = []

    def handle(self, request):
        assert isinstance(request, ForChannels)
        self.batches.append([(it.channel, getattr(it.request, "decode", None))
                             for it in request.items])
        return [(True, it.request) for it in request.items]


def _batches(requests: dict[str, object], max_rows: int):
    """``requests`` (channel: request) sent together at t = 0 to a batching worker of
    ``max_rows`` rows whose batches last BATCH_MS: (the batches, each channel's answer, the
    worker)."""

    async def main():
        clock = FakeClock(start_ns=0)
        host = NotingHost()
        worker = InlineWorker("recognise", host, clock, lambda _r: BATCH_MS * MS)
        shared = BatchingSharedWorker(worker, max_rows=max_rows, clock=clock)
        calls = asyncio.gather(*(shared._call(ForChannel(name, req), 0)
                                 for name, req in requests.items()))
        task = asyncio.ensure_future(calls)
        await clock.run_until_done(task, limit_ns=10_000 * MS)
        return host.batches, dict(zip(requests, task.result(), strict=True)), shared

    return asyncio.run(main())


def test_first_captions_then_due_times_make_the_batch_and_the_rest_waits_its_turn():
    """Two rows: the channel with no caption yet goes first, then the stream's last decode
    (no due time: ordered by when it was sent), then the earliest due times; the rest waits
    for the next batch."""
    batches, answers, shared = _batches({
        "late-due": UpdateRequest(16000, 0, due_ns=3000 * MS),
        "soon-due": UpdateRequest(16000, 0, due_ns=1000 * MS),
        "new": UpdateRequest(16000, 0, due_ns=5000 * MS, first_caption=True),
        "ending": FinishRequest(16000),
        "later": UpdateRequest(16000, 0, due_ns=4000 * MS),
    }, max_rows=2)
    assert batches == [[("new", True), ("ending", None)],
                       [("soon-due", True), ("late-due", True)],
                       [("later", True)]]
    assert shared.n_degraded == 0
    assert all(answers[name] is not None for name in answers)


def test_an_update_whose_due_time_passed_a_round_ago_is_degraded_not_queued():
    """An update whose due time passed more than a round ago (the process is behind) goes in
    the next batch without its decode (``decode=False``), however full the batch is; one that
    is just late is decoded; the stream's last decode, due or not, is never degraded."""
    batches, answers, shared = _batches({
        "behind": UpdateRequest(16000, 0, due_ns=-1000 * MS),
        "just-late": UpdateRequest(16000, 0, due_ns=-5 * MS),
        "fine": UpdateRequest(16000, 0, due_ns=2000 * MS),
        "ending": FinishRequest(16000),
    }, max_rows=2)
    assert batches == [[("just-late", True), ("ending", None), ("behind", False)],
                       [("fine", True)]]
    assert answers["behind"].decode is False
    assert shared.n_degraded == 1


def test_an_update_is_due_at_the_fetch_of_the_first_tick_the_update_before_left_open():
    """The first update is due at tick 0's fetch; each later one at the fetch of the tick after
    the words the update before had to decide (that plan expected this result by then)."""
    planner = UpdatePlanner("cut")
    grid = TickGrid.create("30", T0_NS, 2000, 150)
    first = planner.plan(grid, T0_NS + 200 * MS)
    assert first.due_ns == grid.fetch_ns(0)
    second = planner.plan(grid, T0_NS + 400 * MS)
    k = grid.tick_of_sample(first.commit_until_ns * SAMPLE_RATE_HZ // 1_000_000_000)
    assert grid.audio_end_ns(k - 1) == first.commit_until_ns
    assert second.due_ns == grid.fetch_ns(k)
    # the first plan expected the second's result before then
    assert first.sent_ns + planner.cost_ns(False) < second.due_ns


def test_the_pipeline_sends_due_times_and_says_when_the_channel_has_shown_nothing_yet():
    """Every update the pipeline sends carries its due time, never earlier than the one before;
    ``first_caption`` holds until a result had words."""
    sent = []

    def cost(request) -> int:
        sent.append(request)
        return 300 * MS

    sink, rec, counters = _run_pipeline(2000, 8.0, 12, cost)
    updates = [r for r in sent if isinstance(r, UpdateRequest) and r.due_ns is not None]
    assert len(updates) > 10
    assert all(b.due_ns >= a.due_ns for a, b in zip(updates, updates[1:], strict=False))
    first = [r.first_caption for r in updates]
    n_first = first.index(False)
    assert n_first >= 1 and not any(first[n_first:])
    heard_first_word = 500 * MS  # DeadlineRecognizer's "w0" ends at 0.5 s
    assert all(rec.plans[i][0] < heard_first_word for i in range(n_first - 1))
    assert counters.updates_degraded == 0  # a recogniser of its own: nothing degrades


def scripted_recognizer() -> StreamingRecognizer:
    words = [("one", 0.2, 0.5, 0.9), ("two", 0.6, 0.9, 0.9), ("three", 1.0, 1.3, 0.9)]
    return StreamingRecognizer(engine=_ScriptedEngine(words), confident_min_probability=1.0)


def test_a_degraded_update_reads_no_audio_decodes_nothing_and_commits_the_due_words(
        speech_clips):
    """The host reads none of the new audio for a degraded update and the recogniser does not
    decode: the words due are taken from its last reading, and the next update reads on."""
    history = AudioHistory(SAMPLE_RATE_HZ * 10)
    host = RecogniserHost(FactorySpec("tests.test_batched_scheduling:scripted_recognizer", {}),
                          history.capacity, history=history, measure_costs=False)
    audio = load_audio(speech_clips[0].path)[: 3 * SAMPLE_RATE_HZ]  # real speech: the VAD
    history.write(0, audio)
    first = host.handle(UpdateRequest(int(1.6 * SAMPLE_RATE_HZ), 0, due_ns=1))
    assert first.decoded and not first.degraded
    assert [w.text for w in first.hypothesis.tentative][:2] == ["one", "two"]
    n_calls = host.recognizer.engine.n_calls
    degraded = host.handle(UpdateRequest(int(2.4 * SAMPLE_RATE_HZ), 950 * MS, due_ns=1,
                                         decode=False))
    assert degraded.degraded and not degraded.decoded
    assert host.recognizer.engine.n_calls == n_calls
    assert degraded.accepted_sample == int(1.6 * SAMPLE_RATE_HZ)  # the new audio unread
    assert [w.text for w in degraded.hypothesis.committed] == ["one", "two"]
    after = host.handle(UpdateRequest(int(2.4 * SAMPLE_RATE_HZ), 950 * MS, due_ns=1))
    assert after.decoded and after.accepted_sample == int(2.4 * SAMPLE_RATE_HZ)


def test_a_filled_round_takes_every_member_that_can_make_it_not_just_the_tightest():
    """Rounds measured at 100 ms for one row and 120 ms for four, the tightest member due at
    125 ms: filling, the scheduler takes all four; without ``fill`` it grows the round only
    while its predicted end (15 % added) stays before the tightest due time, and two wait a
    whole round."""
    def pending(fill: bool) -> GpuScheduler:
        cost = CostModel()
        cost.calibrate(1, 100 * MS)
        cost.calibrate(4, 120 * MS)
        sched = GpuScheduler(cost, max_rows=8, fill=fill)
        sched.submit(Update(0, 0, 125 * MS, False))
        for sid in (1, 2, 3):
            sched.submit(Update(sid, 0, 1000 * MS, False))
        return sched

    assert [u.stream_id for u in pending(True).plan(0).batch] == [0, 1, 2, 3]
    assert [u.stream_id for u in pending(False).plan(0).batch] == [0, 1]
