"""The live pipeline end to end: worker processes, real clock, events log, CLI errors."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
import soundfile as sf
from daemon_helpers import START_LIMIT_S, healthz, wait_for

from subd.cli import main
from subd.config import load_config
from subd.scoring.wer import normalise, word_errors
from subd.service.daemon import Daemon
from subd.sinks import available_sinks
from subd.sinks.events_log import read_events
from subd.sources.live import FileSource
from subd.testing.recognizer import script_words
from subd.types import SAMPLE_RATE_HZ
from subd.workers.hosts import FactorySpec


@pytest.fixture
def silent_wav(tmp_path):
    path = tmp_path / "in.wav"
    sf.write(path, np.zeros(int(2.5 * SAMPLE_RATE_HZ), dtype=np.float32), SAMPLE_RATE_HZ)
    return path


@pytest.mark.parametrize("tagger", ["none", "auto"])
def test_pipeline_with_worker_processes_publishes_every_word_once(tmp_path, silent_wav, tagger):
    cfg = load_config(None)
    cfg = cfg.replace(tick=cfg.tick.__class__(latency_ms=900, realtime=False),
                      pipeline=cfg.pipeline.__class__(tagger=tagger))
    script = script_words(5)
    source = FileSource.from_path(silent_wav, speed=Fraction(2), jitter_ms=30)
    events = tmp_path / "events.jsonl"
    daemon = Daemon(cfg, source, events_path=str(events),
                    recognizer=FactorySpec("subd.testing.recognizer:ScriptedRecognizer",
                                           {"words": script, "commit_delay_ms": 400}))
    counters = asyncio.run(daemon.run())
    start, ticks = read_events(events)
    assert start["fps"] == "30/1" and start["latency_ms"] == 900
    assert [t["k"] for t in ticks] == list(range(len(ticks)))
    # at speed 2 the ticks come twice as often: T(k) = t0 + floor((k+1)·P/2) + D
    for t in ticks:
        assert t["due_ns"] == start["t0_ns"] + (t["k"] + 1) * 10**9 // 60 + 900_000_000
        assert t["sent_ns"] >= t["due_ns"]  # never early
    words = [c["w"] for t in ticks for c in t["committed"]]
    if tagger == "none":
        assert words == [w for w, _, _ in script]
    else:  # the CRF tagger in its own process: same words, its case and punctuation
        assert [w.lower().strip(".,?!") for w in words] == [w for w, _, _ in script]
    assert counters.ticks == len(ticks)


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_stream_rejects_a_missing_file_in_one_line(tmp_path, capsys):
    assert main(["stream", str(tmp_path / "nope.wav")]) == 2
    assert "nope.wav: no such file" in _error_line(capsys)


def test_stream_rejects_a_non_audio_file(tmp_path, capsys):
    bad = tmp_path / "bad.wav"
    bad.write_text("not audio")
    assert main(["stream", str(bad)]) == 2
    assert "bad.wav: not an audio file" in _error_line(capsys)


@pytest.mark.parametrize("argv,needle", [
    (["--serve", "localhost"], "expected HOST:PORT"),
    (["--fps", "0"], "fps"),
    (["--fps", "thirty"], "not a frame rate"),
    (["--speed", "-1"], "speed"),
    (["--latency-ms", "5"], "--latency-ms"),
    (["--jitter-ms", "-3"], "--jitter-ms"),
    # a folder that exists but takes no file (the cues were lost, logged, at the stream's end)
    (["--srt", "/proc/subd-live.srt"], "--srt /proc/subd-live.srt: cannot write"),
    (["--events", "/proc/subd-events.jsonl"], "--events /proc/subd-events.jsonl: cannot write"),
])
def test_stream_rejects_bad_options_in_one_line(silent_wav, capsys, argv, needle):
    assert main(["stream", str(silent_wav), *argv]) == 2
    assert needle in _error_line(capsys)


@pytest.mark.parametrize("argv,needle", [
    (["-", "--speed", "2"], "stdin (-) is live"),
    (["-", "--jitter-ms", "40"], "stdin (-) is live"),
    (["FILE", "--format", "f32le"], "--format: for raw PCM on stdin"),
    (["FILE", "--rate", "48000", "--channels", "2"], "--rate, --channels: for raw PCM on stdin"),
    (["-", "--rate", "5"], "bad --rate 5"),
    (["-", "--channels", "0"], "bad --channels 0"),
])
def test_stream_refuses_pacing_a_live_stdin_and_a_format_for_a_file(silent_wav, capsys, argv,
                                                                     needle):
    argv = [str(silent_wav) if a == "FILE" else a for a in argv]
    assert main(["stream", *argv]) == 2
    assert needle in _error_line(capsys)


@pytest.mark.parametrize("fmt,rate,channels", [("s16le", 16000, 1), ("f32le", 16000, 1),
                                               ("s16le", 48000, 2)])
def test_stream_captions_live_pcm_piped_on_stdin(speech_clips, tmp_path, fmt, rate, channels):
    import soxr

    clip = speech_clips[0]
    audio, clip_rate = sf.read(clip.path, dtype="float32")
    assert clip_rate == SAMPLE_RATE_HZ and audio.ndim == 1
    if rate != SAMPLE_RATE_HZ:  # as a capture card gives it: 48 kHz, both channels
        audio = soxr.resample(audio, SAMPLE_RATE_HZ, rate).astype(np.float32)
    frames = np.repeat(audio[:, None], channels, axis=1)
    pcm = (np.clip(frames, -1, 1) * 32767).astype("<i2") if fmt == "s16le" \
        else frames.astype("<f4")
    out = tmp_path / "live.srt"
    proc = subprocess.run([sys.executable, "-m", "subd.cli", "stream", "-", "--format", fmt,
                           "--rate", str(rate), "--channels", str(channels),
                           "--srt", str(out)], input=pcm.tobytes(), capture_output=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    summary = json.loads(proc.stderr.decode().strip().splitlines()[-1])  # its last line
    assert summary["lost_samples"] == 0, summary  # (its misses are the machine's load's)
    # the whole clip was heard: its ticks cover its length
    assert summary["ticks"] >= int(len(audio) / rate * 30) - 2, summary
    words = normalise(" ".join(s.text for s in pysrt_open(out)))
    errors = word_errors(clip.transcript.split(), words)
    assert errors <= len(clip.transcript.split()) * 0.25, (words, clip.transcript)


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg is not installed")
def test_stream_plays_a_video_file_as_subd_transcribe_reads_it(speech_clips, tmp_path):
    clip = speech_clips[0]
    video = tmp_path / "talk.mp4"  # AAC in MP4 with a picture: what a recording is
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-f", "lavfi", "-i",
                    "color=black:s=64x64:r=5", "-i", str(clip.path), "-shortest", "-c:v",
                    "mpeg4", "-c:a", "aac", str(video)], check=True)
    out = tmp_path / "live.srt"
    assert main(["stream", str(video), "--speed", "4", "--srt", str(out)]) == 0
    words = normalise(" ".join(s.text for s in pysrt_open(out)))
    assert word_errors(clip.transcript.split(), words) <= len(clip.transcript.split()) * 0.25, \
        (words, clip.transcript)


@pytest.mark.parametrize("command", ["stream", "transcribe"])
def test_a_terminal_on_stdin_is_refused_in_one_line(command, tmp_path):
    import pty

    controller, terminal = pty.openpty()  # stdin a terminal, as when `-` is typed by mistake
    try:
        extra = ["-o", str(tmp_path / "out.srt")] if command == "transcribe" else []
        proc = subprocess.run([sys.executable, "-m", "subd.cli", command, "-", *extra],
                              stdin=terminal, capture_output=True, timeout=60)
    finally:
        os.close(controller)
        os.close(terminal)
    err = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, err
    assert err[0].startswith("subd: error: -: standard input is a terminal; pipe raw PCM"), err
    assert f"| subd {command} -" in err[0]


def test_stream_of_an_empty_stdin_ends_with_one_error_said_once():
    proc = subprocess.run([sys.executable, "-m", "subd.cli", "stream", "-"], input=b"",
                          capture_output=True, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.strip().splitlines()[-1] == "subd: error: stdin: no PCM data", err
    assert "task " not in err and "Traceback" not in err, err  # not logged again on its way
    assert "source down" not in err and err.count("no PCM data") == 1, err


def pysrt_open(path):
    return pytest.importorskip("pysrt").open(str(path))


def test_stream_names_a_sink_that_is_not_registered(silent_wav, capsys, tmp_path):
    assert "nope" not in available_sinks()
    cfg = tmp_path / "c.toml"
    cfg.write_text('[sinks]\nenabled = ["nope"]\n')
    assert main(["stream", str(silent_wav), "--config", str(cfg)]) == 2
    assert "unknown sink 'nope'" in _error_line(capsys)


def test_stream_says_which_outputs_of_its_config_it_does_not_use(tmp_path, silent_wav,
                                                                 caplog):
    from subd.commands.stream import stream_config

    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[sinks]\nenabled = ["srt"]\n[events]\npath = "{tmp_path}/ev.jsonl"\n')
    args = argparse.Namespace(config=str(cfg), jitter_ms=0, speed="1", fps=None,
                              latency_ms=None, lookahead_ms=None, input=str(silent_wav),
                              language=None, model=None, chinese_script=None, device=None,
                              pcm_format=None, pcm_rate_hz=None, pcm_channels=None,
                              prompt=None)
    stream_config(args)
    assert "[sinks] enabled, [events] path not used by subd stream" in caplog.text
    caplog.clear()
    cfg.write_text("[tick]\nlatency_ms = 1500\n")
    assert stream_config(args).tick.latency_ms == 1500 and "not used" not in caplog.text


def test_bad_config_file_is_one_line(tmp_path, silent_wav, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[tick]\nlatency_ms = 5\n")
    assert main(["stream", str(silent_wav), "--config", str(cfg)]) == 2
    assert "[tick] latency_ms: 5 is out of range" in _error_line(capsys)


needs_recogniser = pytest.mark.skipif(
    importlib.util.find_spec("subd.recognise.streaming") is None,
    reason="the streaming recogniser (subd/recognise/streaming.py) is not installed yet")


@needs_recogniser
def test_stream_cli_on_real_speech_writes_the_events_log(espeak_clips, tmp_path):
    clip = espeak_clips[1]
    events = tmp_path / "logs" / "events.jsonl"  # its folder is made
    assert main(["stream", str(clip.path), "--events", str(events), "--latency-ms", "3000"]) == 0
    start, ticks = read_events(events)
    assert start["type"] == "start" and start["lookahead_ms"] == 150
    assert [t["k"] for t in ticks] == list(range(len(ticks)))
    assert all(t["sent_ns"] >= t["due_ns"] for t in ticks)
    words = {c["w"].lower().strip(".,?!") for t in ticks for c in t["committed"]}
    assert len(words & set(clip.transcript.split())) >= 5, words


class CommitLog:
    def __init__(self) -> None:
        self.committed: list[str] = []
        self.published: list[str] = []

    def on_hypothesis(self, result, now_ns: int) -> None:
        self.committed += [w.text for w in result.hypothesis.committed]

    def on_publish(self, state, sent_ns: int) -> None:
        self.published += [tw.word.text for tw in state.committed]


@needs_recogniser
def test_every_word_the_real_recogniser_commits_is_published_once(espeak_clips):
    cfg = load_config(None)
    cfg = cfg.replace(tick=cfg.tick.__class__(latency_ms=2500, realtime=False))
    log = CommitLog()
    source = FileSource.from_path(espeak_clips[2].path, jitter_ms=50)
    asyncio.run(Daemon(cfg, source, observer=log).run())
    assert log.committed and log.published == log.committed


def test_run_shipped_config_serves_events_from_the_demo_clip(tmp_path):
    """`subd run` with the shipped config.toml (on a free port): SSE events arrive, and
    SIGTERM stops the daemon cleanly."""
    import re
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from subd.service.daemon import DEMO_CLIP

    repo = Path(__file__).resolve().parent.parent
    if not (repo / "subd" / Path(*DEMO_CLIP)).is_file():
        pytest.skip("the bundled demo clip subd/data/demo.wav is not there yet")
    if "sse" not in available_sinks() or \
            importlib.util.find_spec("subd.recognise.streaming") is None:
        pytest.skip("needs the registered sse sink and the streaming recogniser")
    text = (repo / "config.toml").read_text()
    assert "port = 8765" in text and 'host = "127.0.0.1"' in text
    cfg = tmp_path / "config.toml"
    cfg.write_text(text.replace("port = 8765", "port = 0"))
    proc = subprocess.Popen([sys.executable, "-m", "subd.cli", "run", "--config", str(cfg)],
                            stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in proc.stderr:
            m = re.search(r"serving http://127\.0\.0\.1:(\d+)/events", line)
            if m:
                port = int(m.group(1))
                break
        assert port, "the daemon never said where it serves"
        # the port is bound before the model loads: /events is there once /healthz says ok
        wait_for(lambda: healthz(port)[1]["status"] == "ok", START_LIMIT_S, "/healthz ok", proc)

        async def read_events():
            import aiohttp

            got = []
            async with aiohttp.ClientSession() as session, \
                    session.get(f"http://127.0.0.1:{port}/events") as resp:
                while len(got) < 3:
                    line = (await resp.content.readline()).decode()
                    assert line, "the event stream ended"
                    if line.startswith("data:"):
                        got.append(json.loads(line[5:]))
            return got

        events = asyncio.run(asyncio.wait_for(read_events(), 120))
        assert all("due_ns" in e for e in events)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def test_run_with_a_config_file_streams_the_configured_source(tmp_path, silent_wav):
    events = tmp_path / "ev.jsonl"
    cfg = tmp_path / "subd.toml"
    cfg.write_text(f"""
