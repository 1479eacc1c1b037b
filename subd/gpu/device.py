"""Which device the recogniser runs on, and in which precision.

``[recognizer] device`` and ``--device`` take "auto", "cpu", "cuda" or "cuda:N". "auto" is the
first GPU when torch sees one, else the CPU. Asking for CUDA where torch sees none (no GPU, no
driver, or a CPU-only torch build) is a one-line :class:`~subd.errors.ConfigError`: the CLI
exits with code 2 and the daemon does not start, rather than falling back to the CPU silently
(a daemon sized for a GPU would miss every deadline on the CPU).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from subd.errors import ConfigError

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d{1,2})?")
PRECISIONS = ("auto", "int8", "fp32", "fp16", "bf16")


@dataclass(frozen=True, slots=True)
class Placement:
    device: str  # "cpu" or "cuda:N"
    precision: str  # int8 | fp32 on the CPU; fp16 | bf16 | fp32 on CUDA

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


def _cuda_count() -> tuple[int, str]:
    """(GPUs torch sees, why none when 0)."""
    import torch

    if torch.version.cuda is None:
        return 0, f"this torch ({torch.__version__}) is built without CUDA"
    try:
        n = torch.cuda.device_count()
    except Exception as exc:  # noqa: BLE001 - a broken driver is "no CUDA", said in one line
        return 0, f"the CUDA driver does not answer ({type(exc).__name__})"
    return n, "" if n else "no GPU is visible (driver, CUDA_VISIBLE_DEVICES?)"


def resolve_device(spec: str, where: str = "[recognizer] device") -> str:
    """``spec`` -> "cpu" or "cuda:N"; CUDA asked for and absent raises ConfigError."""
    if not DEVICE_PATTERN.fullmatch(spec or ""):
        raise ConfigError(f"{where}: {spec!r} is not one of auto, cpu, cuda, cuda:N")
    if spec == "cpu":
        return "cpu"
    n, why = _cuda_count()
    if spec == "auto":
        return "cuda:0" if n else "cpu"
    index = int(spec.partition(":")[2] or 0)
    if n == 0:
        raise ConfigError(f"{where} = {spec!r}: CUDA is not available: {why}")
    if index >= n:
        raise ConfigError(f"{where} = {spec!r}: only {n} GPU(s) visible (cuda:0..cuda:{n - 1})")
    return f"cuda:{index}"


def resolve_precision(precision: str, device: str, where: str = "[recognizer] precision") -> str:
    if precision not in PRECISIONS:
        raise ConfigError(f"{where}: {precision!r} is not one of {', '.join(PRECISIONS)}")
    cuda = device.startswith("cuda")
    if precision == "auto":
        return "fp16" if cuda else "int8"
    if precision == "int8" and cuda:
        raise ConfigError(f"{where}: int8 runs on the CPU only (fp16 or bf16 on CUDA)")
    if precision in ("fp16", "bf16") and not cuda:
        raise ConfigError(f"{where}: {precision} needs CUDA (int8 or fp32 on the CPU)")
    return precision


def place(device: str, precision: str) -> Placement:
    dev = resolve_device(device)
    return Placement(dev, resolve_precision(precision, dev))


def torch_dtype(precision: str):
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)


def on_device(loaded, placement: Placement):
    """A copy of ``loaded`` whose model sits on ``placement`` (LayerNorms normalise in float32,
    as the batched engine's: ``models.whisper.layer_norms_to``); int8 is CPU dynamic
    quantisation."""
    import copy
    import dataclasses

    if placement.precision == "int8":
        from subd.models.engine import quantize_linears

        return dataclasses.replace(loaded, model=quantize_linears(loaded.model))
    if not placement.cuda and placement.precision == "fp32":
        return loaded
    from subd.models.whisper import layer_norms_to

    dtype = torch_dtype(placement.precision)
    model = layer_norms_to(copy.deepcopy(loaded.model).to(placement.device, dtype), dtype)
    return dataclasses.replace(loaded, model=model.eval())


def load_engine(model: str, placement: Placement, *, threads: int | None = None,
                language: str = "en"):
    """The single-stream engine on ``placement`` (``subd transcribe --device``)."""
    from subd.models.engine import WhisperEngine, _default_threads
    from subd.models.portable import load_weights

    loaded = on_device(load_weights(model), placement)
    return WhisperEngine(loaded, threads=threads or _default_threads(), language=language)


# What a process keeps free of its share of the GPU beyond the weights and the decode buffers:
# encoder activations (up to 128 windows of 30 s at once), cuFFT/cuBLAS workspaces, the CUDA
# graphs' pool and the allocator's slack.
WORKSPACE_SHARE = 0.3
GiB = 2**30


def rows_that_fit(dims, dtype, max_new: int, weights_bytes: int, share_bytes: int,
                  max_rows: int, model: str = "the model") -> int:
    """How many windows one batched engine can decode at once (its decode buffers are
    allocated for all of them up front) within ``share_bytes`` of device memory: at most
    ``max_rows``. A share too small for one row is a one-line :class:`ConfigError`."""
    from subd.models.batched_decode import bytes_per_row

    per_row = bytes_per_row(dims, dtype, max_new)
    room = int(share_bytes * (1 - WORKSPACE_SHARE)) - weights_bytes
    rows = min(max_rows, room // per_row)
    if rows < 1:
        raise ConfigError(
            f"[recognizer] gpu_processes: {model} needs {per_row / GiB:.2f} GiB of decode "
            f"buffers a window and {weights_bytes / GiB:.1f} GiB of weights; a process's share "
            f"of the GPU is {share_bytes / GiB:.1f} GiB: run fewer processes")
    return rows


def rows_on_device(model, dtype, device: str, share: float, max_rows: int, name: str) -> int:
    """:func:`rows_that_fit` for a window engine (models.batched.window_config) of ``model``
    (its weights counted from its parameters) in this process's ``share`` of ``device``."""
    from subd.models.batched import buffer_width, window_config

    weights = sum(p.numel() for p in model.parameters()) * dtype.itemsize
    return rows_that_fit(model.dims, dtype, buffer_width(window_config(model.dims, max_rows)),
                         weights, memory_share(device, share), max_rows, name)


def memory_share(device: str, share: float) -> int:
    """Bytes of ``device`` this process may still take: ``share`` of its memory (one of several
    processes) less what it holds already, and no more than is free now (other processes and
    programs hold the rest)."""
    import torch

    dev = torch.device(device)
    free, total = torch.cuda.mem_get_info(dev)
    return int(min(total * share - torch.cuda.memory_reserved(dev), free))
