"""Batched log-mel front end on the GPU (torch: cuFFT + one matmul), for many streams at once.

Computes exactly what ``kernels.mel.log_mel`` computes for each row of a batch of windows of
different lengths: one hop of zeros appended, reflect padding at both ends of *each row's own*
audio (not of the batch's padded buffer), 25 ms Hann STFT, power, Slaney mel filters, log10,
an 8-decade floor below the row's own maximum, scaled to about [-1, 1], and zeros after the
row's last frame (as ``pad_or_trim_frames`` pads). Tolerance against the CPU reference: max
|Δ| ≤ 2e-3 on speech (float32 cuFFT vs pocketfft; measured figure in ``subd bench gpu``),
asserted in tests/test_gpu.py. Runs on the CPU too (used by the batched engine's CPU tests).
"""

from __future__ import annotations

import functools

import torch

from subd.kernels.mel import HOP_SAMPLES, N_FFT, _hann, mel_filters

PAD_SAMPLES = HOP_SAMPLES  # the zeros the reference runtime appends
REFLECT = N_FFT // 2  # center=True pads n_fft/2 samples on each side
MEL_TOLERANCE = 2e-3  # max |GPU - CPU| in log-mel units the tests accept


@functools.lru_cache(maxsize=8)
def _constants(n_mels: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    dev = torch.device(device)
    return _hann(N_FFT).to(dev), mel_filters(n_mels).to(dev)


def n_frames_for(n_samples: int) -> int:
    """Frames ``log_mel`` gives for ``n_samples`` of audio (it drops the STFT's last frame)."""
    return (n_samples + PAD_SAMPLES) // HOP_SAMPLES


def reflect_pad_rows(audio: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """audio [B, S] (row b valid up to lengths[b]) -> [B, S + PAD + 2·REFLECT] per-row padded.

    Row b becomes reflect(REFLECT) + audio[:n_b] + zeros(PAD) + reflect(REFLECT), followed by
    zeros: the same samples torch.stft(center=True) sees for that row alone.
    """
    b, s = audio.shape
    n = (lengths + PAD_SAMPLES).to(torch.long)[:, None]  # [B, 1] length after the zero pad
    width = s + PAD_SAMPLES + 2 * REFLECT
    idx = torch.arange(width, device=audio.device)[None, :] - REFLECT  # [1, W]
    idx = idx.abs()  # left reflection
    idx = torch.where(idx >= n, 2 * (n - 1) - idx, idx)  # right reflection
    valid = (idx >= 0) & (torch.arange(width, device=audio.device)[None, :] < n + 2 * REFLECT)
    idx = idx.clamp(0, s + PAD_SAMPLES - 1)
    padded = torch.nn.functional.pad(audio, (0, PAD_SAMPLES))
    # samples between n_b - PAD and n_b are the appended zeros: mask them (they may hold audio
    # of a longer buffer when the caller reuses one)
    src_valid = idx < lengths.to(torch.long)[:, None]
    out = torch.gather(padded, 1, idx.expand(b, width))
    return torch.where(valid & src_valid, out, torch.zeros((), dtype=out.dtype, device=out.device))


def log_mel_batch(
    audio: torch.Tensor, lengths: torch.Tensor, n_frames: int, n_mels: int = 80
) -> torch.Tensor:
    """audio float32 [B, S] on any device, lengths [B] -> log-mel [B, n_mels, n_frames].

    Each row equals ``pad_or_trim_frames(log_mel(audio[b, :lengths[b]]), n_frames)``.
    """
    window, filters = _constants(n_mels, str(audio.device))
    x = reflect_pad_rows(audio.float(), lengths)
    # frames [B, F, N_FFT] as a strided view: no copy before the FFT
    # all of each row's frames: the floor is 8 decades below the maximum over the whole row
    frames = x.unfold(1, N_FFT, HOP_SAMPLES)[:, :-1]
    spec = torch.fft.rfft(frames * window, dim=-1)  # [B, F, N_FFT/2+1]
    power = spec.real.square() + spec.imag.square()
    mel = torch.matmul(power, filters.T).transpose(1, 2)  # [B, n_mels, F]
    log_spec = mel.clamp_min(1e-10).log10()
    f = log_spec.shape[-1]
    have = (lengths.to(torch.long) + PAD_SAMPLES) // HOP_SAMPLES
    frame_ok = torch.arange(f, device=audio.device)[None, :] < have[:, None]  # [B, F]
    masked = log_spec.masked_fill(~frame_ok[:, None, :], float("-inf"))
    top = masked.amax(dim=(1, 2), keepdim=True)
    out = (torch.maximum(log_spec, top - 8.0) + 4.0) / 4.0
    out = out.masked_fill(~frame_ok[:, None, :], 0.0)
    if f >= n_frames:
        return out[..., :n_frames].contiguous()
    return torch.nn.functional.pad(out, (0, n_frames - f))