[tick]
latency_ms = 800
realtime = false
[source]
kind = "file"
path = "{silent_wav}"
speed = 4.0
loop = false
[recognizer]
factory = "subd.testing.recognizer:ScriptedRecognizer"
[pipeline]
tagger = "none"
[sinks]
enabled = []
[events]
path = "{events}"
""")
    assert main(["run", "--config", str(cfg)]) == 0
    start, ticks = read_events(events)
    words = [c["w"] for t in ticks for c in t["committed"]]
    # the scripted words that end within the 2.5 s file, each once, in order
    assert words == [w for w, _, end_ms in script_words(50) if end_ms <= 2500]


@pytest.mark.parametrize(("table", "needle"), [
    ('[sinks]\nenabled = ["srt"]\n[sinks.srt]\ndirectory = "/proc/subd-captions"\n',
     "[sinks.srt] directory /proc/subd-captions: cannot write"),
    ('[events]\npath = "/proc/subd/events.jsonl"\n',
     "[events] path /proc/subd/events.jsonl: cannot write"),
    ('[channels.studio-a.sinks]\nenabled = ["vtt"]\n[channels.studio-a.sinks.vtt]\n'
     'directory = "/proc/subd-vtt"\n',
     "channel studio-a: [sinks.vtt] directory /proc/subd-vtt: cannot write"),
    # the channel's sink takes the top level's options
    ('[sinks.srt]\ndirectory = "/proc/top"\n[channels.b.sinks]\nenabled = ["srt"]\n',
     "channel b: [sinks.srt] directory /proc/top: cannot write"),
])
def test_run_refuses_outputs_that_cannot_be_written_before_it_starts(tmp_path, capsys, table,
                                                                      needle):
    # before: the channel failed at its start and was restarted for ever, SSE captions too
    cfg = tmp_path / "subd.toml"
    cfg.write_text(table)
    assert main(["run", "--config", str(cfg)]) == 2
    assert needle in _error_line(capsys)


def test_daemon_serves_sse_events_carrying_tick_and_due_time(tmp_path, silent_wav):
    aiohttp = pytest.importorskip("aiohttp")
    from subd.sinks.sse.sink import SSESink

    cfg = load_config(None)
    cfg = cfg.replace(tick=cfg.tick.__class__(latency_ms=700, realtime=False),
                      pipeline=cfg.pipeline.__class__(tagger="none"))
    source = FileSource.from_path(silent_wav, speed=Fraction(4))
    sink = SSESink()
    daemon = Daemon(cfg, source, sinks=[sink], serve=("127.0.0.1", 0),
                    recognizer=FactorySpec("subd.testing.recognizer:ScriptedRecognizer"))

    async def main_():
        run = asyncio.ensure_future(daemon.run())
        # the port is bound before the model loads; /events is there once the source runs
        while daemon.bound_port is None or not source.t0_ns:
            assert not run.done()
            await asyncio.sleep(0.01)
        events = []
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{daemon.bound_port}/events"
            async with session.get(url) as resp:
                assert resp.status == 200
                while len(events) < 5:
                    line = (await resp.content.readline()).decode()
                    if line.startswith("data:"):
                        events.append(json.loads(line[5:]))
        await run
        return events

    events = asyncio.run(main_())
    ks = [e["k"] for e in events if "k" in e]
    assert ks == sorted(ks) and len(ks) >= 4
    assert all(isinstance(e["due_ns"], int) for e in events if "k" in e)


@needs_recogniser
@pytest.mark.parametrize("quiet", [False, True])
def test_stream_writes_a_live_srt_of_the_committed_cues(espeak_clips, tmp_path, capsys, quiet):
    """... and prints the same cues on stdout as they are committed, unless --quiet."""
    pysrt = pytest.importorskip("pysrt")
    if "srt" not in available_sinks():
        pytest.skip("no srt sink registered")
    out = tmp_path / "captions" / "live.srt"  # a folder not made yet is made, as by transcribe -o
    assert main(["stream", str(espeak_clips[1].path), "--srt", str(out), "--speed", "2",
                 "--latency-ms", "3000", *(["--quiet"] if quiet else [])]) == 0
    subs = pysrt.open(str(out))
    text = " ".join(s.text for s in subs).lower()
    assert len(subs) >= 1 and ("stella" in text or "store" in text or "call" in text), text
    assert all(s.start <= s.end for s in subs)
    printed = capsys.readouterr().out
    if quiet:
        assert printed == ""
        return
    blocks = re.findall(r"^(\d\d:\d\d:\d\d\.\d{3}) --> (\d\d:\d\d:\d\d\.\d{3})  (.*)\n"
                        r"((?: {31}.*\n)*)", printed, flags=re.M)
    assert [(a.replace(".", ","), b.replace(".", ","),
             "\n".join([first, *(ln.strip() for ln in rest.splitlines())]))
            for a, b, first, rest in blocks] == [
        (str(s.start), str(s.end), s.text) for s in subs], printed
