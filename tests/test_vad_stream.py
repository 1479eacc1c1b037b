"""A stream's VAD frames are analysed once (VoiceActivityDetector.regions_at): the regions a
live recogniser reads at every update are those of the audio read afresh, and no frame goes
through the detector twice however many updates read it."""

from __future__ import annotations

import numpy as np

from subd.history import AudioHistory
from subd.recognise.vad import FRAME_SAMPLES, VoiceActivityDetector
from subd.sources.decode import load_audio

SR = 16_000
STEP = 3200  # 200 ms: the recogniser's update cadence


class CountingDetector(VoiceActivityDetector):
    """The detector, counting the frames it decides."""

    def __init__(self) -> None:
        super().__init__()
        self.n_frames = 0

    def _frames_mask(self, vad, x, n_frames):
        self.n_frames += n_frames
        return super()._frames_mask(vad, x, n_frames)


def _stream(speech_clips) -> np.ndarray:
    gap = np.zeros(SR, np.float32)
    return np.concatenate([load_audio(speech_clips[0].path), gap,
                           load_audio(speech_clips[1].path), gap])


def test_window_regions_equal_the_window_read_afresh(speech_clips):
    """Updates every 200 ms ask for the window from its start: at every whole frame the
    cached regions are the ones speech_regions finds on the window read again."""
    audio = _stream(speech_clips)
    history = AudioHistory(len(audio) + SR)
    cached, fresh = VoiceActivityDetector(), VoiceActivityDetector()
    n_speech = 0
    for end in range(FRAME_SAMPLES * 10, len(audio), FRAME_SAMPLES * 7):  # 210 ms updates
        history.write(history.end_sample, audio[history.end_sample : end])
        got = cached.regions_at(history, 0, end)
        assert got == fresh.speech_regions(history.read(0, end)), end
        n_speech += bool(got)
    assert n_speech > 0


def test_every_frame_is_analysed_once(speech_clips):
    """Window, tail and settle queries over the same audio at each update: the frames are
    decided once (a fresh analysis per query decided each ~10 times over)."""
    audio = _stream(speech_clips)
    history = AudioHistory(len(audio) + SR)
    det = CountingDetector()
    n_queries = 0
    for end in range(STEP, len(audio), STEP):
        history.write(history.end_sample, audio[history.end_sample : end])
        window_start = max(0, end - 6 * SR)
        det.regions_at(history, 0, end)  # from the stream start
        det.regions_at(history, window_start, end)
        det.regions_at(history, max(window_start, end - SR), end, min_speech_ms=60.0)
        n_queries += 3
    # each complete frame up to the last update's end, once (a fresh analysis per query: ~2.7x
    # that per update, times the number of updates that read the same audio)
    assert n_queries > 100
    assert det.n_frames == end // FRAME_SAMPLES


def test_a_later_query_sees_the_same_speech_relative_to_its_start(speech_clips):
    """Regions of [first, end) are given from ``first``: they lie where the window's regions
    do, cut at ``first`` (on the stream's 30 ms grid)."""
    audio = _stream(speech_clips)
    history = AudioHistory(len(audio) + SR)
    history.write(0, audio)
    det = VoiceActivityDetector()
    whole = det.regions_at(history, 0, len(audio))
    first = whole[0][0] + SR // 2  # inside the first region
    part = det.regions_at(history, first, len(audio))
    assert part[0][0] == 0  # speech goes on at its start
    assert [(lo + first, hi + first) for lo, hi in part[1:]] == whole[1:]


def test_a_query_before_the_grid_starts_a_new_one(speech_clips):
    audio = _stream(speech_clips)
    history = AudioHistory(len(audio) + SR)
    history.write(0, audio)
    det, fresh = VoiceActivityDetector(), VoiceActivityDetector()
    det.regions_at(history, 2 * SR, len(audio))
    end = len(audio) - len(audio) % FRAME_SAMPLES
    assert det.regions_at(history, 0, end) == fresh.speech_regions(history.read(0, end))
