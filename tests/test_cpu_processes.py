"""Several serial recogniser processes on the CPU (``[recognizer] cpu_processes``,
subd.service.sharding): how many, each one's share of the cores, and ``subd run`` sharing its
channels out over them with each channel hearing its own clip. A shard that dies is respawned
while the other answers: tests/test_gpu_shards.py, serial case."""

from __future__ import annotations

import importlib.util
import re

import pytest
from daemon_helpers import (
    LIBRIVOX,
    assert_each_channel_reads_its_clip,
    healthz,
    start_file_channels,
    wait_for,
)

from subd.config import config_from_dict
from subd.errors import ConfigError
from subd.service.sharding import cpu_process_count


def test_auto_is_a_process_per_channel_up_to_the_cores():
    assert cpu_process_count("auto", n_channels=1, cores=2) == 1  # one channel: as ever
    assert cpu_process_count("auto", n_channels=4, cores=2) == 2
    assert cpu_process_count("auto", n_channels=2, cores=16) == 2
    assert cpu_process_count("auto", n_channels=16, cores=16) == 4  # capped
    assert cpu_process_count(3, n_channels=1, cores=2) == 3  # asked for: as asked
    assert config_from_dict({}).recognizer.cpu_processes == "auto"


@pytest.mark.parametrize("value", [0, 65, "2", True, 1.5])
def test_a_bad_cpu_processes_is_a_one_line_error(value):
    with pytest.raises(ConfigError, match=r"\[recognizer\] cpu_processes"):
        config_from_dict({"recognizer": {"cpu_processes": value}})


def test_each_process_takes_its_share_of_the_cores():
    pytest.importorskip("torch")
    import os

    from subd.models.engine import live_threads, share_cores

    alone = max(1, min(len(os.sched_getaffinity(0)) - 1, 8))
    try:
        assert live_threads() == alone
        share_cores(2)
        assert live_threads() == max(1, alone // 2)
        share_cores(64)
        assert live_threads() == 1  # never none
    finally:
        share_cores(1)
    assert live_threads() == alone


CLIPS = [c for c in sorted(LIBRIVOX.glob("*.wav")) if c.name.endswith(("0870.wav", "0920.wav"))] \
    if LIBRIVOX.is_dir() else []


@pytest.mark.skipif(len(CLIPS) < 2 or importlib.util.find_spec("subd.recognise.streaming")
                    is None, reason="needs the LibriVox clips and the streaming recogniser")
def test_subd_run_shares_its_channels_out_over_cpu_processes(tmp_path):
    """Two channels, cpu_processes = 2: two recogniser processes (two pids in /healthz), one
    channel on each, and each channel its own clip's words."""
    daemon = start_file_channels(tmp_path, CLIPS, "cpu_processes = 2")
    port = daemon.port
    stages = {}
    try:
        wait_for(lambda: healthz(port)[0] == 200, 300, "the daemon to serve", daemon.proc,
                 daemon.log)
        stages = healthz(port)[1]["stages"]
        wait_for(lambda: daemon.log_text().count("published") >= 2, 300,
                 "both channels to finish", daemon.proc, daemon.log)
    finally:
        daemon.stop()
    log = daemon.log_text()
    assert "recognise: 2 processes share the channels, one update at a time each" in log
    assert not re.search(r"batched", log)
    shards = {name: s for name, s in stages.items() if name.startswith("recognise")}
    assert set(shards) == {"recognise.0", "recognise.1"}, stages
    assert len({s["pid"] for s in shards.values()}) == 2
    assert_each_channel_reads_its_clip(CLIPS, tmp_path)
