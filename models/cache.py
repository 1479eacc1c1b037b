"""A cache of Whisper weights as they run: converted, and quantised when asked.

Turning a packaged CTranslate2 model into our torch modules costs, per load, a SHA-256 of the
weight files, the CT2 parse and dequantisation, a randomly initialised ``Whisper`` that is then
overwritten, and (int8) a copy of the model for ``quantize_dynamic``: 4-7 s on the loaded 2-core
machine, paid again by every respawned stage process. The first load saves the result here; a
later load reads the file into a model skeleton built without initialising it (0.35-0.5 s for
int8 tiny.en, most of it packing the int8 weights for the GEMM). Read, not mapped: a mapped
file's pages join the process's RSS only as they are first touched (the embedding's rows, as
tokens come up), which reads as slow growth, and a file truncated under a mapping is a SIGBUS.

The pinned SHA-256 of a packaged model is checked when its cache file is written; after that
the files' sizes and mtimes stand for them.

The file's name carries a key of everything the weights depend on: the model, the variant
(``fp32``, ``int8``), the source files' sizes and mtimes, subd's and torch's versions and the
code that converts them (this file, loading, ct2, whisper, engine). A changed source or a new
version is a new key, and older files of that model are removed. A file that cannot be read
(truncated, corrupt, another layout) is logged, removed and rebuilt. It is read with
``weights_only=True``: a cache file never runs code.

Where: ``$SUBD_MODEL_CACHE`` (a directory; ``off`` disables the cache), else systemd's
``$CACHE_DIRECTORY`` (the units' ``CacheDirectory=subd``), else ``$XDG_CACHE_HOME/subd``, else
``~/.cache/subd``, each with ``models/`` below it. A cache that cannot be written (read-only
home, full disk) only costs the next load its time.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path

import torch
from torch import nn

from subd import __version__
from subd.errors import ModelError
from subd.models.loading import PACKAGED, LoadedModel, source_files
from subd.models.tokenizer import WhisperTokenizer
from subd.models.whisper import Whisper, WhisperDims

log = logging.getLogger("subd.models.cache")

CACHE_ENV = "SUBD_MODEL_CACHE"
FORMAT = 1  # of the file's contents; part of the key
_CODE = ("cache.py", "loading.py", "ct2.py", "whisper.py", "engine.py")
_PACKED = "._packed_params._packed_params"  # a dynamically quantised Linear's weights


def cache_dir() -> Path | None:
    """The directory of cached models (None: caching is off)."""
    value = os.environ.get(CACHE_ENV, "").strip()
    if value.lower() in ("off", "none", "0", "false"):
        return None
    if value:
        return Path(value).expanduser()
    systemd = os.environ.get("CACHE_DIRECTORY", "").split(":")[0]
    if systemd:
        return Path(systemd) / "models"
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or "~/.cache"
    return Path(base).expanduser() / "subd" / "models"


def _code_digest() -> str:
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for name in _CODE:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()


def cache_path(name_or_path: str, variant: str, directory: Path) -> Path:
    """Where ``name_or_path`` in ``variant`` is cached, its key in the name."""
    parts = [f"format {FORMAT}", f"model {name_or_path}", f"variant {variant}",
             f"subd {__version__}", f"torch {torch.__version__}", f"code {_code_digest()}"]
    for path in source_files(name_or_path):
        st = path.stat()
        parts.append(f"{path.resolve()} {st.st_size} {st.st_mtime_ns}")
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]
    return directory / f"{_stem(name_or_path, variant)}-{key}.pt"


def _stem(name_or_path: str, variant: str) -> str:
    """The file name's start, the same for every key of this model and variant."""
    where = name_or_path if name_or_path in PACKAGED else str(Path(name_or_path).resolve())
    base = re.sub(r"[^A-Za-z0-9._]+", "_", Path(name_or_path).name or "model")
    return f"{base}-{hashlib.sha256(where.encode()).hexdigest()[:8]}-{variant}"


def load_cached(name_or_path: str, variant: str, build: Callable[[], LoadedModel],
                directory: Path | None = None) -> LoadedModel:
    """``build()``'s model, from the cache when it holds this key, else built and saved.

    ``variant`` names what ``build`` makes of the source ("fp32", "int8")."""
    directory = directory if directory is not None else cache_dir()
    if directory is None:
        return build()
    try:
        path = cache_path(name_or_path, variant, directory)
    except (OSError, ValueError, ModelError) as exc:  # a missing source: build() says so
        log.debug("model cache: no key for %s (%s)", name_or_path, exc)
        return build()
    if path.is_file():
        try:
            return _read(path)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is rebuilt
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            log.warning("model cache %s is unreadable (%s: %s); rebuilding it", path,
                        type(exc).__name__, first)
            with contextlib.suppress(OSError):
                path.unlink()
    loaded = build()
    _write(path, loaded)
    return loaded


