"""Reader for CTranslate2 model directories (model.bin + config.json + tokenizer.json).

model.bin layout (binary version ≥ 5, little endian): u32 version, str spec name, u32 revision,
u32 n_variables, then per variable: str name, u8 rank, u32 dims[rank], u8 dtype, u32 n_bytes,
bytes; then u32 n_aliases and (str alias, str target) pairs. A str is u16 length + bytes with a
trailing NUL. CTranslate2 fuses Whisper's q/k/v projections; we split them back here.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import torch

from subd.errors import ModelError

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}


class _Reader:
    def __init__(self, data: memoryview, name: str):
        self.data, self.pos, self.name = data, 0, name

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.data):
            raise ModelError(
                f"{self.name}: truncated at byte {len(self.data)} (needed {self.pos + n}); "
                "the weight file is incomplete"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        return struct.unpack("<" + fmt, self.take(size))

    def string(self) -> str:
        (n,) = self.unpack("H")
        return bytes(self.take(n))[:-1].decode("utf-8")


def read_variables(data: bytes | memoryview, name: str = "model.bin") -> dict[str, torch.Tensor]:
    """Parse a CTranslate2 model.bin into name -> tensor (aliases resolved)."""
    r = _Reader(memoryview(data), name)
    (version,) = r.unpack("I")
    if version < 5 or version > 6:
        raise ModelError(
            f"{name}: not a CTranslate2 model.bin (binary version {version}, expected 5 or 6)"
        )
    spec = r.string()
    if spec != "WhisperSpec":
        raise ModelError(f"{name}: holds a {spec}, expected a WhisperSpec")
    r.unpack("I")  # spec revision
    (n_vars,) = r.unpack("I")
    out: dict[str, torch.Tensor] = {}
    for _ in range(n_vars):
        var = r.string()
        (rank,) = r.unpack("B")
        dims = r.unpack("I" * rank) if rank else ()
        (dtype_id,) = r.unpack("B")
        (n_bytes,) = r.unpack("I")
        raw = r.take(n_bytes)
        dtype = _DTYPES.get(dtype_id)
        if dtype is None:
            raise ModelError(f"{name}: variable {var} has unknown dtype id {dtype_id}")
        if dtype == "bfloat16":
            arr = torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).float()
        else:
            arr = torch.from_numpy(np.frombuffer(raw, dtype=dtype).copy())
        out[var] = arr.reshape(dims) if rank else arr.reshape(())
    (n_alias,) = r.unpack("I")
    for _ in range(n_alias):
        alias, target = r.string(), r.string()
        out[alias] = out[target]
    return out


def _dequantize(variables: dict[str, torch.Tensor], key: str) -> torch.Tensor:
    w = variables[key]
    scale = variables.get(key + "_scale")
    if w.dtype == torch.int8 and scale is not None:  # CT2 int8: q = round(w * scale) per row
        return w.float() / scale.float().reshape(-1, *([1] * (w.dim() - 1)))
    return w.float()


def _count_layers(variables: dict[str, torch.Tensor], side: str) -> int:
    indices = {
        int(k.split("/")[1][len("layer_") :])
        for k in variables
        if k.startswith(f"{side}/layer_") and k.split("/")[1][len("layer_") :].isdigit()
    }
    return max(indices) + 1


def to_state_dict(variables: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
    """Map CTranslate2 Whisper variables to our module's state dict and dims."""
    sd: dict[str, torch.Tensor] = {}

    def lin(dst: str, src: str) -> None:
        sd[dst + ".weight"] = _dequantize(variables, src + "/weight")
        if src + "/bias" in variables:
            sd[dst + ".bias"] = variables[src + "/bias"].float()

    def ln(dst: str, src: str) -> None:
        sd[dst + ".weight"] = variables[src + "/gamma"].float()
        sd[dst + ".bias"] = variables[src + "/beta"].float()

    def fused(dst_prefix: str, names: tuple[str, ...], src: str) -> None:
        w = _dequantize(variables, src + "/weight").chunk(len(names), dim=0)
        b = variables[src + "/bias"].float().chunk(len(names), dim=0)
        for part, wi, bi in zip(names, w, b, strict=True):
            sd[f"{dst_prefix}.{part}.weight"] = wi
            if part != "key":  # Whisper's key projection has no bias (CT2 stores zeros)
                sd[f"{dst_prefix}.{part}.bias"] = bi

    for conv in ("conv1", "conv2"):
        sd[f"encoder.{conv}.weight"] = _dequantize(variables, f"encoder/{conv}/weight")
        sd[f"encoder.{conv}.bias"] = variables[f"encoder/{conv}/bias"].float()
    sd["encoder.positional_embedding"] = variables["encoder/position_encodings/encodings"].float()
    n_enc = _count_layers(variables, "encoder")
    n_dec = _count_layers(variables, "decoder")
    for i in range(n_enc):
        src, dst = f"encoder/layer_{i}", f"encoder.blocks.{i}"
        ln(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm")
        fused(f"{dst}.attn", ("query", "key", "value"), f"{src}/self_attention/linear_0")
        lin(f"{dst}.attn.out", f"{src}/self_attention/linear_1")
        ln(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm")
        lin(f"{dst}.mlp.0", f"{src}/ffn/linear_0")
        lin(f"{dst}.mlp.2", f"{src}/ffn/linear_1")
    ln("encoder.ln_post", "encoder/layer_norm")
    sd["decoder.token_embedding.weight"] = _dequantize(variables, "decoder/embeddings/weight")
    sd["decoder.positional_embedding"] = variables["decoder/position_encodings/encodings"].float()
    for i in range(n_dec):
        src, dst = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        ln(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm")
        fused(f"{dst}.attn", ("query", "key", "value"), f"{src}/self_attention/linear_0")
        lin(f"{dst}.attn.out", f"{src}/self_attention/linear_1")
        ln(f"{dst}.cross_attn_ln", f"{src}/attention/layer_norm")
        lin(f"{dst}.cross_attn.query", f"{src}/attention/linear_0")
        fused(f"{dst}.cross_attn", ("key", "value"), f"{src}/attention/linear_1")
        lin(f"{dst}.cross_attn.out", f"{src}/attention/linear_2")
        ln(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm")
        lin(f"{dst}.mlp.0", f"{src}/ffn/linear_0")
        lin(f"{dst}.mlp.2", f"{src}/ffn/linear_1")
    ln("decoder.ln", "decoder/layer_norm")
    conv1 = sd["encoder.conv1.weight"]
    dims = dict(
        n_mels=conv1.shape[1],
        n_audio_ctx=sd["encoder.positional_embedding"].shape[0],
        n_audio_state=conv1.shape[0],
        n_audio_head=int(variables["encoder/num_heads"]),
        n_audio_layer=n_enc,
        n_vocab=sd["decoder.token_embedding.weight"].shape[0],
        n_text_ctx=sd["decoder.positional_embedding"].shape[0],
        n_text_state=sd["decoder.token_embedding.weight"].shape[1],
        n_text_head=int(variables["decoder/num_heads"]),
        n_text_layer=n_dec,
    )
    return sd, dims


def read_model_dir_bytes(parts: list[Path]) -> bytes:
    """Join model.bin (or its halves, in order) into one buffer."""
    if len(parts) == 1:
        return Path(parts[0]).read_bytes()
    return b"".join(Path(p).read_bytes() for p in parts)
