"""SIGKILL a live SRT writer at random moments: the file stays valid and holds every cue
committed at least 1 s before the kill.

The writer is a separate process fed at tick rate (``python -m subd.testing.sinks``, which
reports ``committed N T`` lines). WRITER_CMD is the one place to swap in ``subd stream``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pysrt

from subd.layout.cues import CueLayout
from subd.testing.sinks import SPEECH, script_states, script_words

N_KILLS = 20
SPEED = 15  # audio ticks per real tick: a cue is committed about every 0.25 s
REPEAT = 3  # the script lasts longer than the latest kill


def writer_cmd(directory: Path) -> list[str]:
    return [sys.executable, "-m", "subd.testing.sinks", str(directory), "--speed", str(SPEED),
            "--repeat", str(REPEAT)]


def reference() -> list[tuple[int, int, str]]:
    from fractions import Fraction

    layout = CueLayout()
    cues = []
    words = script_words(" ".join([SPEECH] * REPEAT))
    for state in script_states(words, audio_per_tick=Fraction(SPEED)):
        cues += layout.push(state.committed, state.audio_end_ns, state.tentative)
    cues += layout.finish()
    return [(c.start_ns // 10**6, c.end_ns // 10**6, "\n".join(c.lines)) for c in cues]


def test_sigkill_leaves_a_valid_srt_with_every_committed_cue(tmp_path: Path) -> None:
    rng = random.Random(5)
    want = reference()
    n_checked = 0
    for run in range(N_KILLS):
        directory = tmp_path / f"run{run}"
        proc = subprocess.Popen(writer_cmd(directory), stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        commits: list[tuple[int, int]] = []

        def reader(out=proc.stdout, commits=commits) -> None:
            for line in out:
                parts = line.split()
                if parts[:1] == ["committed"]:
                    commits.append((int(parts[1]), int(parts[2])))

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        time.sleep(rng.uniform(0.3, 3.0))
        kill_ns = time.monotonic_ns()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        thread.join(timeout=5)
        proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL, "the writer ended before it was killed"
        must_hold = max((n for n, t in commits if t <= kill_ns - 10**9), default=0)
        path = directory / "live.srt"
        if not path.exists():
            assert must_hold == 0
            continue
        subs = pysrt.open(str(path), error_handling=pysrt.ERROR_RAISE)
        got = [(s.start.ordinal, s.end.ordinal, s.text) for s in subs]
        assert len(got) >= must_hold, (run, len(got), must_hold)
        assert got == want[: len(got)]  # valid cues, nothing half-written or out of order
        n_checked += must_hold > 0
    assert n_checked >= N_KILLS // 4  # enough kills came after cues were committed
