"""Whisper's log-mel front end on the CPU (torch), the reference for the GPU kernel.

80 (or 128) mel bins, 25 ms Hann window (n_fft 400), 10 ms hop (160 samples) at 16 kHz, Slaney
mel scale and area normalisation, log10 with an 8-decade dynamic-range floor, scaled to about
[-1, 1]. Matches faster-whisper's numpy FeatureExtractor (the reference runtime) to float
rounding (see tests/test_mel.py).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

SAMPLE_RATE_HZ = 16_000
N_FFT = 400
HOP_SAMPLES = 160
FRAMES_PER_SECOND = SAMPLE_RATE_HZ // HOP_SAMPLES  # 100
WINDOW_FRAMES = 3000  # 30 s, Whisper's input length


def _hz_to_mel(f_hz: np.ndarray) -> np.ndarray:
    f_sp = 200.0 / 3.0
    mel = f_hz / f_sp
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, np.log(6.4) / 27.0
    return np.where(
        f_hz >= min_log_hz, min_log_mel + np.log(np.maximum(f_hz, 1e-9) / min_log_hz) / logstep, mel
    )


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    f_sp = 200.0 / 3.0
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, np.log(6.4) / 27.0
    return np.where(
        mel >= min_log_mel, min_log_hz * np.exp(logstep * (mel - min_log_mel)), f_sp * mel
    )


@functools.lru_cache(maxsize=4)
def mel_filters(
    n_mels: int = 80, sample_rate_hz: int = SAMPLE_RATE_HZ, n_fft: int = N_FFT
) -> torch.Tensor:
    """Slaney-style triangular filters [n_mels, n_fft//2 + 1], area-normalised."""
    fft_hz = np.fft.rfftfreq(n_fft, d=1.0 / sample_rate_hz)
    mel_points = np.linspace(0.0, _hz_to_mel(np.array(sample_rate_hz / 2.0)), n_mels + 2)
    hz_points = _mel_to_hz(mel_points)
    widths = np.diff(hz_points)
    ramps = hz_points[:, None] - fft_hz[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (hz_points[2 : n_mels + 2] - hz_points[:n_mels]))[:, None]
    return torch.from_numpy(weights.astype(np.float32))


@functools.lru_cache(maxsize=2)
def _hann(n_fft: int) -> torch.Tensor:
    return torch.from_numpy(np.hanning(n_fft + 1)[:-1].astype(np.float32))


def log_mel(
    audio: np.ndarray | torch.Tensor, n_mels: int = 80, pad_samples: int = HOP_SAMPLES
) -> torch.Tensor:
    """audio float32 [n_samples] at 16 kHz -> log-mel [n_mels, n_frames].

    ``pad_samples`` zeros are appended first (the reference runtime appends one hop), giving
    n_frames = 1 + (n_samples + pad_samples) // 160; the last frame is partial.
    """
    x = torch.as_tensor(audio, dtype=torch.float32)
    if pad_samples:
        x = torch.nn.functional.pad(x, (0, pad_samples))
    spec = torch.stft(
        x,
        N_FFT,
        HOP_SAMPLES,
        window=_hann(N_FFT),
        center=True,
        pad_mode="reflect",
        return_complex=True,
    )
    power = spec[..., :-1].abs() ** 2  # [n_fft/2+1, n_frames]
    mel = mel_filters(n_mels) @ power
    log_spec = torch.clamp(mel, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def pad_or_trim_frames(mel: torch.Tensor, n_frames: int = WINDOW_FRAMES) -> torch.Tensor:
    """Pad with zeros (as the reference runtime does) or cut to ``n_frames`` along the last axis."""
    have = mel.shape[-1]
    if have >= n_frames:
        return mel[..., :n_frames]
    return torch.nn.functional.pad(mel, (0, n_frames - have))
