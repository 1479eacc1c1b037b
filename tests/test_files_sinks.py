"""Live SRT/WebVTT: pysrt, webvtt-py and ffmpeg read them; rotation; confinement; disk full."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import pysrt
import pytest
import webvtt

from subd.errors import ConfigError
from subd.layout.cues import CueLayout
from subd.sinks import files
from subd.sinks.files import FileSinkConfig, SRTSink, VTTSink
from subd.testing.sinks import script_states, script_words
from subd.types import Cue


def reference_cues() -> list[Cue]:
    layout = CueLayout()
    cues: list[Cue] = []
    for state in script_states(script_words()):
        cues += layout.push(state.committed, state.audio_end_ns, state.tentative)
    return cues + layout.finish()


def run_sinks(*sinks: files.CueFileSink, speed: int = 1) -> None:
    async def main() -> None:
        for sink in sinks:
            await sink.start()
        for state in script_states(script_words(), audio_per_tick=Fraction(speed)):
            for sink in sinks:
                sink.publish(state)
            await asyncio.sleep(0)
        for sink in sinks:
            await sink.close()

    asyncio.run(main())


def srt_cues(path: Path) -> list[tuple[int, int, str]]:
    subs = pysrt.open(str(path), error_handling=pysrt.ERROR_RAISE)
    return [(s.start.ordinal, s.end.ordinal, s.text) for s in subs]


def expected(cues: list[Cue]) -> list[tuple[int, int, str]]:
    return [(c.start_ns // 10**6, c.end_ns // 10**6, "\n".join(c.lines)) for c in cues]


def ffmpeg_reads(path: Path) -> str:
    """ffmpeg's SRT rendering of ``path`` (it fails on a malformed file)."""
    proc = subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-i", str(path), "-map", "0:s", "-c:s", "srt",
         "-f", "srt", "-"], capture_output=True, timeout=60,
    )
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr.decode()
    return proc.stdout.decode()


def test_srt_and_vtt_hold_every_committed_cue_and_parse_everywhere(tmp_path: Path) -> None:
    srt = SRTSink(FileSinkConfig(directory=str(tmp_path)))
    vtt = VTTSink(FileSinkConfig(directory=str(tmp_path)))
    run_sinks(srt, vtt)
    cues = reference_cues()
    assert len(cues) >= 8
    assert srt_cues(tmp_path / "live.srt") == expected(cues)
    captions = webvtt.read(str(tmp_path / "live.vtt"))
    assert [c.text for c in captions] == ["\n".join(c.lines) for c in cues]
    assert captions[0].start == "00:00:00.000"
    assert srt.n_durable == vtt.n_durable == len(cues) and srt.n_write_errors == 0
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg not installed")
    for name in ("live.srt", "live.vtt"):
        rendered = ffmpeg_reads(tmp_path / name)
        assert rendered.count(" --> ") == len(cues)
        assert "good night." in rendered
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_vtt_escapes_markup(tmp_path: Path) -> None:
    sink = VTTSink(FileSinkConfig(directory=str(tmp_path)))
    block = sink.format_cue(1, Cue(1, 0, 10**9, ("a <b> & c",)))
    assert block == b"1\n00:00:00.000 --> 00:00:01.000\na &lt;b&gt; &amp; c\n\n"


@pytest.mark.parametrize("rotation", [{"rotate_bytes": 300}, {"rotate_s": 10}])
def test_rotation_keeps_every_cue_in_valid_files(tmp_path: Path, rotation: dict) -> None:
    sink = SRTSink(files.from_mapping(FileSinkConfig, "sinks.srt",
                                      {"directory": str(tmp_path), **rotation}))
    run_sinks(sink, speed=5)
    rotated = sorted(tmp_path.glob("live.0*.srt"))
    assert len(rotated) >= 2
    got = [cue for path in rotated + [tmp_path / "live.srt"] for cue in srt_cues(path)]
    assert got == expected(reference_cues())
    for path in rotated:
        if "rotate_bytes" in rotation:
            assert path.stat().st_size <= 300 or len(srt_cues(path)) == 1
        assert pysrt.open(str(path))[0].index == 1


def test_file_from_an_earlier_run_is_kept(tmp_path: Path) -> None:
    old = "1\n00:00:01,000 --> 00:00:02,000\nold run\n\n"
    (tmp_path / "live.srt").write_text(old)
    (tmp_path / "live.0001.srt").write_text(old)
    run_sinks(SRTSink(FileSinkConfig(directory=str(tmp_path))), speed=10)
    assert (tmp_path / "live.0002.srt").read_text() == old
    assert srt_cues(tmp_path / "live.srt") == expected(reference_cues())


@pytest.mark.parametrize("filename", ["../escape.srt", "/etc/x.srt", "a/../../b.srt"])
def test_paths_outside_the_directory_are_refused(tmp_path: Path, filename: str) -> None:
    with pytest.raises(ConfigError, match=r"^\[sinks.files\] filename"):
        SRTSink(FileSinkConfig(directory=str(tmp_path / "out"), filename=filename))


def test_symlinks_out_of_the_directory_are_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "captions"
    root.mkdir()
    (root / "sub").symlink_to(outside)
    (root / "live.srt").symlink_to(outside / "victim.srt")
    with pytest.raises(ConfigError, match="resolves outside directory"):
        SRTSink(FileSinkConfig(directory=str(root), filename="sub/live.srt"))
    with pytest.raises(ConfigError, match="resolves outside directory"):
        SRTSink(FileSinkConfig(directory=str(root)))
    assert list(outside.iterdir()) == []


