"""``subd bench quality``: its scoring counts what a viewer notices, and a short run prints every
column and writes the plot (figures are not asserted: they are the benchmark's)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from subd.bench.quality_sets import SpeechSet, build_set, score_words
from tests.test_bench_smoke import bench


def _set(text: str, marks: list[str | None]) -> SpeechSet:
    words = text.split()
    return SpeechSet("t", np.zeros(16000, np.float32), words, marks)


def test_a_dropped_span_is_three_or_more_reference_words_missing():
    ref = _set("ask not what your country can do for you", [""] * 8 + ["."])
    one = score_words(ref, [(w, "") for w in "ask not your country can do for you".split()])
    three = score_words(ref, [(w, "") for w in "ask not can do for you".split()])
    garbled = score_words(ref, [(w, "") for w in "ask not what you are country can do for you"
                                .split()])
    assert one.dropped == [] and one.wer_pct == 100 / 9
    assert three.dropped == ["what your country"]
    assert garbled.dropped == [] and garbled.wer_pct > 0  # an error, but nothing dropped


def test_a_full_stop_inside_a_sentence_is_counted_and_scores_the_marks():
    ref = _set("ask not what your country can do for you", [""] * 8 + ["."])
    live = score_words(ref, [("ask", ""), ("not", "."), ("What", ""), ("your", ""),
                             ("country", ""), ("can", ""), ("do", ""), ("for", ""), ("you", ".")])
    assert live.stops_inside == 1
    assert live.f1["."] == 2 * 0.5 * 1.0 / 1.5
    own = score_words(ref, [(w, None) for w in "ask not what your country can do for you."
                            .split()])
    assert own.stops_inside == 0 and own.f1["."] == 1.0 and own.wer_pct == 0.0


def test_a_full_stop_at_a_semicolon_is_counted_apart_and_scores_as_its_comma():
    """"my native country; the narrative would be tedious": two clauses that each stand as a
    sentence. A full stop there is counted apart from one where the speaker only pauses, and
    the semicolon is the comma it stands for in the F1 of ','."""
    ref = _set("leave my native country the narrative would be tedious",
               ["", "", "", ";", "", "", "", "", "."])
    split = score_words(ref, [(w, None) for w in "leave my native country. The narrative "
                              "would be tedious.".split()])
    assert split.stops_inside == 0 and split.stops_at_semicolon == 1
    assert split.f1[","] == 0.0 and split.as_dict()["full_stops_at_semicolons"] == 1
    comma = score_words(ref, [(w, None) for w in "leave my native country, the narrative "
                              "would be tedious.".split()])
    assert comma.stops_at_semicolon == 0 and comma.f1[","] == 1.0
    pause = score_words(ref, [(w, None) for w in "leave my. Native country, the narrative "
                              "would be tedious.".split()])
    assert pause.stops_inside == 1 and pause.stops_at_semicolon == 0


def test_the_sets_are_disjoint_and_carry_the_books_punctuation(speech_clips):
    dev, held = build_set("dev", ("librivox/0870",)), build_set("heldout", ("librivox/0880",
                                                                            "cards/001"))
    assert dev.words[:3] == ["and", "mister", "john"] and dev.marks[-1] == "."
    assert held.marks[:7] == ["", "", "", "", "", "", ""] and held.marks[7] == "."
    assert held.marks[-3:] == [None] * 3  # the cards clips have no punctuated reference
    assert len(held.audio) > len(dev.audio) / 3


def test_the_repositorys_clips_join_the_sets_with_their_references():
    """data/speech: JFK's punctuated reference (held out), LibriSpeech 2412 with its book's
    punctuation (dev), LJSpeech without marks (dev)."""
    from subd.bench.quality_sets import DEV_CLIPS, HELDOUT_CLIPS

    assert not set(DEV_CLIPS) & set(HELDOUT_CLIPS)
    jfk = build_set("heldout", ("speech/jfk",))
    assert jfk.words[:4] == ["and", "so", "my", "fellow"]
    assert jfk.marks[:4] == ["", ",", "", ""] and jfk.marks[-1] == "."
    assert len(jfk.audio) / 16000 > 11
    libri = build_set("dev", ("speech/libri-2412-153948-0000",))
    assert len(libri.words) == 36 and libri.marks.count(",") == 2  # "me," "antecedents,"
    assert libri.marks.count(";") == 1  # "country;": kept, a full stop there counted apart
    assert libri.marks[-1] == "." and libri.marks.count(".") == 1
    lj = build_set("dev", ("speech/lj050-0131",))
    assert set(lj.marks) == {None}


@pytest.mark.parametrize("pace", ["real", "cpu"])
def test_bench_quality_prints_offline_and_every_d_and_writes_the_plot(tmp_path, speech_clips,
                                                                      pace):
    plot, out_json = tmp_path / "q.png", tmp_path / "q.json"
    out = bench("quality", "--latencies", "1000,2000", "--sets", "heldout", "--max-clips", "1",
                "--plot", str(plot), "--json", str(out_json), "--pace", pace,
                *(["--update-ms", "450,140"] if pace == "cpu" else []), timeout_s=600)
    rows = re.findall(r"^\s+(offline|\d+)\s+([\d.]+)\s+([\d.]+) ([\d.]+) ([\d.]+)\s+(\d+)\s+(\d+)"
                      r"\s+([\d.]+|-)", out.split("D (ms)")[-1], re.M)
    assert [r[0] for r in rows] == ["offline", "1000", "2000"]
    figures = json.loads(out_json.read_text())["heldout"]
    assert figures["2000"]["latency_s"]["p50"] >= 2.0  # never before D
    assert figures["offline"]["latency_s"] == {}
    if pace == "cpu":  # a modelled device: updates last what --update-ms says
        assert "modelled p50 450 ms" in out or "modelled p50 140 ms" in out
    assert plot.stat().st_size > 10_000


def test_per_clip_streams_each_clip_alone_and_scores_them_over_the_set(tmp_path, speech_clips):
    """``--per-clip``: each clip a stream of its own, as a user streams a file (the issue's own
    measurement: `subd stream CLIP` and `subd transcribe CLIP`), offline each clip alone too;
    the words are scored together against the set's reference."""
    held = build_set("heldout", ("librivox/0880", "cards/001"))
    assert [c.name for c in held.clips] == ["librivox/0880", "cards/001"]
    assert sum((c.words for c in held.clips), []) == held.words
    assert sum((c.marks for c in held.clips), []) == held.marks
    assert sum(len(c.audio) for c in held.clips) < len(held.audio)  # no gap after a clip alone
    out_json = tmp_path / "q.json"
    out = bench("quality", "--latencies", "2000", "--sets", "heldout", "--max-clips", "2",
                "--per-clip", "--pace", "cpu", "--update-ms", "450,140", "--show",
                "--plot", str(tmp_path / "q.png"), "--json", str(out_json), timeout_s=600)
    assert "92 words" not in out and ", 2 streams" in out
    assert out.count("recogniser updates") == 2  # one stream per clip
    figures = json.loads(out_json.read_text())["heldout"]
    # both clips' words reach the score: missing either would cost far more than 30 points
    assert figures["2000"]["wer_pct"] < 30 and figures["offline"]["wer_pct"] < 30
    assert figures["2000"]["latency_s"]["p50"] >= 2.0


