"""Whisper encoder/decoder in plain torch (our own code, shaped for batching and CUDA graphs).

Shapes use B = batch, T = audio frames after the conv stem (≤ 1500), L = tokens, D = d_model,
H = heads. The decoder keeps a key/value cache in preallocated tensors of static shape
[B, H, max_tokens, D/H] (self-attention) and [B, H, T, D/H] (cross-attention) so that one decode
step has fixed shapes and can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, slots=True)
class WhisperDims:
    n_mels: int
    n_audio_ctx: int  # 1500 frames after the stride-2 conv (30 s)
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int  # 448 tokens
    n_text_state: int
    n_text_head: int
    n_text_layer: int


class LayerNorm(nn.LayerNorm):
    """Normalises in float32: directly where its parameters share the input's dtype (the CUDA
    kernel accumulates in float32 for float16 input), else on an upcast copy of the input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype:
            return super().forward(x)
        return super().forward(x.float()).type(x.dtype)


def layer_norms_to(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A half-precision model's LayerNorms: in ``dtype`` where their parameters are exactly
    representable in it (float16 checkpoints: the packaged models and OpenAI's), which spares
    two casts of the residual stream per norm and gives the same output (measured on the H200:
    a large model's encoder 10 % faster); float32 otherwise."""
    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            exact = all(torch.equal(p.detach().to(dtype).to(p.dtype), p.detach())
                        for p in m.parameters())
            m.to(dtype if exact else torch.float32)
    return model


def sinusoids(length: int, channels: int, max_timescale: float = 10_000.0) -> torch.Tensor:
    """Whisper's fixed encoder position table [length, channels]."""
    log_step = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-log_step * torch.arange(channels // 2, dtype=torch.float64))
    t = torch.arange(length, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1).float()


class MultiHeadAttention(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape  # [B, N, D] -> [B, H, N, D/H]
        return x.view(b, n, self.n_head, d // self.n_head).transpose(1, 2)

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        b, h, n, dh = x.shape
        return x.transpose(1, 2).reshape(b, n, h * dh)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        # q [B,H,Lq,Dh], k/v [B,H,Lk,Dh], mask additive [Lq,Lk] or None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def qk_logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Scaled attention logits [B,H,Lq,Lk] (for word alignment only)."""
        scale = q.shape[-1] ** -0.5
        return (q.float() @ k.float().transpose(-1, -2)) * scale


class ResidualBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int, cross_attention: bool):
        super().__init__()
        self.attn = MultiHeadAttention(n_state, n_head)
        self.attn_ln = LayerNorm(n_state)
        self.cross_attn = MultiHeadAttention(n_state, n_head) if cross_attention else None
        self.cross_attn_ln = LayerNorm(n_state) if cross_attention else None
        self.mlp = nn.Sequential(
            nn.Linear(n_state, 4 * n_state), nn.GELU(), nn.Linear(4 * n_state, n_state)
        )
        self.mlp_ln = LayerNorm(n_state)


class AudioEncoder(nn.Module):
    def __init__(self, dims: WhisperDims):
        super().__init__()
        self.conv1 = nn.Conv1d(dims.n_mels, dims.n_audio_state, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(
            dims.n_audio_state, dims.n_audio_state, kernel_size=3, stride=2, padding=1
        )
        self.register_buffer(
            "positional_embedding", sinusoids(dims.n_audio_ctx, dims.n_audio_state)
        )
        self.blocks = nn.ModuleList(
            ResidualBlock(dims.n_audio_state, dims.n_audio_head, cross_attention=False)
            for _ in range(dims.n_audio_layer)
        )
        self.ln_post = LayerNorm(dims.n_audio_state)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [B, n_mels, 2T] -> audio features [B, T, D]. T may be < 1500 (trimmed window)."""
        x = F.gelu(self.conv1(mel.to(self.conv1.weight.dtype)))
        # [B, T, D], made contiguous once: the residual stream keeps its first operand's layout,
        # and a transposed one made every add and LayerNorm of every block copy it (on the
        # H200 a quarter of a large model's encoder time, measured)
        x = F.gelu(self.conv2(x)).transpose(1, 2).contiguous()
        x = x + self.positional_embedding[: x.shape[1]].to(x.dtype)
        for block in self.blocks:
            attn = block.attn
            h = block.attn_ln(x)
            q, k, v = attn.split(attn.query(h)), attn.split(attn.key(h)), attn.split(attn.value(h))
            x = x + attn.out(attn.merge(attn.attend(q, k, v, None)))
            x = x + block.mlp(block.mlp_ln(x))
        return self.ln_post(x)


class KVCache:
    """Preallocated decoder caches for one batch: static shapes, filled in place."""

    def __init__(self, dims: WhisperDims, batch: int, n_audio_frames: int, dtype, device):
        h, dh = dims.n_text_head, dims.n_text_state // dims.n_text_head
        n_layer = dims.n_text_layer
        self.self_k = torch.zeros(
            n_layer, batch, h, dims.n_text_ctx, dh, dtype=dtype, device=device
        )
        self.self_v = torch.zeros_like(self.self_k)
        self.cross_k = torch.zeros(
            n_layer, batch, h, n_audio_frames, dh, dtype=dtype, device=device
        )
        self.cross_v = torch.zeros_like(self.cross_k)
        self.length = 0  # tokens already in the self-attention cache


class TextDecoder(nn.Module):
    def __init__(self, dims: WhisperDims):
        super().__init__()
        self.dims = dims
        self.token_embedding = nn.Embedding(dims.n_vocab, dims.n_text_state)
        self.positional_embedding = nn.Parameter(torch.empty(dims.n_text_ctx, dims.n_text_state))
        self.blocks = nn.ModuleList(
            ResidualBlock(dims.n_text_state, dims.n_text_head, cross_attention=True)
            for _ in range(dims.n_text_layer)
        )
        self.ln = LayerNorm(dims.n_text_state)
        # logits = x @ embedding.T, as a Linear sharing the embedding's weight, so that it can be
        # quantised like the others (it reads 51864×384 weights per token: the step's biggest cost)
        self.output = nn.Linear(dims.n_text_state, dims.n_vocab, bias=False)
        self.output.weight = self.token_embedding.weight
        causal = torch.full((dims.n_text_ctx, dims.n_text_ctx), float("-inf")).triu_(1)
        self.register_buffer("causal_mask", causal, persistent=False)

    def new_cache(self, audio: torch.Tensor, *, cross_from: KVCache | None = None) -> KVCache:
        """Allocate a cache for ``audio`` [B, T, D] and fill its cross-attention keys/values.

        ``cross_from``: a cache made for the same ``audio``; its cross-attention keys/values
        (read only after they are filled) are shared instead of computed again, which costs as
        much as a 60-token prompt pass on a 30 s window."""
        b, t, _ = audio.shape
        if cross_from is not None:
            if cross_from.cross_k.shape[1:4:2] != (b, t):
                raise ValueError("cross_from was made for other audio")
            cache = KVCache(self.dims, b, 0, audio.dtype, audio.device)
            cache.cross_k, cache.cross_v = cross_from.cross_k, cross_from.cross_v
            return cache
        cache = KVCache(self.dims, b, t, audio.dtype, audio.device)
        for i, block in enumerate(self.blocks):
            ca = block.cross_attn
            cache.cross_k[i] = ca.split(ca.key(audio))
            cache.cross_v[i] = ca.split(ca.value(audio))
        return cache

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        *,
        return_cross_qk: tuple[tuple[int, int], ...] = (),
        logit_rows: tuple[int, ...] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run ``tokens`` [B, L] after the ``cache.length`` tokens already cached.

        Returns logits [B, L, V] (float32) and, for each (layer, head) in ``return_cross_qk``,
        scaled cross-attention logits [B, L, T] used for word alignment. ``logit_rows`` (indices
        into L, negative from the end) limits the logits to those rows, [B, len(rows), V]: the
        vocabulary projection is the costliest part of a prompt pass, and a decode reads only
        the start-of-transcript row (no-speech probability) and the last one.
        """
        offset = cache.length
        n = tokens.shape[1]
        x = self.token_embedding(tokens) + self.positional_embedding[offset : offset + n]
        x = x.to(cache.self_k.dtype)
        mask = self.causal_mask[offset : offset + n, : offset + n] if n > 1 else None
        wanted_layers = {layer for layer, _ in return_cross_qk}
        qk_by_layer: dict[int, torch.Tensor] = {}
        for i, block in enumerate(self.blocks):
            sa = block.attn
            h = block.attn_ln(x)
            cache.self_k[i, :, :, offset : offset + n] = sa.split(sa.key(h))
            cache.self_v[i, :, :, offset : offset + n] = sa.split(sa.value(h))
            k = cache.self_k[i, :, :, : offset + n]
            v = cache.self_v[i, :, :, : offset + n]
            x = x + sa.out(sa.merge(sa.attend(sa.split(sa.query(h)), k, v, mask)))
            ca = block.cross_attn
            h = block.cross_attn_ln(x)
            q = ca.split(ca.query(h))
            x = x + ca.out(ca.merge(ca.attend(q, cache.cross_k[i], cache.cross_v[i], None)))
            if i in wanted_layers:
                qk_by_layer[i] = ca.qk_logits(q, cache.cross_k[i])  # [B,H,L,T]
            x = x + block.mlp(block.mlp_ln(x))
        cache.length = offset + n
        if logit_rows is not None:
            x = x[:, list(logit_rows)]
        x = self.ln(x)
        logits = self.output(x).float()
        cross = [qk_by_layer[layer][:, head] for layer, head in return_cross_qk]
        return logits, cross


class Whisper(nn.Module):
    def __init__(self, dims: WhisperDims):
        super().__init__()
        self.dims = dims
        self.encoder = AudioEncoder(dims)
        self.decoder = TextDecoder(dims)
