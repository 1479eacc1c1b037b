"""SIGTERM or SIGINT at any moment of ``subd stream``: exit 0, no worker traceback, no shared
memory left behind (the audio history lives in /dev/shm; other processes on the machine make
its listing no evidence, so the resource tracker's own warning is what is checked)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from daemon_helpers import SHORT_CLIP, START_LIMIT_S

pytestmark = pytest.mark.skipif(not SHORT_CLIP.exists(), reason="needs the LibriVox clips")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_stream_is_a_clean_exit(tmp_path, signum):
    events = tmp_path / "events.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "subd.cli", "stream", str(SHORT_CLIP), "--events", str(events),
         "--srt", str(tmp_path / "live.srt")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ})
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if events.exists() and events.stat().st_size > 500:
            break
        time.sleep(0.05)
    time.sleep(random.Random(signum).uniform(0.0, 1.0))
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=60)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "Traceback" not in text, text
    # the resource tracker warns of (and then removes) shared memory its creator left behind
    assert "leaked" not in text, text