def test_a_modelled_run_gives_every_recogniser_call_its_modelled_cost():
    """--update-ms: an update lasts its span's modelled cost, and the end of a stream (a full
    input decode) the full input's, never its CPU time: at its CPU time, when a stream's last
    words came in moved with the machine's load, and a held-out stream's last mark with it."""
    from subd.bench.cputimed import NO_DECODE_NS, CpuTimed
    from subd.workers.hosts import FinishRequest, UpdateRequest

    timed = CpuTimed(host=None, update_ns=(450_000_000, 140_000_000))
    assert timed.cost_ns(UpdateRequest(3200, 0, full_span=True), 123) == 450_000_000
    assert timed.cost_ns(UpdateRequest(6400, 0, full_span=False), 123) == 140_000_000
    assert timed.cost_ns(FinishRequest(7000), 123) == 450_000_000
    assert CpuTimed(host=None).cost_ns(FinishRequest(0), 123) == 123  # measured: its CPU time
    # an update without new audio decodes nothing (the words due before a stream's last
    # decode, taken from the last reading): a fixed small cost, on each channel apart
    assert timed.cost_ns(UpdateRequest(8000, 0), 123) == 140_000_000
    assert timed.cost_ns(UpdateRequest(8000, 0), 123) == NO_DECODE_NS
    assert timed.cost_ns(UpdateRequest(8000, 0), 987_654_321) == NO_DECODE_NS
    assert timed.cost_ns(UpdateRequest(8000, 0), 123, channel="b") == 140_000_000


