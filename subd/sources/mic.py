"""A microphone through PyAudio (extra ``mic``), feeding a :class:`QueueSource`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from subd.errors import AudioInputError
from subd.sources.live import QueueSource, pcm_to_float
from subd.sources.pcm import ToMono16k
from subd.types import SAMPLE_RATE_HZ

log = logging.getLogger("subd.sources")


class MicSource(QueueSource):
    """A microphone through PyAudio (extra ``mic``). Opened by ``open()``; errors are one line.

    Opened at 16 kHz mono where the device takes it; a device that does not (an ALSA hardware
    device of a USB or studio interface: 44.1 or 48 kHz, often stereo only) is opened at its
    own default rate and up to 2 channels, mixed to mono and resampled here."""

    def __init__(self, device: str = "", chunk_ms: int = 20) -> None:
        super().__init__("microphone")
        self.device = device
        self.chunk_ms = chunk_ms
        self.rate_hz, self.channels = SAMPLE_RATE_HZ, 1  # as opened
        self._pa: Any = None
        self._stream: Any = None

    @staticmethod
    def _pyaudio() -> Any:
        try:
            import pyaudio
        except ImportError:
            raise AudioInputError(
                "microphone input needs PyAudio: pip install 'subd[mic]' "
                "(and apt-get install portaudio19-dev)"
            ) from None
        return pyaudio

    def _find_device(self, pa: Any) -> int:
        inputs = []
        for i in range(pa.get_device_count()):
            info = pa.get_device_info_by_index(i)
            if int(info.get("maxInputChannels", 0)) > 0:
                inputs.append((i, str(info.get("name", ""))))
        if not inputs:
            raise AudioInputError("no microphone found (PyAudio lists no input device)")
        want = self.device.strip()
        if not want:
            return inputs[0][0]
        if want.isdigit():
            if int(want) in {i for i, _ in inputs}:
                return int(want)
        else:
            for i, name in inputs:
                if want.lower() in name.lower():
                    return i
        names = "; ".join(f"{i}: {n}" for i, n in inputs)
        raise AudioInputError(f"no input device matches {want!r} (inputs: {names})")

    @staticmethod
    def _format(pa: Any, pyaudio: Any, index: int) -> tuple[int, int]:
        """(rate, channels) to open device ``index`` at: 16 kHz mono if it takes that, else its
        default rate (or 48 / 44.1 kHz) with 1 or up to 2 channels."""
        supported = getattr(pa, "is_format_supported", None)
        if supported is None:  # nothing to ask: PortAudio says at open
            return SAMPLE_RATE_HZ, 1
        info = pa.get_device_info_by_index(index)
        channels = max(1, min(2, int(info.get("maxInputChannels", 1))))
        rates = [SAMPLE_RATE_HZ, int(float(info.get("defaultSampleRate") or 0)), 48_000, 44_100]
        for rate in dict.fromkeys(r for r in rates if r > 0):
            for ch in dict.fromkeys((1, channels)):
                try:
                    if supported(rate, input_device=index, input_channels=ch,
                                 input_format=pyaudio.paInt16):
                        return rate, ch
                except ValueError:  # PyAudio's "not supported"
                    continue
        return SAMPLE_RATE_HZ, 1  # PortAudio's error at open says why

    def open(self) -> None:
        pyaudio = self._pyaudio()
        loop = asyncio.get_running_loop()
        self._pa = pa = pyaudio.PyAudio()
        try:
            index = self._find_device(pa)
            rate, channels = self.rate_hz, self.channels = self._format(pa, pyaudio, index)
            to_mono = ToMono16k(rate, channels)
            if (rate, channels) != (SAMPLE_RATE_HZ, 1):
                log.info("microphone: the device takes no 16 kHz mono; opened at %d Hz, %d "
                         "channel(s), mixed and resampled here", rate, channels)

            def callback(in_data: bytes, frame_count: int, time_info: Any, status: int):
                samples = to_mono(pcm_to_float(in_data, "s16le"))
                if samples.shape[0]:
                    loop.call_soon_threadsafe(self.push, samples)
                return (None, pyaudio.paContinue)

            self._stream = pa.open(format=pyaudio.paInt16, channels=channels, rate=rate,
                                   input=True, input_device_index=index,
                                   frames_per_buffer=max(1, rate * self.chunk_ms // 1000),
                                   stream_callback=callback)
        except AudioInputError:
            self._close_device()  # the stream itself stays open: a reopen may follow
            raise
        except Exception as exc:  # noqa: BLE001 - PortAudio errors come as OSError/IOError
            self._close_device()
            raise AudioInputError(f"cannot open microphone at {self.rate_hz} Hz, "
                                  f"{self.channels} channel(s): {exc}") from None

    def reopen(self) -> None:
        """The device went quiet (unplugged?): drop the stream and PortAudio's device list (a
        new PyAudio instance sees devices plugged in since) and open it again; the audio goes
        on into the same stream. AudioInputError while it is still gone."""
        self._close_device()
        self.open()

    def _close_device(self) -> None:
        if self._stream is not None:
            try:
                self._stream.stop_stream()
                self._stream.close()
            except Exception:  # noqa: BLE001 - a device that vanished fails to close too
                pass
            self._stream = None
        if self._pa is not None:
            try:
                self._pa.terminate()
            except Exception:  # noqa: BLE001
                pass
            self._pa = None

    def close(self) -> None:
        self._close_device()
        self.end()
