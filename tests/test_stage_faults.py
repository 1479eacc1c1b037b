"""Stage processes killed or hung under the real daemon (``subd run``, real model in two
recogniser processes, one channel each (``cpu_processes``), real CRF tagger in its own process,
two channels looping LibriVox clips): the clock keeps publishing,
the stage is respawned, captions resume on both channels, no committed word is lost, the
channels never fail, and SIGTERM afterwards still exits 0 with complete files.

The tests of this module share one daemon and run in order.
"""

from __future__ import annotations

import importlib.util
import re
import signal
import time
from pathlib import Path

import pysrt
import pytest
from daemon_helpers import (
    LIBRIVOX,
    SHORT_CLIP,
    START_LIMIT_S,
    TOKEN,
    free_port,
    healthz,
    read_jsonl,
    same_words_shown,
    start_daemon,
    wait_for,
)

OTHER_CLIP = LIBRIVOX / "sense_and_sensibility_01_austen_64kb-0930.wav"
RESPAWN_LIMIT_S = 300.0  # a respawn loads the model again, on a busy 2-core machine

pytestmark = pytest.mark.skipif(
    not OTHER_CLIP.exists() or importlib.util.find_spec("subd.recognise.streaming") is None,
    reason="needs the LibriVox clips (pocketsphinx-testdata) and the streaming recogniser")


def config_text(out: Path, port: int) -> str:
    channels = ""
    for name, clip in (("a", SHORT_CLIP), ("b", OTHER_CLIP)):
        channels += f"""
[channels.{name}.source]
kind = "file"
path = "{clip}"
loop = true
[channels.{name}.sinks.srt]
directory = "{out}/{name}"
[channels.{name}.events]
path = "{out}/{name}.jsonl"
"""
    return f"""
[tick]
latency_ms = 1500
[recognizer]
cpu_processes = 2
[server]
port = {port}
push_token = "{TOKEN}"
[sinks]
enabled = ["srt", "sse"]
{channels}"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stage-faults")
    out = tmp / "out"
    port = free_port()
    proc = start_daemon(tmp, config_text(out, port), port)
    proc.out = out
    try:
        wait_for(lambda: all(n_cues(proc, ch) >= 2 for ch in "ab"), START_LIMIT_S,
                 "captions on both channels", proc.proc, proc.log)
        yield proc
    finally:
        proc.stop()


def report(daemon) -> dict:
    return healthz(daemon.port)[1]


def n_cues(daemon, channel: str) -> int:
    path = daemon.out / channel / "live.srt"
    return len(pysrt.open(str(path), error_handling=pysrt.ERROR_RAISE)) if path.exists() else 0


def committed_ticks(daemon, channel: str) -> list[dict]:
    return read_jsonl(daemon.out / f"{channel}.jsonl")[1]


def srt_words(daemon, channel: str) -> list[str]:
    subs = pysrt.open(str(daemon.out / channel / "live.srt"), error_handling=pysrt.ERROR_RAISE)
    return [w for s in subs for w in s.text.split()]


def fault_and_recover(daemon, stage: str, signum: int) -> dict:
    """Send ``signum`` to ``stage``'s process; return /healthz once it was respawned, after
    checking that both clocks published while it was down."""
    before = report(daemon)
    restarts = before["stages"][stage]["restarts"]
    pid = before["stages"][stage]["pid"]
    cues = {ch: n_cues(daemon, ch) for ch in "ab"}
    import os

    os.kill(pid, signum)
    seen_down: dict = {}

    def respawned():
        r = report(daemon)
        if r["stages"][stage]["state"] != "up" and not seen_down:
            seen_down.update(r)
        return r if r["stages"][stage]["restarts"] > restarts else None

    after = wait_for(respawned, RESPAWN_LIMIT_S, f"the {stage} stage respawned",
                     daemon.proc, daemon.log)
    assert after["stages"][stage]["pid"] != pid
    assert after["stages"][stage]["state"] == "up"
    for ch in "ab":
        # the clock went on through the outage, and the channel never failed
        assert after["channels"][ch]["last_tick"] > before["channels"][ch]["last_tick"]
        assert after["channels"][ch]["state"] == "running"
        assert after["channels"][ch]["state_detail"] == ""
    if seen_down:  # caught while it was down: /healthz said what and why
        assert seen_down["status"] == "degraded"
        assert any(f"{stage} stage restarting" in p for p in seen_down["problems"])
    # captions resume on both channels
    wait_for(lambda: all(n_cues(daemon, ch) > cues[ch] + 1 for ch in "ab"), 120,
             "new cues on both channels", daemon.proc, daemon.log)
    return after


def test_a_killed_recogniser_is_respawned_while_both_clocks_go_on(daemon):
    after = fault_and_recover(daemon, "recognise.0", signal.SIGKILL)
    assert "died" in after["stages"]["recognise.0"]["detail"]
    assert after["stages"]["recognise.1"]["restarts"] == 0  # the other process went on
    for ch in "ab":
        _, ticks = read_jsonl(daemon.out / f"{ch}.jsonl")
        assert [t["k"] for t in ticks] == list(range(len(ticks)))  # not a tick lost


def test_a_stopped_recogniser_is_found_hung_killed_and_replaced(daemon):
    after = fault_and_recover(daemon, "recognise.1", signal.SIGSTOP)
    assert "hung" in after["stages"]["recognise.1"]["detail"]


def test_a_killed_tagger_is_respawned_and_punctuation_goes_on(daemon):
    fault_and_recover(daemon, "tag", signal.SIGKILL)
    time.sleep(3.0)  # a few cues decided by the fresh tagger
    words = srt_words(daemon, "a")[-20:]
    assert any(re.search(r"[.,?!]$", w) for w in words), words


def test_sigterm_after_the_faults_exits_0_with_every_committed_word_in_the_srt(daemon):
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(30) == 0
    log = daemon.log_text()
    assert "Traceback" not in log, log[-3000:]
    assert "leaked shared_memory" not in log, log[-3000:]
    for ch in "ab":
        ticks = committed_ticks(daemon, ch)
        assert sum(len(t["committed"]) for t in ticks) > 30
        shown = srt_words(daemon, ch)
        assert same_words_shown(shown, ticks), shown  # every committed word, once, in order
