"""`subd transcribe` end to end: real files in every shape, bad input, silence and noise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pysrt
import pytest
import soundfile as sf

from tests.conftest import normalise, word_errors


def run_cli(*args: str, stdin: bytes | None = None, timeout_s: float = 600) -> tuple[int, str, int]:
    """Run `subd` in a child; return (exit code, stderr, peak RSS of the child in MB)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "subd.cli", *args],
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _, err = proc.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    rss_mb = 0
    try:
        _, _, usage = os.wait4(proc.pid, 0)
        rss_mb = usage.ru_maxrss // 1024
    except ChildProcessError:
        pass
    return proc.returncode, err.decode(), rss_mb


def words_of(path: Path) -> list[str]:
    return [w["w"] for w in json.loads(path.read_text())["words"]]


def assert_one_line_error(code: int, err: str, needle: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("subd: error:"), err
    assert needle in lines[0]


@pytest.fixture(scope="module")
def clip(speech_clips):
    c = speech_clips[0]
    audio, rate = sf.read(c.path, dtype="float32")
    return c, audio, rate


def _wer(transcript: str, words: list[str]) -> float:
    ref = transcript.split()
    return word_errors(ref, normalise(" ".join(words))) / len(ref)


def test_empty_file(tmp_path):
    bad = tmp_path / "empty.wav"
    bad.write_bytes(b"")
    code, err, _ = run_cli("transcribe", str(bad), "-o", str(tmp_path / "o.srt"))
    assert_one_line_error(code, err, str(bad))


def test_truncated_wav_header(tmp_path, clip):
    bad = tmp_path / "cut.wav"
    bad.write_bytes(clip[0].path.read_bytes()[:30])
    code, err, _ = run_cli("transcribe", str(bad), "-o", str(tmp_path / "o.srt"))
    assert_one_line_error(code, err, str(bad))


def test_text_file_named_wav(tmp_path):
    bad = tmp_path / "notes.wav"
    bad.write_text("this is not audio\n" * 20)
    code, err, _ = run_cli("transcribe", str(bad), "-o", str(tmp_path / "o.srt"))
    assert_one_line_error(code, err, "text")


def test_bad_output_suffix(tmp_path, clip):
    code, err, _ = run_cli("transcribe", str(clip[0].path), "-o", str(tmp_path / "o.txt"))
    assert_one_line_error(code, err, ".srt")


@pytest.mark.parametrize(
    "variant",
    ["pcm_u8", "pcm_24", "float", "rate_8k", "rate_48k", "stereo", "nan_inf", "flac"],
)
def test_formats_give_the_transcript(tmp_path, clip, variant):
    c, audio, rate = clip
    path = tmp_path / f"{variant}.wav"
    subtype, data, out_rate = "PCM_16", audio, rate
    if variant == "pcm_u8":
        subtype = "PCM_U8"
    elif variant == "pcm_24":
        subtype = "PCM_24"
    elif variant in ("float", "nan_inf"):
        subtype = "FLOAT"
    if variant == "rate_8k":
        import soxr

        data, out_rate = soxr.resample(audio, rate, 8000), 8000
    elif variant == "rate_48k":
        import soxr

        data, out_rate = soxr.resample(audio, rate, 48000), 48000
    elif variant == "stereo":
        data = np.stack([audio, 0.5 * audio], axis=1)
    elif variant == "nan_inf":
        data = audio.copy()
        data[1000:1010] = np.nan
        data[5000] = np.inf
        data[6000] = -np.inf
    elif variant == "flac":
        path = tmp_path / "clip.flac"
    sf.write(path, data, out_rate, subtype=subtype if variant != "flac" else "PCM_16")
    out = tmp_path / "o.json"
    code, err, _ = run_cli("transcribe", str(path), "-o", str(out))
    assert code == 0, err
    assert "Traceback" not in err
    wer = _wer(c.transcript, words_of(out))
    assert wer <= 0.15, (variant, words_of(out))
    if variant == "nan_inf":
        assert "non-finite" in err or "NaN" in err or "nan" in err


def test_stdin_pcm(tmp_path, clip):
    c, audio, rate = clip
    pcm = (audio * 32767).astype("<i2").tobytes()
    out = tmp_path / "o.json"
    code, err, _ = run_cli(
        "transcribe",
        "-",
        "-o",
        str(out),
        "--format",
        "s16le",
        "--rate",
        str(rate),
        "--channels",
        "1",
        stdin=pcm,
    )
    assert code == 0, err
    assert _wer(c.transcript, words_of(out)) <= 0.15


def test_stdin_bad_rate(tmp_path):
    code, err, _ = run_cli(
        "transcribe", "-", "-o", str(tmp_path / "o.json"), "--rate", "0", stdin=b""
    )
    assert_one_line_error(code, err, "rate")


def test_srt_and_vtt_outputs_parse(tmp_path, clip):
    import webvtt

    srt, vtt = tmp_path / "o.srt", tmp_path / "o.vtt"
    assert run_cli("transcribe", str(clip[0].path), "-o", str(srt))[0] == 0
    assert run_cli("transcribe", str(clip[0].path), "-o", str(vtt))[0] == 0
    subs = pysrt.open(str(srt))
    assert len(subs) >= 1
    text = " ".join(s.text for s in subs)
    assert "Dashwood" in text
    starts = [s.start.ordinal for s in subs]
    assert starts == sorted(starts)
    captions = webvtt.read(str(vtt))
    assert "Dashwood" in " ".join(c.text for c in captions)
    # the mode a plain write gives (0666 less the umask, which the child inherits), not
    # the temporary file's 0600: a web server or another user reads the captions
    umask = os.umask(0)
    os.umask(umask)
    assert srt.stat().st_mode & 0o777 == 0o666 & ~umask
    # written again, the file keeps the mode it had
    srt.chmod(0o640)
    assert run_cli("transcribe", str(clip[0].path), "-o", str(srt))[0] == 0
    assert srt.stat().st_mode & 0o777 == 0o640


def test_without_an_output_the_cues_are_printed_as_the_srt_holds_them(tmp_path, clip):
    """`subd transcribe IN` (no -o) prints the cues on stdout, as `subd stream` prints them:
    the same cues the SRT gets, time for time and line for line."""
    import re

    srt = tmp_path / "o.srt"
    assert run_cli("transcribe", str(clip[0].path), "-o", str(srt), "--quiet")[0] == 0
    proc = subprocess.run([sys.executable, "-m", "subd.cli", "transcribe", str(clip[0].path),
                           "--quiet"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    blocks = re.findall(r"^(\S+) --> (\S+)  (.*)\n((?: {31}.*\n)*)", proc.stdout, flags=re.M)
    printed = [(a.replace(".", ","), b.replace(".", ","),
                "\n".join([first, *(ln.strip() for ln in rest.splitlines())]))
               for a, b, first, rest in blocks]
    assert printed and printed == [(str(s.start), str(s.end), s.text)
                                   for s in pysrt.open(str(srt))], proc.stdout


def test_an_output_that_cannot_be_written_is_one_line_before_the_work(tmp_path, clip):
    """Checked before any audio is read: not an internal error after the whole file."""
    (tmp_path / "notes").write_text("a file, not a folder\n")
    code, err, _ = run_cli("transcribe", str(clip[0].path), "-o",
                           str(tmp_path / "notes" / "o.srt"))
    assert_one_line_error(code, err, "not a folder")
    code, err, _ = run_cli("transcribe", str(clip[0].path), "-o", "/proc/subd-test/o.srt")
    assert_one_line_error(code, err, "cannot write")


def _write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.astype("<i2").tobytes())


def test_silence_and_white_noise_give_no_words(tmp_path):
    rng = np.random.default_rng(0)
    silence = tmp_path / "silence.wav"
    noise = tmp_path / "noise.wav"
    _write_wav(silence, np.zeros(60 * 16000), 16000)
    _write_wav(noise, np.clip(rng.normal(0, 0.1, 60 * 16000), -1, 1) * 32767, 16000)
    for path in (silence, noise):
        out = tmp_path / (path.stem + ".json")
        code, err, _ = run_cli("transcribe", str(path), "-o", str(out), "--quiet")
        assert code == 0, err
        assert words_of(out) == [], path.name
    # without --quiet the user is told why the file holds no cue (an empty SRT said nothing)
    out = tmp_path / "silence.srt"
    code, err, _ = run_cli("transcribe", str(silence), "-o", str(out))
    assert code == 0 and out.read_text() == ""
    assert f"no speech found in {silence}; {out} holds no cue" in err


def test_two_hours_of_silence_stream_in_bounded_memory(tmp_path):
    """A 2-hour file is streamed: the process never holds it whole (460 MB as float32)."""
    path = tmp_path / "two_hours.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        zeros = bytes(2 * 8000 * 60)
        for _ in range(120):
            w.writeframes(zeros)
    out = tmp_path / "o.json"
    code, err, rss_mb = run_cli("transcribe", str(path), "-o", str(out), "--quiet")
    assert code == 0, err
    assert words_of(out) == []
    # model + torch ≈ 400-600 MB; holding the decoded file would add ≥ 460 MB more
    assert rss_mb < 900, rss_mb


def test_a_window_whisper_ends_early_is_decoded_again_from_where_it_stopped(tmp_path,
                                                                            speech_clips):
    """The held-out set as one 103.5 s file: Whisper closed the window at 78.8 s after one
    sentence, and the last 20 s (two clips) were never transcribed (WER 28.9 %). The rest of
    that window is decoded again, its words timed within the file and in order."""
    from subd.bench.quality_sets import SETS, build_set

    held = build_set("heldout", SETS["heldout"][:16])  # the set before 2026-12-04's clips
    wav, out = tmp_path / "heldout.wav", tmp_path / "o.json"
    sf.write(wav, held.audio, 16000, subtype="PCM_16")
    code, err, _ = run_cli("transcribe", str(wav), "-o", str(out))
    assert code == 0, err
    words = json.loads(out.read_text())["words"]
    said = normalise(" ".join(w["w"] for w in words))
    assert word_errors(held.words, said) / len(held.words) < 0.15
    assert {"gown", "wizard", "curtain"} <= set(said[-40:])  # the last two clips
    starts = [w["start_ms"] for w in words]
    assert starts == sorted(starts)
    assert max(w["end_ms"] for w in words) <= len(held.audio) / 16


def test_the_window_moves_to_the_transcripts_end_only_with_speech_left_after_it():
    from subd.recognise.offline import _seek_to_unheard

    second = 16000
    # a segment ending at 3.00 s (timestamp step 150), speech until 20 s: decode from 3 s on
    assert _seek_to_unheard(150, [(0, 3 * second), (4 * second, 20 * second)]) == 300
    # only a breath after it (under a second): the whole window, as the reference runtime
    assert _seek_to_unheard(150, [(0, 3 * second), (int(3.2 * second), int(3.9 * second))]) is None
    # speech overlapping the end counts only after it
    assert _seek_to_unheard(150, [(0, int(3.5 * second))]) is None
    assert _seek_to_unheard(0, [(0, 20 * second)]) is None  # no end known
    # a transcript that ends at 0.1 s moves the window a second on, not 0.1 s
    assert _seek_to_unheard(5, [(0, 20 * second)]) == 100