def test_an_empty_plot_path_writes_no_plot(tmp_path, monkeypatch, speech_clips):
    """``--plot ""``: no figure (matplotlib had written one called ".png" in the working
    directory)."""
    monkeypatch.chdir(tmp_path)
    out = bench("quality", "--sets", "heldout", "--max-clips", "1", "--latencies", "2000",
                "--pace", "cpu", "--update-ms", "450,140", "--plot", "")
    assert "plot:" not in out and re.search(r"^\s+2000\s+[\d.]+", out, re.M)
    assert list(tmp_path.iterdir()) == []


def test_each_repeat_hears_the_streams_later_by_a_step_of_silence(monkeypatch):
    """``--repeats`` on the fake clock: the same audio gives the same decisions, so run r hears
    each stream after r x 150 ms of silence (with ``--per-clip`` three runs had been three
    copies of one). The words and their visible latency are measured from the speech itself."""
    import argparse

    from subd.bench import quality

    args = argparse.Namespace(model="tiny.en", config=None, overrides=[], tagger="auto",
                              punct=[], pace="cpu", update_ms="450,140", language="en",
                              span="config", min_update_ms=None, per_clip=True)
    sset = build_set("heldout", ("speech/jfk",))
    seen = []
    real = quality.streamed

    def streamed(part, latency_ms, args, observer=None):
        seen.append(len(part.audio))
        return real(part, latency_ms, args, observer)

    monkeypatch.setattr(quality, "streamed", streamed)
    first, later = (quality.stream_run(sset, 2000, args, lead) for lead in (0, 300))
    assert seen[1] - seen[0] == 300 * 16
    for run in (first, later):
        assert run.wer_pct < 30
        assert 2.0 <= run.latency_s["p50"] and run.latency_s["max"] < 2.5


def test_the_offline_baseline_gets_the_same_draws_as_the_stream(monkeypatch):
    """``--repeats``: offline transcribes each stream after the same r x 150 ms of silence as
    the streamed runs (its windows then fall elsewhere on the speech too), and its row is the
    runs' mean, as the streamed rows are; it has no latency."""
    import argparse

    from subd.bench import quality
    from subd.bench.quality_sets import offline_engine

    args = argparse.Namespace(per_clip=True, repeats=2)
    sset = build_set("heldout", ("speech/jfk",))
    leads = []
    real = quality.offline_run

    def offline_run(sset, engine, per_clip=False, lead_ms=0):
        leads.append(lead_ms)
        return real(sset, engine, per_clip, lead_ms)

    monkeypatch.setattr(quality, "offline_run", offline_run)
    row = quality.offline_runs(sset, offline_engine("tiny.en", None), args)
    assert leads == [0, quality.LEAD_STEP_MS]
    assert len(row.wer_runs) == 2 and row.wer_pct == sum(row.wer_runs) / 2
    assert all(w < 30 for w in row.wer_runs) and row.latency_s == {}


def test_pooled_runs_keep_each_runs_text_for_show():
    """``--repeats N --show`` prints every run's text (the runs differ: another phase of the
    updates against the speech), not the first run's alone."""
    from subd.bench.quality import pooled_runs
    from subd.bench.quality_sets import RunScore

    runs = [RunScore(5.0, {".": 1.0}, [], 0, 0, text="one two"),
            RunScore(7.0, {".": 0.5}, [], 1, 0, text="one too")]
    for r in runs:
        r.latency_samples = np.array([2.0])
    pooled = pooled_runs(runs)
    assert pooled.text == "one two" and pooled.texts == ["one two", "one too"]
    assert pooled.wer_runs == [5.0, 7.0] and pooled.wer_pct == 6.0
