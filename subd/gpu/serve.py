"""The recogniser process of a daemon that batches: one model, one batched engine, every channel.

:func:`load_batching_engine` places the model (``[recognizer] device`` / ``precision``, checked
with torch here: a CPU-only torch asked for CUDA is a one-line error and the daemon does not
start) and builds the process's :class:`~subd.gpu.batcher.BatchingEngine`. Each channel that
attaches gets its usual recogniser host, whose streaming recogniser is built over that engine
(:func:`batched_host_spec`): same policy code, same state per channel, decodes batched.
"""

from __future__ import annotations

import logging
from typing import Any

from subd.gpu.batcher import BatchingEngine
from subd.workers.hosts import FactorySpec

log = logging.getLogger("subd.gpu.serve")

CPU_MAX_ROWS = 16  # a CPU batch past this gains nothing (2-core measurement: see the README)
_ENGINE: BatchingEngine | None = None


def load_batching_engine(model: str = "tiny.en", device: str = "auto", precision: str = "auto",
                         max_rows: int = 256, threads: int = 0, share: float = 1.0
                         ) -> BatchingEngine:
    """This process's batched engine (loaded once; a second call gets the same one). On CUDA
    it decodes at most as many windows at once as fit in ``share`` of the GPU's memory (one
    of several processes: 1 / their number): the decode buffers are allocated up front, and
    at 256 rows large-v3's alone take 76 GiB."""
    global _ENGINE
    if _ENGINE is not None:
        return _ENGINE
    import torch

    from subd.gpu.device import place, torch_dtype
    from subd.models.batched_window import WindowEngine
    from subd.models.engine import live_threads
    placement = place(device, precision)
    if placement.cuda:
        # cuDNN's attention builds a plan for every new shape (hundreds of ms of host time),
        # and batch sizes and prompt lengths change every batch: the flash and memory-efficient
        # kernels instead (the in-process bench had this set, the daemon's process had not)
        torch.backends.cuda.enable_cudnn_sdp(False)
    if not placement.cuda:
        torch.set_num_threads(threads or live_threads())
    elif threads:  # one of several processes on this GPU: its share of the cores
        torch.set_num_threads(threads)
    loaded = load_weights(model)
    dtype = torch_dtype(placement.precision)
    if placement.cuda:
        from subd.gpu.device import rows_on_device

        max_rows = rows_on_device(loaded.model, dtype, placement.device, share, max_rows, model)
    else:
        max_rows = min(max_rows, CPU_MAX_ROWS)
    windows = WindowEngine(loaded, placement.device, dtype, max_rows=max_rows,
                           quantize=placement.precision == "int8")
    if placement.cuda:  # compile and capture now, not on the first channels' words
        windows.warm()
    log.info("batched recogniser: %s on %s (%s), up to %d windows a batch", model,
             placement.device, placement.precision, max_rows)
    _ENGINE = BatchingEngine(windows)
    return _ENGINE


def load_weights(model: str) -> Any:
    """A packaged model, a model path, or a compact copy (models.portable.load_weights)."""
    from subd.models.portable import load_weights as load

    return load(model)


def batched_streaming_recognizer(model: str = "tiny.en", precision: str = "auto",
                                 **opts: Any) -> Any:
    """A channel's streaming recogniser (its own state) over this process's batched engine
    (``precision``: the engine's, set when it was loaded)."""
    from subd.recognise.streaming import StreamingRecognizer

    if _ENGINE is None:
        raise RuntimeError("no batched engine in this process (load_batching_engine first)")
    return StreamingRecognizer(model, engine=_ENGINE, **opts)


def batched_host_spec(spec: Any) -> Any:
    """``spec`` (a channel's recogniser host) with its recogniser on the batched engine; a
    custom recogniser factory is left as it is (it decodes on its own)."""
    rec = spec.kwargs.get("recognizer") if isinstance(spec, FactorySpec) else None
    if isinstance(rec, FactorySpec) and rec.target.endswith(":shared_streaming_recognizer"):
        batched = FactorySpec("subd.gpu.serve:batched_streaming_recognizer", rec.kwargs)
        # no update costs measured as it attaches (subd.recognise.warmup): the batched engine
        # decodes only inside its batches, and an update's cost there is its batch's
        return FactorySpec(spec.target, {**spec.kwargs, "recognizer": batched,
                                         "measure_costs": False})
    return spec
