"""Audio sources: paced files with jitter, stdin PCM, microphone errors, HTTP push."""

from __future__ import annotations

import asyncio
import io
import os
import sys
import types
from fractions import Fraction

import numpy as np
import pytest
import soundfile as sf
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from subd.clock import FakeClock
from subd.errors import AudioInputError
from subd.sources.decode import load_audio
from subd.sources.live import FileSource, PcmStreamSource, QueueSource
from subd.sources.mic import MicSource
from subd.sources.push import make_push_handler
from subd.types import SAMPLE_RATE_HZ

MS = 1_000_000


def _collect(source, clock: FakeClock):
    async def main():
        t0 = await source.start(clock)
        got = []

        async def consume():
            async for chunk in source.chunks():
                got.append((clock.now_ns(), chunk))

        task = asyncio.ensure_future(consume())
        await clock.run_until_done(task)
        return t0, got

    return asyncio.run(main())


@pytest.mark.parametrize("speed", [Fraction(1), Fraction(2)])
def test_file_source_paces_chunks_late_by_at_most_the_jitter(speed):
    audio = np.random.default_rng(0).standard_normal(SAMPLE_RATE_HZ).astype(np.float32)
    src = FileSource(audio, speed=speed, jitter_ms=50, chunk_ms=20, seed=3)
    t0, got = _collect(src, FakeClock(start_ns=10**9))
    assert t0 == 10**9
    assert np.array_equal(np.concatenate([c.samples for _, c in got]), audio)
    lateness = []
    prev = 0
    for arrival, chunk in got:
        nominal = t0 + int((chunk.start_sample + chunk.n_samples) * 10**9 / speed / 16000)
        assert arrival >= nominal and arrival >= prev  # never early, order kept
        lateness.append(arrival - nominal)
        prev = arrival
    assert max(lateness) <= 50 * MS + 1
    assert max(lateness) > 10 * MS  # the jitter is really applied


def test_load_audio_mixes_down_and_resamples(tmp_path):
    path = tmp_path / "stereo.wav"
    t = np.arange(44100) / 44100
    stereo = np.stack([np.sin(2 * np.pi * 440 * t)] * 2, axis=1).astype(np.float32) * 0.5
    sf.write(path, stereo, 44100)
    mono = load_audio(path)
    assert mono.dtype == np.float32 and abs(mono.shape[0] - 16000) <= 1
    assert 0.4 < np.abs(mono).max() < 0.6


def test_load_audio_errors_are_one_line(tmp_path):
    with pytest.raises(AudioInputError, match="no such file"):
        load_audio(tmp_path / "missing.wav")
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0, dtype=np.float32), 16000)
    with pytest.raises(AudioInputError, match="no audio samples"):
        load_audio(empty)


def test_stdin_pcm_source_reads_s16le_in_chunks_and_keeps_odd_bytes():
    pcm = (np.arange(-800, 800, dtype=np.int16) * 16).tobytes() + b"\x01"
    src = PcmStreamSource(io.BytesIO(pcm), fmt="s16le", chunk_ms=20)

    async def main():
        t0 = await src.start(FakeClock(start_ns=10**9))
        chunks = [c async for c in src.chunks()]
        return t0, chunks

    t0, chunks = asyncio.run(main())
    assert t0 == 10**9 - 20 * MS  # the first 20 ms chunk ended when it arrived
    samples = np.concatenate([c.samples for c in chunks])
    assert samples.shape[0] == 1600
    assert [c.start_sample for c in chunks] == list(range(0, 1600, 320))
    np.testing.assert_allclose(samples * 32768, np.arange(-800, 800) * 16)


def _read_all(src):
    async def main():
        t0 = await src.start(FakeClock(start_ns=10**9))
        return t0, [c async for c in src.chunks()]

    return asyncio.run(main())


def test_stdin_pcm_source_mixes_and_resamples_any_rate_and_channels():
    t = np.arange(48_000) / 48_000  # 1 s of a 440 Hz tone at 48 kHz, the right channel silent
    left = (np.sin(2 * np.pi * 440 * t) * 0.5 * 32767).astype(np.int16)
    pcm = np.stack([left, np.zeros_like(left)], axis=1).tobytes()
    src = PcmStreamSource(io.BytesIO(pcm), fmt="s16le", rate_hz=48_000, channels=2,
                          chunk_ms=20)
    t0, chunks = _read_all(src)
    assert t0 == 10**9 - 20 * MS  # the first read's 960 frames are 20 ms at 48 kHz
    samples = np.concatenate([c.samples for c in chunks])
    assert abs(samples.shape[0] - 16_000) <= 16  # 1 s at 16 kHz
    starts = [c.start_sample for c in chunks]
    assert starts == sorted(starts) and starts[0] == 0
    assert 0.23 < np.abs(samples[2000:14000]).max() < 0.26  # mixed: half of the left's 0.5
    spectrum = np.abs(np.fft.rfft(samples[:16_000]))
    assert abs(int(spectrum.argmax()) - 440) <= 1  # still 440 Hz on the 16 kHz timeline


