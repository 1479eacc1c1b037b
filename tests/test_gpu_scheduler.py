"""The GPU scheduler: first captions first, then earliest deadline; late work degraded."""

from __future__ import annotations

import pytest

from subd.gpu.scheduler import CostModel, GpuScheduler, Update

MS = 1_000_000


def _sched(max_rows: int = 8) -> GpuScheduler:
    # a round costs 10 ms + 1 ms per row (no safety margin, so the arithmetic is exact)
    return GpuScheduler(CostModel(fixed_ns=10 * MS, per_row_ns=1 * MS), max_rows, safety=1.0)


def test_streams_without_a_caption_go_first_then_earliest_deadline():
    s = _sched(max_rows=2)
    s.submit(Update(1, 0, 500 * MS, first_caption=False))
    s.submit(Update(2, 0, 900 * MS, first_caption=True))
    s.submit(Update(3, 0, 400 * MS, first_caption=False))
    plan = s.plan(0)
    assert [u.stream_id for u in plan.batch] == [2, 3]
    assert [u.stream_id for u in s.plan(20 * MS).batch] == [1]


def test_batch_stops_growing_where_a_member_would_miss_its_deadline():
    s = _sched(max_rows=100)
    s.submit(Update(1, 0, 13 * MS, first_caption=False))  # fits a round of ≤ 3 rows
    for i in range(2, 10):
        s.submit(Update(i, 0, 100 * MS, first_caption=False))
    plan = s.plan(0)
    assert len(plan.batch) == 3 and plan.batch[0].stream_id == 1
    assert plan.predicted_end_ns == 13 * MS
    assert s.n_pending == 6  # still reachable: left for the next round, not dropped


def test_work_that_cannot_make_its_tick_is_degraded_not_queued():
    s = _sched()
    s.submit(Update(1, 0, 5 * MS, first_caption=False))  # needs 11 ms even alone
    s.submit(Update(2, 0, 50 * MS, first_caption=False))
    plan = s.plan(0)
    assert [u.stream_id for u in plan.degraded] == [1]
    assert [u.stream_id for u in plan.batch] == [2]
    assert s.n_pending == 0 and s.n_degraded == 1


def test_newer_update_replaces_the_pending_one_and_keeps_first_caption_priority():
    s = _sched()
    s.submit(Update(7, 0, 300 * MS, first_caption=True, seq=0))
    old = s.submit(Update(7, 100 * MS, 1100 * MS, first_caption=False, seq=1))
    assert old is not None and old.seq == 0
    plan = s.plan(100 * MS)
    assert len(plan.batch) == 1 and plan.batch[0].seq == 1 and plan.batch[0].first_caption
    assert s.n_superseded == 1


def test_cost_model_interpolates_measured_sizes_and_follows_live_rounds():
    cost = CostModel(fixed_ns=1, per_row_ns=1)
    for rows in (8, 64, 512):
        cost.calibrate(rows, 40 * MS + rows * MS // 10)  # 40 ms + 0.1 ms per row
    assert cost.predict_ns(1) == 40 * MS + 8 * MS // 10  # never below the smallest size
    assert cost.predict_ns(288) == pytest.approx(40 * MS + 288 * MS // 10, rel=1e-6)
    # beyond the largest measured size: no cheaper per row than that size (conservative)
    assert cost.predict_ns(1024) == pytest.approx(2 * (40 * MS + 512 * MS // 10), rel=1e-6)
    for _ in range(50):  # the GPU got twice as slow at 512 rows: the model follows
        cost.observe(512, 2 * (40 * MS + 512 * MS // 10))
    assert cost.predict_ns(512) == pytest.approx(2 * (40 * MS + 512 * MS // 10), rel=0.01)


def test_bad_row_limit_is_rejected():
    with pytest.raises(ValueError):
        GpuScheduler(CostModel(), 0)


def test_pending_first_captions_are_counted_until_planned():
    s = _sched(max_rows=1)
    s.submit(Update(1, 0, 900 * MS, first_caption=True))
    s.submit(Update(1, 5 * MS, 905 * MS, first_caption=False))  # stays urgent: no caption yet
    s.submit(Update(2, 0, 950 * MS, first_caption=False))
    assert s.n_first_pending == 1 and s.n_pending == 2
    assert [u.stream_id for u in s.plan(0).batch] == [1]
    assert s.n_first_pending == 0 and s.n_pending == 1
