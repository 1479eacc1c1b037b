"""The benchmarks run end to end and print what they name (figures are not asserted: speed
targets are for ``subd bench`` on a quiet machine, never for tests)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from subd.config import load_config


def bench(*args: str, timeout_s: int = 300) -> str:
    proc = subprocess.run([sys.executable, "-m", "subd.cli", "bench", *args],
                          capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_fanout_prints_every_readers_and_the_probes_errors_for_n_and_1_clients():
    out = bench("fanout", "--clients", "40", "--ticks", "150", "--warmup", "60")
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+\s+\d+\s+\d", line)]
    assert [(r[0], r[1]) for r in rows] == [("40", "20"), ("1", "1")]
    for r in rows:
        all_p50, all_p99, worst_p99, p50, p99, arrive_p99 = map(float, r[2:7] + r[8:9])
        assert 0 < all_p50 <= min(all_p99, worst_p99)
        assert 0 < p50 <= p99 and arrive_p99 <= p99  # the kernel queues before the read
    assert re.search(r"p99 over all reading clients: [\d.]+ ms with 40 clients, [\d.]+ ms with 1"
                     r".*target <= 2 ms: (met|NOT met)",
                     out)
    assert re.search(r"fan-out shares at the end .*: this process \d+ x [\d.]+, worker 1", out)


def test_soak_marks_fall_on_loop_boundaries(speech_clips):
    out = bench("soak", "--minutes", "3", "--step-ms", "500", timeout_s=600)
    # clip 0870 is 7.1 s, padded to 7.5 s (whole 500 ms steps): marks at 16 and 24 loops
    marks = re.findall(r"minute\s+([\d.]+): RSS main (\d+) MB, recogniser (\d+) MB", out)
    assert [m[0] for m in marks] == ["2.0", "3.0"]
    assert all(int(m[2]) > 100 for m in marks)  # the recogniser process holds the model
    growth = dict(re.findall(r"^(\w+)\s+minute 2.0:.*growth ([-+][\d.]+|nan) %", out, re.M))
    assert set(growth) >= {"rss_recogniser_mb", "committed_p95_ms", "audio_timeline_p95_ms"}
    assert all(v != "nan" for v in growth.values())


def test_realtime_default_audio_is_every_librivox_clip_joined(speech_clips):
    from subd.bench.realtime import joined_clips
    from subd.sources.decode import load_audio

    audio, text = joined_clips(gap_s=0.75)
    assert len(audio) == sum(len(load_audio(c.path)) + 12_000 for c in speech_clips)
    assert text.split() == [w for c in speech_clips for w in c.transcript.split()]


def test_realtime_prints_both_pipelines_and_writes_the_plot(tmp_path, speech_clips):
    clip = speech_clips[0]
    plot = tmp_path / "latency.png"
    out = bench("realtime", "--clip", str(clip.path), "--transcript", clip.transcript,
                "--plot", str(plot))
    subd_part, naive_part = out.split("naive push:")
    for key in ("publish_error_p99_ms", "deadline_misses", "fallbacks", "committed_latency_p95_ms",
                "tentative_latency_p50_ms", "time_to_first_caption_s", "wer"):
        assert re.search(rf"^\s+{key}\s+[\d.]+$", subd_part, re.M), key
    # the arrival times are the kernel's receive stamps, one for every event
    n_events = re.search(r"^\s+events_at_client\s+(\d+)$", subd_part, re.M)
    stamped = re.search(r"^\s+events_with_kernel_receive_time\s+(\d+)$", subd_part, re.M)
    assert n_events and stamped and int(stamped.group(1)) == int(n_events.group(1)) > 0
    for key in ("committed_latency_p95_ms", "time_to_first_caption_s", "wer"):
        assert re.search(rf"^\s+{key}\s+[\d.]+$", naive_part, re.M), key
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_daemon_runs_subd_run_per_cpu_processes_setting_and_prints_each_channel(speech_clips,
                                                                                tmp_path):
    """bench daemon: one real ``subd run`` per setting, the baseline first, each channel's
    figures from its events log (the 4-channel figures of issue 17 are its default run)."""
    out = bench("daemon", "--channels", "2", "--seconds", "10", "--processes", "1,2",
                "--device", "cpu", "--update-ms", "400", "--keep", str(tmp_path), timeout_s=600)
    assert "([recognizer] device = 'cpu', an update every 400 ms of audio)" in out
    configs = [load_config(c).recognizer for c in sorted(tmp_path.glob("p*.toml"))]
    assert len(configs) == 2 and {c.device for c in configs} == {"cpu"}
    assert {(c.min_update_ms, c.gpu_update_ms) for c in configs} == {(400, 400)}
    assert re.findall(r"cpu_processes = (\w+) \((\d+) recogniser processes\)", out) == [
        ("1", "1"), ("2", "2")]
    assert re.search(r"recognise\.0 \d+ %, recognise\.1 \d+ %", out)  # each process's CPU
    rows = re.findall(r"^\s+(c\d)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)%\s+(\d+)"
                      r"\s+([\d.]+)$", out, re.M)
    assert [r[0] for r in rows] == ["c0", "c1", "c0", "c1"]
    for _name, words, p50, p95, worst, within, updates, wer in rows:
        assert int(words) > 0 and int(updates) > 0 and 0 <= int(within) <= 100
        assert 0 < float(p50) <= float(p95) <= float(worst)
        assert float(wer) < 50  # each channel read its own clips
    summary = re.findall(r"^\s+(1|2)\s+1\s+([\d.]+)\s+([01])/1\s+\d+\s+\d+\s+\d+\s+\d+\s+[\d.]+$",
                         out, re.M)
    assert [s[0] for s in summary] == ["1", "2"]
    assert re.search(r"worst channel's p95 against cpu_processes = 1: 2 [\d.]+ s \([\d.]+x\)",
                     out)
    # the captions compared word for word with the baseline's, channel by channel
    same = re.search(r"^captions of 2 against 1: (\d) of 2 channels word for word the same; "
                     r"words that differ per channel: (\d+), (\d+)$", out, re.M)
    assert same and int(same.group(1)) == (same.group(2), same.group(3)).count("0")
    exact = re.search(r"^  with their marks, capitals and word times: (\d) of 2 channels the "
                      r"same$", out, re.M)
    assert exact and int(exact.group(1)) <= int(same.group(1))


def test_daemon_settings_pair_each_device_with_the_processes_that_apply_there():
    """--device cpu,cuda: the CPU with every --processes setting, CUDA once (its channels are
    all on the batched recogniser); bad lists are one-line errors."""
    from argparse import Namespace

    from subd.bench.daemon import _settings
    from subd.errors import UserError

    def args(**kw):
        base = dict(channels=4, runs=1, seconds=10.0, processes="1,auto", device="cpu,cuda",
                    update_ms=None, precision="auto", update_cost_ms=None)
        return Namespace(**{**base, **kw})

    assert _settings(args()) == [("cpu", "1"), ("cpu", "auto"), ("cuda", "1")]
    assert _settings(args(device="cuda:1", processes="2")) == [("cuda:1", "2")]
    for bad in (dict(device="gpu"), dict(device="cpu,cpu"), dict(processes="0"),
                dict(update_ms=5), dict(update_cost_ms=10)):
        with pytest.raises(UserError, match="--device a comma list"):
            _settings(args(**bad))


def test_round_prints_each_stages_share_of_a_batched_round():
    out = bench("round", "--device", "cpu", "--rows", "2", "--rounds", "1")
    assert "2 windows a round of tiny.en on cpu (fp32)" in out
    free = float(re.search(r"round as it runs: ([\d.]+) ms", out).group(1))
    split = re.search(r"round with each stage synchronised: ([\d.]+) ms = (.*), host between "
                      r"them (-?[\d.]+) ms", out)
    stages = dict((k, float(v)) for k, v in re.findall(r"(\w+) ([\d.]+)", split.group(2)))
    assert list(stages) == ["upload", "features", "encode", "decode", "align"]
    assert free > 0 and all(v >= 0 for v in stages.values())
    assert stages["decode"] > 0 and stages["encode"] > 0
    assert abs(sum(stages.values()) + float(split.group(3)) - float(split.group(1))) < 0.5