def test_stdin_pcm_source_plays_nan_as_silence_and_goes_on(caplog):
    audio = np.full(3200, 0.25, np.float32)
    audio[500:600] = np.nan
    audio[700] = np.inf
    src = PcmStreamSource(io.BytesIO(audio.astype("<f4").tobytes()), fmt="f32le")
    _, chunks = _read_all(src)
    samples = np.concatenate([c.samples for c in chunks])
    assert samples.shape[0] == 3200 and np.all(np.isfinite(samples))
    assert np.all(samples[500:600] == 0) and samples[700] == 0 and samples[800] == 0.25
    assert src.conditioner.stats.n_nonfinite == 101
    assert "NaN or infinite samples, played as silence" in caplog.text


def test_audio_waiting_in_the_pipe_at_the_start_was_captured_before_it(tmp_path):
    """A live producer (ffmpeg, a capture) writes into the pipe while the daemon loads its
    models: that audio is as old as the pipe's backlog, and the timeline says so."""
    r, w = os.pipe()
    os.write(w, np.zeros(16_000, dtype="<i2").tobytes())  # 1 s, written before the start

    async def main(pipe):
        src = PcmStreamSource(pipe, fmt="s16le", chunk_ms=20)
        t0 = await src.start(FakeClock(start_ns=10**10))
        os.close(w)
        return t0, [c async for c in src.chunks()]

    with os.fdopen(r, "rb") as pipe:
        t0, chunks = asyncio.run(main(pipe))
    assert t0 == 10**10 - 1000 * MS  # the first 20 ms read and the 980 ms behind it
    assert sum(c.n_samples for c in chunks) == 16_000
    path = tmp_path / "pcm.raw"  # a file redirected to stdin is not live: nothing "waits"
    path.write_bytes(np.zeros(16_000, dtype="<i2").tobytes())
    with open(path, "rb") as f:
        t0, _ = _read_all(PcmStreamSource(f, fmt="s16le", chunk_ms=20))
    assert t0 == 10**9 - 20 * MS


def test_a_stop_ends_a_stdin_whose_writer_went_quiet_with_the_pipe_open():
    """The drain at SIGINT/SIGTERM waited for a read that no byte would end (the channel's
    last words were cut off at the drain's budget, and the process hung at exit)."""
    r, w = os.pipe()
    os.write(w, np.full(1600, 1000, dtype="<i2").tobytes())  # 0.1 s, then nothing more

    async def main(pipe):
        src = PcmStreamSource(pipe, fmt="s16le", chunk_ms=20)
        await src.start(FakeClock())
        got = 0
        async for chunk in src.chunks():
            got += chunk.n_samples
            if got == 1600:  # all there is: the writer is quiet, its pipe open
                src.end()
        return got

    with os.fdopen(r, "rb") as pipe:
        got = asyncio.run(asyncio.wait_for(main(pipe), timeout=10))
    os.close(w)
    assert got == 1600


def test_empty_stdin_is_a_clear_error():
    src = PcmStreamSource(io.BytesIO(b""))
    with pytest.raises(AudioInputError, match="no PCM data"):
        asyncio.run(src.start(FakeClock()))


def test_microphone_without_pyaudio_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyaudio", None)

    async def main():
        MicSource().open()

    with pytest.raises(AudioInputError, match=r"pip install 'subd\[mic\]'"):
        asyncio.run(main())


def _fake_pyaudio(devices):
    class PyAudio:
        def get_device_count(self):
            return len(devices)

        def get_device_info_by_index(self, i):
            return devices[i]

        def terminate(self):
            pass

    return types.SimpleNamespace(PyAudio=PyAudio, paInt16=8, paContinue=0)


def test_microphone_errors_when_no_input_device_exists(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyaudio",
                        _fake_pyaudio([{"name": "HDMI out", "maxInputChannels": 0}]))

    async def main():
        MicSource().open()

    with pytest.raises(AudioInputError, match="no microphone found"):
        asyncio.run(main())


def test_microphone_names_the_inputs_when_the_device_does_not_match(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyaudio",
                        _fake_pyaudio([{"name": "USB Mic", "maxInputChannels": 1}]))

    async def main():
        MicSource(device="Studio").open()

    with pytest.raises(AudioInputError, match="no input device matches 'Studio'.*USB Mic"):
        asyncio.run(main())


