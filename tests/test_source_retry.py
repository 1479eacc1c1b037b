"""Sources retry forever with capped backoff: a microphone unplugged and plugged back is reopened
and its audio goes on in the same stream. (No sound device here: PyAudio is a stand-in that
plays the device, as in test_sources.)"""

from __future__ import annotations

import asyncio
import sys
import types

import numpy as np
import pytest

from subd.clock import FakeClock
from subd.errors import AudioInputError
from subd.sources.mic import MicSource
from subd.sources.retry import RetryBackoff

S = 1_000_000_000


class Room:
    """The machine's sound devices: a USB microphone that can be unplugged."""

    def __init__(self) -> None:
        self.plugged = True
        self.callbacks: list = []

    def pyaudio(self):
        room = self

        class Stream:
            def stop_stream(self):
                pass

            def close(self):
                pass

        class PyAudio:
            def __init__(self):  # a device list as of now, as PortAudio's
                self.devices = [{"name": "USB Mic", "maxInputChannels": 1}] if room.plugged \
                    else []

            def get_device_count(self):
                return len(self.devices)

            def get_device_info_by_index(self, i):
                return self.devices[i]

            def open(self, stream_callback, **kwargs):
                room.callbacks.append(stream_callback)
                return Stream()

            def terminate(self):
                pass

        return types.SimpleNamespace(PyAudio=PyAudio, paInt16=8, paContinue=0)

    def speak(self, n: int) -> None:
        """The current device delivers n samples."""
        self.callbacks[-1](np.full(n, 1000, dtype="<i2").tobytes(), n, None, 0)


def test_an_unplugged_microphone_is_reopened_when_it_comes_back(monkeypatch):
    room = Room()
    monkeypatch.setitem(sys.modules, "pyaudio", room.pyaudio())

    async def main():
        mic = MicSource(device="USB")
        mic.open()
        room.speak(320)
        room.plugged = False  # unplugged: the stream just goes quiet
        with pytest.raises(AudioInputError, match="no microphone found"):
            mic.reopen()
        assert not mic.ended  # the channel's stream is still open for when it is back
        room.plugged = True
        mic.reopen()
        room.speak(480)
        await asyncio.sleep(0)  # the callbacks hand over to the loop
        mic.end()
        await mic.start(FakeClock())
        return [chunk async for chunk in mic.chunks()]

    chunks = asyncio.run(main())
    assert [c.n_samples for c in chunks] == [320, 480]
    assert chunks[1].start_sample == 320  # one stream, on one timeline
    assert len(room.callbacks) == 2


def test_retries_back_off_to_a_cap_and_reset_when_the_source_is_back():
    retry = RetryBackoff(first_s=1, max_s=30)
    now = 0
    delays = []
    for _ in range(8):
        assert retry.due(now)
        delays.append(retry.failed(now) // S)
        assert not retry.due(now + 1)
        now += retry.delay_ns
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    retry.reset()
    assert retry.due(now) and retry.failed(now) == S