def test_full_disk_is_counted_and_retried_without_losing_cues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = files._write_block
    failures = {"left": 25}

    def flaky(fd: int, data: bytes) -> int:
        if failures["left"] > 0:
            failures["left"] -= 1
            if failures["left"] % 2:  # the disk took half the block, then filled up
                real(fd, data[: len(data) // 2])
                return len(data) // 2
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(files, "_write_block", flaky)
    sink = SRTSink(FileSinkConfig(directory=str(tmp_path), retry_ms=10))

    async def main() -> None:
        await sink.start()
        for state in script_states(script_words(), audio_per_tick=Fraction(4)):
            sink.publish(state)  # the daemon keeps publishing while the disk is full
            await asyncio.sleep(0.002)
        while failures["left"] > 0 or sink.n_durable < sink.n_committed:
            await asyncio.sleep(0.01)
        await sink.close()

    asyncio.run(main())
    assert sink.n_write_errors == 25
    assert "disk full" in caplog.text
    assert srt_cues(tmp_path / "live.srt") == expected(reference_cues())


def test_a_folder_that_cannot_be_made_yet_holds_the_cues_until_it_can(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a file where the folder should be (a mount not there yet): the sink starts, and the
    # channel with it, the cues wait; before, start() raised and the channel went down
    (tmp_path / "mnt").write_text("in the way")
    sink = SRTSink(FileSinkConfig(directory=str(tmp_path / "mnt" / "captions"), retry_ms=10))

    async def main() -> None:
        await sink.start()
        for i, state in enumerate(script_states(script_words(), audio_per_tick=Fraction(4))):
            sink.publish(state)
            if i == 40:
                assert sink.n_write_errors > 0 and sink.n_durable == 0
                (tmp_path / "mnt").unlink()  # the mount came
            await asyncio.sleep(0.002)
        while sink.n_durable < sink.n_committed:
            await asyncio.sleep(0.01)
        await sink.close()

    asyncio.run(main())
    assert "cannot write" in caplog.text and sink.n_lost == 0
    assert srt_cues(tmp_path / "mnt" / "captions" / "live.srt") == expected(reference_cues())


def test_bad_config_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[sinks.srt\] rotate_bytes = -1: must be in"):
        SRTSink.from_mapping({"directory": str(tmp_path), "rotate_bytes": -1})
    with pytest.raises(ConfigError, match=r"\[sinks.srt\] unknown key 'dir'"):
        SRTSink.from_mapping({"dir": str(tmp_path)})


def test_rotation_is_on_by_default_daily_and_by_size() -> None:
    cfg = FileSinkConfig()
    assert cfg.rotate_s == 86_400 and 0 < cfg.rotate_bytes <= 1 << 30


def test_a_torn_tail_is_cut_off_when_the_file_is_opened(tmp_path: Path) -> None:
    """A crash in the middle of a cue's write (power loss, disk full) leaves half a block; the
    next start repairs the file before keeping it, so real parsers read every whole cue."""
    run_sinks(SRTSink(FileSinkConfig(directory=str(tmp_path))),
              VTTSink(FileSinkConfig(directory=str(tmp_path))), speed=10)
    whole = {name: (tmp_path / name).read_bytes() for name in ("live.srt", "live.vtt")}
    n_cues = len(reference_cues())
    for name, data in whole.items():
        (tmp_path / name).write_bytes(data + b"99\n00:01:00,000 --> 00:0")  # torn mid-block
    with pytest.raises(pysrt.Error):
        pysrt.from_string((tmp_path / "live.srt").read_text(),
                          error_handling=pysrt.ERROR_RAISE)
    run_sinks(SRTSink(FileSinkConfig(directory=str(tmp_path))),
              VTTSink(FileSinkConfig(directory=str(tmp_path))), speed=10)
    assert (tmp_path / "live.0001.srt").read_bytes() == whole["live.srt"]
    assert (tmp_path / "live.0001.vtt").read_bytes() == whole["live.vtt"]
    assert len(srt_cues(tmp_path / "live.0001.srt")) == n_cues
    assert len(webvtt.read(str(tmp_path / "live.0001.vtt"))) == n_cues
    assert srt_cues(tmp_path / "live.srt") == expected(reference_cues())


def test_cues_are_appended_and_memory_holds_only_the_unwritten(tmp_path: Path) -> None:
    """Each cue is one append: the bytes of the file before it never change, and once written
    a cue is no longer held in memory."""
    sink = SRTSink(FileSinkConfig(directory=str(tmp_path)))
    sizes: list[bytes] = []
    sink.on_durable = lambda n: sizes.append((tmp_path / "live.srt").read_bytes())
    run_sinks(sink, speed=10)
    assert len(sizes) == len(reference_cues())
    for before, after in zip(sizes, sizes[1:], strict=False):
        assert after.startswith(before) and len(after) > len(before)
    assert len(sink._pending) == 0 and sink.n_lost == 0


def test_cues_beyond_max_pending_while_the_disk_is_full_are_counted_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files, "_write_block", full)
    sink = SRTSink(FileSinkConfig(directory=str(tmp_path), retry_ms=10, max_pending=3))
    run_sinks(sink, speed=10)
    n = len(reference_cues())
    assert sink.n_durable == 0 and sink.n_lost == n - 3 and len(sink._pending) == 3
