"""ONNX export of the Whisper encoder and of one batched decoder step (the TensorRT path's input).

* ``encoder.onnx``: mel [batch, n_mels, frames] -> audio features [batch, frames/2, D], with
  dynamic batch and frame axes (windows trimmed to 1000/2000/3000 frames share one file).
* ``decoder_step.onnx``: one token per row against a static key/value cache, the same step the
  CUDA-graph engine runs: tokens [batch], positions [batch], self_k/self_v
  [layers, batch, heads, ctx, head_dim], cross_k/cross_v [layers, batch, heads, frames/2,
  head_dim] -> logits [batch, vocab] and the updated self_k/self_v. Batch, ctx and audio length
  are dynamic axes, which is what TensorRT optimisation profiles (one per batch/length bucket)
  are built from.

TensorRT itself is not installed here or on the GPU machine, so engines are neither built nor
cached nor timed by this module; the ONNX files are checked against our torch modules with
onnxruntime on the CPU (tests/test_onnx_export.py).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from subd.models.whisper import TextDecoder, Whisper

OPSET = 17


class DecoderStep(nn.Module):
    """One decode step with per-row positions and an explicit cache (pure function of inputs)."""

    def __init__(self, decoder: TextDecoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, tokens, positions, self_k, self_v, cross_k, cross_v):
        d = self.decoder
        x = (d.token_embedding(tokens) + d.positional_embedding[positions])[:, None, :]
        ctx = self_k.shape[3]
        slot = F.one_hot(positions, ctx).to(x.dtype)[:, None, :, None]  # [B, 1, ctx, 1]
        visible = torch.arange(ctx)[None, :] <= positions[:, None]
        bias = torch.zeros(visible.shape, dtype=x.dtype).masked_fill(~visible, float("-inf"))
        bias = bias[:, None, None, :]  # [B, 1, 1, ctx]
        new_k, new_v = [], []
        for i, block in enumerate(d.blocks):
            sa = block.attn
            h = block.attn_ln(x)
            k = self_k[i] * (1 - slot) + sa.split(sa.key(h)) * slot  # write at each row's pos
            v = self_v[i] * (1 - slot) + sa.split(sa.value(h)) * slot
            new_k.append(k)
            new_v.append(v)
            q = sa.split(sa.query(h))
            x = x + sa.out(sa.merge(_attend(q, k, v, bias)))
            ca = block.cross_attn
            q = ca.split(ca.query(block.cross_attn_ln(x)))
            x = x + ca.out(ca.merge(_attend(q, cross_k[i], cross_v[i], None)))
            x = x + block.mlp(block.mlp_ln(x))
        logits = d.output(d.ln(x[:, 0])).float()
        return logits, torch.stack(new_k), torch.stack(new_v)


def _attend(q, k, v, bias):
    # explicit softmax attention: exports on every opset and maps cleanly to TensorRT
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if bias is not None:
        scores = scores + bias
    return scores.softmax(dim=-1) @ v


def example_inputs(model: Whisper, batch: int = 2, ctx: int = 64, n_audio: int = 500):
    d = model.dims
    h, dh = d.n_text_head, d.n_text_state // d.n_text_head
    kv = (d.n_text_layer, batch, h)
    return (
        torch.randint(0, d.n_vocab - 1, (batch,)),
        torch.tensor([min(3 + 5 * b, ctx - 1) for b in range(batch)]),
        torch.randn(*kv, ctx, dh) * 0.5,
        torch.randn(*kv, ctx, dh) * 0.5,
        torch.randn(*kv, n_audio, dh) * 0.5,
        torch.randn(*kv, n_audio, dh) * 0.5,
    )


def export(model: Whisper, out_dir: Path) -> tuple[Path, Path]:
    """Write encoder.onnx and decoder_step.onnx (float32) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model = model.float().eval()
    enc_path, dec_path = out_dir / "encoder.onnx", out_dir / "decoder_step.onnx"
    mel = torch.randn(2, model.dims.n_mels, 1000)
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        # the TorchScript exporter warns about its own deprecation and about tracing
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model.encoder, (mel,), str(enc_path), opset_version=OPSET, dynamo=False,
            input_names=["mel"], output_names=["audio"],
            dynamic_axes={"mel": {0: "batch", 2: "frames"}, "audio": {0: "batch", 1: "n_audio"}},
        )
        names = ["tokens", "positions", "self_k", "self_v", "cross_k", "cross_v"]
        cache_axes = {1: "batch", 3: "ctx"}
        audio_axes = {1: "batch", 3: "n_audio"}
        torch.onnx.export(
            DecoderStep(model.decoder), example_inputs(model), str(dec_path),
            opset_version=OPSET, dynamo=False, input_names=names,
            output_names=["logits", "new_self_k", "new_self_v"],
            dynamic_axes={"tokens": {0: "batch"}, "positions": {0: "batch"},
                          "self_k": cache_axes, "self_v": cache_axes,
                          "cross_k": audio_axes, "cross_v": audio_axes,
                          "logits": {0: "batch"}, "new_self_k": cache_axes,
                          "new_self_v": cache_axes},
        )
    return enc_path, dec_path
