"""Issue 18's smaller fixes, each seen as a user would: a misspelt section is refused by name,
[punct] reaches the tagger, one push pause cannot skew the sample clock, the metrics count a
deadline miss where the scheduler does."""

from __future__ import annotations

import pytest

from subd.config import config_from_dict, load_config
from subd.errors import ConfigError
from subd.service.daemon import tagger_factory
from subd.service.metrics import Metrics, OpsObserver
from subd.sources.drift import DriftEstimator
from subd.types import SAMPLE_RATE_HZ, CaptionState

S = 1_000_000_000


def test_an_unknown_section_is_an_error_naming_it(tmp_path):
    path = tmp_path / "subd.toml"
    path.write_text('[recogniser]\nmodel = "base"\n')  # British spelling: not [recognizer]
    with pytest.raises(ConfigError, match=r"\[recogniser\]: unknown section \(known: .*"
                                          r"recognizer"):
        load_config(path)


def test_the_shipped_config_and_the_use_time_sections_load():
    load_config("config.toml")
    config_from_dict({"layout": {}, "punct": {"right_context_words": 4}, "bus": {}})


def test_punct_options_reach_the_tagger():
    spec = tagger_factory(config_from_dict({"punct": {"right_context_words": 5,
                                                      "pause_commit_ms": 500}}))
    tagger = spec.build()  # what the tag process builds
    assert tagger.config.right_context_words == 5
    assert tagger.config.pause_commit_ms == 500


def test_a_bad_punct_option_is_a_one_line_config_error():
    spec = tagger_factory(config_from_dict({"punct": {"right_context_words": 0}}))
    with pytest.raises(ConfigError, match=r"^\[punct\] right_context_words must be in"):
        spec.build()


def test_one_push_pause_cannot_skew_the_sample_clock():
    """A pusher pauses 5 s and resumes at real time: every later chunk arrives 5 s "late".
    The fit stays within the clamp instead of reading a clock 1.7 % slow."""
    est = DriftEstimator()
    chunk = 320
    gap_ns = 0
    for i in range(1, SAMPLE_RATE_HZ * 300 // chunk):  # 5 minutes of 20 ms chunks
        end = i * chunk
        if end == SAMPLE_RATE_HZ * 150:
            gap_ns = 5 * S
        est.observe(end, 10 * S + end * (S // SAMPLE_RATE_HZ) + gap_ns)
    fit = est.fit()
    assert fit is not None
    assert abs(fit.ppm) <= est.max_ppm + 1e-6


def test_metrics_count_a_miss_where_the_scheduler_does():
    """miss_tolerance_ms = 5: a tick 3 ms late is no miss for the scheduler, nor for /metrics
    (which counted every tick over a fixed 1 ms)."""
    from prometheus_client.parser import text_string_to_metric_families

    from subd.pipeline.tickstats import Counters

    metrics = Metrics()
    observer = OpsObserver(metrics.channel("a"))
    observer.counters = counters = Counters()
    for k, late_ms, missed in ((0, 3, False), (1, 7, True), (2, 0, False)):
        counters.deadline_misses += missed  # as the scheduler counts with its tolerance
        due = k * S
        observer.on_publish(CaptionState(k=k, due_ns=due, audio_end_ns=0), due + late_ms * 10**6)
    text = metrics.render().decode()
    got = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
           if s.labels.get("channel") == "a"}
    assert got["subd_deadline_misses_total"] == 1
    assert got["subd_ticks_total"] == 3


def test_a_sink_failing_every_tick_is_counted_and_still_logged_after_the_first_ten(caplog):
    """Today's log went quiet after 9 errors; now the first 10 and every 1000th are logged,
    all counted (the channel's observer exports the count as subd_sink_errors)."""
    import logging

    from subd.pipeline.publish import TickPublisher
    from subd.pipeline.tickstats import Counters

    class Broken:
        name = "broken"

    publisher = TickPublisher()
    publisher.counters = Counters()
    with caplog.at_level(logging.ERROR, logger="subd.pipeline.scheduler"):
        for k in range(2500):
            try:
                raise OSError("disk full")
            except OSError:
                publisher._sink_failed(Broken(), "publish", k)
    assert publisher.counters.sink_errors == 2500
    assert len(caplog.records) == 12
    assert "2000 sink errors so far" in caplog.records[-1].getMessage()


def test_planned_updates_skipped_are_exported_per_channel():
    """[recognizer] update_cost_ms: updates the recogniser fell behind are counted by the
    pipeline and exported as subd_recogniser_updates_skipped, as they happen."""
    from prometheus_client.parser import text_string_to_metric_families

    from subd.pipeline.tickstats import Counters

    metrics = Metrics()
    observer = OpsObserver(metrics.channel("a"))
    observer.counters = Counters()

    def skipped() -> float:
        return {s.name: s.value for f in text_string_to_metric_families(metrics.render().decode())
                for s in f.samples if s.labels.get("channel") == "a"}[
            "subd_recogniser_updates_skipped_total"]

    for k, total in enumerate((0, 2, 2, 5)):
        observer.counters.updates_skipped = total
        observer.on_publish(CaptionState(k=k, due_ns=k, audio_end_ns=k), k)
        assert skipped() == total


def test_file_write_errors_and_lost_cues_are_exported():
    from prometheus_client.parser import text_string_to_metric_families

    metrics = Metrics()
    m = metrics.channel("a")
    m.sync_file_errors(3, 0)
    m.sync_file_errors(7, 2)
    m.sync_file_errors(1, 0)  # the channel restarted: new sinks count from 0
    m.sync_file_errors(4, 0)
    got = {s.name: s.value
           for f in text_string_to_metric_families(metrics.render().decode())
           for s in f.samples if s.labels.get("channel") == "a"}
    assert got["subd_file_write_errors_total"] == 7 + 3
    assert got["subd_file_cues_lost_total"] == 2