def test_a_microphone_that_takes_no_16_khz_mono_is_opened_at_its_own_rate_and_resampled(
        monkeypatch):
    """An ALSA hardware device of a studio interface: 48 kHz stereo only."""
    opened = {}

    class PyAudio:
        def get_device_count(self):
            return 1

        def get_device_info_by_index(self, i):
            return {"name": "Studio hw:1,0", "maxInputChannels": 2, "defaultSampleRate": 48000.0}

        def is_format_supported(self, rate, input_device, input_channels, input_format):
            if (rate, input_channels) != (48000, 2):
                raise ValueError("Invalid sample rate")  # as PyAudio says it
            return True

        def open(self, stream_callback, **kwargs):
            opened.update(kwargs, callback=stream_callback)
            return types.SimpleNamespace(stop_stream=lambda: None, close=lambda: None)

        def terminate(self):
            pass

    monkeypatch.setitem(sys.modules, "pyaudio",
                        types.SimpleNamespace(PyAudio=PyAudio, paInt16=8, paContinue=0))
    t = np.arange(48_000) / 48_000  # 1 s of 440 Hz on the left channel, the right silent
    left = (np.sin(2 * np.pi * 440 * t) * 0.5 * 32767).astype(np.int16)
    frames = np.stack([left, np.zeros_like(left)], axis=1)

    async def main():
        mic = MicSource(device="Studio")
        mic.open()
        for i in range(0, 48_000, 960):  # PortAudio's 20 ms buffers
            opened["callback"](frames[i:i + 960].tobytes(), 960, None, 0)
        await asyncio.sleep(0)
        mic.end()
        await mic.start(FakeClock())
        return mic, [chunk async for chunk in mic.chunks()]

    mic, chunks = asyncio.run(main())
    assert (opened["rate"], opened["channels"], opened["frames_per_buffer"]) == (48000, 2, 960)
    assert (mic.rate_hz, mic.channels) == (48000, 2)
    samples = np.concatenate([c.samples for c in chunks])
    assert 15_000 < samples.shape[0] <= 16_000  # 16 kHz (the resampler holds its last few)
    assert 0.23 < np.abs(samples[2000:14000]).max() < 0.26  # the two channels mixed
    spectrum = np.abs(np.fft.rfft(samples[:15_000]))
    assert abs(spectrum.argmax() * 16_000 / 15_000 - 440) < 2


def test_http_push_needs_the_token_and_delivers_chunks_in_order(caplog):
    refused = []

    async def main():
        source = QueueSource("push")
        app = web.Application()
        app.router.add_post("/push", make_push_handler(source, token="s3cret", max_bytes=4096,
                                                       on_reject=refused.append))
        async with TestClient(TestServer(app)) as client:
            auth = {"Authorization": "Bearer s3cret"}
            pcm = np.arange(100, dtype=np.int16).tobytes()
            assert (await client.post("/push", data=pcm)).status == 401
            assert (await client.post("/push", data=pcm, headers=auth)).status == 204
            assert (await client.post("/push", data=b"\x00" * 3, headers=auth)).status == 400
            big = b"\x00" * 5000
            assert (await client.post("/push", data=big, headers=auth)).status == 413
            resp = await client.post("/push?end=1", data=pcm, headers=auth)
            assert resp.status == 204
            assert (await client.post("/push", data=pcm, headers=auth)).status == 410
        t0 = await source.start(FakeClock(start_ns=10**9))
        chunks = [c async for c in source.chunks()]
        return t0, chunks

    t0, chunks = asyncio.run(main())
    assert [c.start_sample for c in chunks] == [0, 100]
    np.testing.assert_allclose(chunks[1].samples * 32768, np.arange(100))
    # every refusal counted and logged, by its reason
    assert refused == ["push_token", "push_bad_audio", "push_too_large", "push_ended"]
    assert caplog.text.count("refused audio push to push:") == 4


def test_http_push_says_its_rate_and_channels_and_is_resampled_across_chunks():
    t = np.arange(48_000) / 48_000  # 1 s of 440 Hz at 48 kHz on the left, the right silent
    left = (np.sin(2 * np.pi * 440 * t) * 0.5 * 32767).astype(np.int16)
    frames = np.stack([left, np.zeros_like(left)], axis=1)

    async def main():
        source = QueueSource("push")
        app = web.Application()
        # the configured default is 16 kHz mono: each request says otherwise
        app.router.add_post("/push", make_push_handler(source, max_bytes=1 << 16))
        async with TestClient(TestServer(app)) as client:
            for q, status, said in [("rate=5", 400, "bad ?rate 5"),
                                    ("channels=0", 400, "bad ?channels 0"),
                                    ("format=mp3", 400, "bad ?format 'mp3'")]:
                resp = await client.post(f"/push?{q}", data=b"\x00" * 4)
                assert (resp.status, said in (await resp.json())["error"]) == (status, True)
            resp = await client.post("/push?channels=2", data=b"\x00" * 6)  # 1.5 frames
            assert resp.status == 400 and "whole frames" in (await resp.json())["error"]
            for i in range(0, 48_000, 960):  # 20 ms chunks
                resp = await client.post("/push?rate=48000&channels=2&end="
                                         + ("1" if i + 960 >= 48_000 else "0"),
                                         data=frames[i:i + 960].tobytes())
                assert resp.status == 204
        await source.start(FakeClock())
        return [c async for c in source.chunks()]

    chunks = asyncio.run(main())
    samples = np.concatenate([c.samples for c in chunks])
    assert 15_000 < samples.shape[0] <= 16_000  # 16 kHz, one resampler across the chunks
    assert 0.23 < np.abs(samples[2000:14000]).max() < 0.26  # mixed: half the left's 0.5
    spectrum = np.abs(np.fft.rfft(samples[:15_000]))
    assert abs(spectrum.argmax() * 16_000 / 15_000 - 440) < 2
