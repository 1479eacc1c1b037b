"""``subd run`` with [recognizer] batched = "on": two channels, one recogniser process, their
decodes batched (subd.service.batching); each channel gets its own clip's words, on time."""

from __future__ import annotations

import importlib.util
import re

import pytest
from daemon_helpers import (
    LIBRIVOX,
    assert_each_channel_reads_its_clip,
    start_file_channels,
    wait_for,
)

CLIPS = sorted(LIBRIVOX.glob("*.wav"))[:2] if LIBRIVOX.is_dir() else []

pytestmark = pytest.mark.skipif(
    len(CLIPS) < 2 or importlib.util.find_spec("subd.recognise.streaming") is None,
    reason="needs the LibriVox clips (pocketsphinx-testdata) and the streaming recogniser")


def test_two_channels_share_one_batched_recogniser(tmp_path):
    daemon = start_file_channels(tmp_path, CLIPS, 'batched = "on"\nprecision = "fp32"')
    try:
        wait_for(lambda: daemon.log_text().count("published") >= 2, 300,
                 "both channels to finish", daemon.proc, daemon.log)
    finally:
        daemon.stop()
    log = daemon.log_text()
    assert "recognise: one process for every channel, their requests batched" in log
    batched = [line for line in log.splitlines() if "requests in" in line and "batches" in line]
    assert batched, log[-2000:]
    n_items, n_batches = (int(x) for x in re.findall(r"(\d+) requests in (\d+) batches",
                                                      batched[0])[0])
    assert n_items > n_batches  # the two channels' updates went out together
    assert_each_channel_reads_its_clip(CLIPS, tmp_path)