def _write(path: Path, loaded: LoadedModel) -> None:
    payload = {
        "format": FORMAT,
        "key": path.name,
        "name": loaded.name,
        "source": loaded.source,
        "dims": {f.name: int(getattr(loaded.model.dims, f.name)) for f in fields(WhisperDims)},
        "alignment_heads": [list(h) for h in loaded.alignment_heads],
        "suppress_tokens": list(loaded.suppress_tokens),
        "multilingual": loaded.tokenizer.multilingual,
        "tokenizer_json": loaded.tokenizer._tok.to_str(),  # the exact vocabulary it was built with
        "state": loaded.model.state_dict(),
    }
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # readers see the old file or the whole new one
        tmp = None
    except OSError as exc:
        log.warning("model cache: cannot write %s (%s); the next load converts again", path, exc)
        return
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    for old in path.parent.glob(f"{path.name.rsplit('-', 1)[0]}-*.pt"):
        if old != path:  # another key of the same model: stale
            with contextlib.suppress(OSError):
                old.unlink()
    log.info("model cache: saved %s", path)


def _read(path: Path) -> LoadedModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's own TypedStorage notice
        data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != path.name:
        raise ValueError("not a model cache file of this version")
    dims = WhisperDims(**{k: int(v) for k, v in data["dims"].items()})
    state: dict = data["state"]
    model = _skeleton(dims, [k[: -len(_PACKED)] for k in state if k.endswith(_PACKED)])
    # parameters shared by two modules (the fp32 output layer is the token embedding) are
    # assigned one tensor each below: tie them again, as the model was built
    params = list(model.named_parameters(remove_duplicate=False))
    first = {id(p): name for name, p in reversed(params)}
    tied = [(name, first[id(p)]) for name, p in params if first[id(p)] != name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model.load_state_dict(state, strict=True, assign=True)
    for name, same in tied:
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, model.get_parameter(same))
    tokenizer = WhisperTokenizer(None, bool(data["multilingual"]),
                                 json_text=data["tokenizer_json"])
    return LoadedModel(
        name=data["name"],
        model=model.eval(),
        tokenizer=tokenizer,
        alignment_heads=tuple(tuple(int(x) for x in h) for h in data["alignment_heads"]),
        suppress_tokens=tuple(int(t) for t in data["suppress_tokens"]),
        source=data["source"],
    )


def _skeleton(dims: WhisperDims, quantised: list[str]) -> Whisper:
    """A Whisper whose weights are left uninitialised (the state dict overwrites them), with
    dynamically quantised Linears at ``quantised``."""
    with _no_init():
        model = Whisper(dims)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

        for name in quantised:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            linear = getattr(parent, child)
            if not isinstance(linear, nn.Linear):
                raise ValueError(f"{name}: quantised in the cache, not a Linear in Whisper")
            # built 1x1, then given its shape: the constructor packs a zero weight of the
            # full size, which the state dict's weight replaces (packing is the costly part,
            # 0.4 s for tiny.en's layers on a loaded machine, and it was paid twice over)
            quant = DynamicLinear(1, 1, bias_=linear.bias is not None, dtype=torch.qint8)
            quant.in_features, quant.out_features = linear.in_features, linear.out_features
            setattr(parent, child, quant)
    return model


_INIT_FUNCTIONS = ("uniform_", "normal_", "kaiming_uniform_", "kaiming_normal_",
                   "xavier_uniform_", "xavier_normal_", "trunc_normal_")


@contextlib.contextmanager
def _no_init() -> Iterator[None]:
    """Modules built here keep uninitialised weights: the random initialisation of a model
    whose every weight is then loaded cost 0.5-1 s for tiny.en. The loading process is
    single-threaded, so swapping torch.nn.init's functions for a moment is safe."""
    saved = {name: getattr(nn.init, name) for name in _INIT_FUNCTIONS}
    try:
        for name in _INIT_FUNCTIONS:
            setattr(nn.init, name, _keep)
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _keep(tensor: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return tensor
