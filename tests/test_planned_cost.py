"""``[recognizer] update_cost_ms = N``: captions that depend on the audio alone. Real tiny.en on
a LibriVox clip, through the tick pipeline on a fake clock (``subd bench quality --pace cpu``'s
path), on a device whose updates last 450 / 140 ms (one CPU core) and on one whose updates last
60 / 30 ms (a GPU's): with a planned cost both commit the same words with the same marks and
timings. tests/test_deadline.py shows the schedule itself on a scripted recogniser."""

from __future__ import annotations

import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import soundfile as sf

from subd.bench.quality import streamed
from subd.bench.quality_sets import build_set
from subd.sources.decode import load_audio


def _words(config: str, update_ms: str) -> list[tuple[str, int]]:
    args = Namespace(pace="cpu", config=config, min_update_ms=None, span="config",
                     model="tiny.en", language="en", overrides=[], tagger="auto", punct=[],
                     update_ms=update_ms)
    clip = build_set("dev", ("librivox/0920",)).clips[0]  # "Had he married a more amiable..."
    words, _ = streamed(clip, 2000, args)
    return [(text, end_ns) for text, _, end_ns, _ in words]


def test_a_cpu_and_a_gpu_paced_device_give_the_same_captions_with_a_planned_cost(
        tmp_path, speech_clips):
    config = tmp_path / "planned.toml"
    config.write_text("[recognizer]\nmin_update_ms = 520\nupdate_cost_ms = 500\n")
    cpu = _words(str(config), "450,140")
    gpu = _words(str(config), "60,30")
    assert len(cpu) >= 15  # the clip's words, not a stub
    assert cpu == gpu


def _committed(events: Path) -> list[tuple[str, int, int]]:
    words = []
    for line in events.read_text().splitlines():
        event = json.loads(line)
        if event.get("type") == "tick":
            words += [(w["w"], w["start_ms"], w["end_ms"]) for w in event["committed"]]
    return words


def test_the_serial_and_the_batched_recogniser_give_the_same_captions(tmp_path, speech_clips):
    """`subd stream` on three LibriVox clips joined (18 s), float32 on the CPU, updates planned
    as 900 ms every second of audio: the serial recogniser (the CPU's default) and the batched
    one (what serves every channel on CUDA) commit the same words at the same times. Before
    the daemon's serial recogniser took [recognizer] precision, it ran int8 whatever was set,
    and the two parted from the second word on. The recogniser's own marks (tagger "none"): the
    tagger decides at each tick from the words in by then, and a loaded machine may bring a word in
    late."""
    gap = np.zeros(8000, np.float32)
    audio = np.concatenate([x for c in speech_clips if c.name.endswith(("0870", "0890", "0920"))
                            for x in (load_audio(c.path), gap)])
    wav = tmp_path / "joined.wav"
    sf.write(wav, audio, 16000, subtype="PCM_16")
    got = {}
    for batched in ("off", "on"):
        config = tmp_path / f"{batched}.toml"
        config.write_text(f'[recognizer]\ndevice = "cpu"\nprecision = "fp32"\n'
                          f'batched = "{batched}"\nmin_update_ms = 1000\nupdate_cost_ms = 900\n'
                          '[pipeline]\ntagger = "none"\n')
        events = tmp_path / f"{batched}.jsonl"
        done = subprocess.run([sys.executable, "-m", "subd.cli", "stream", str(wav), "--config",
                               str(config), "--events", str(events)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert ("batched" in done.stderr) == (batched == "on")
        got[batched] = _committed(events)
    assert len(got["off"]) >= 35 and "Dashwood" in " ".join(w for w, _, _ in got["off"])
    assert got["off"] == got["on"]
