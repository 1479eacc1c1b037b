"""One model for several channels: the worker-side host that serves every channel's stage
host in one process, the messages that reach it, and the engine that process loads once.

Every channel has its own recogniser state (its own stream, audio history and commit point),
but they all live in ONE worker process that loads the model once: :class:`MultiplexHost`
hosts one stage host per channel and routes each request by channel name; the engine is
shared through :func:`shared_engine`. The event-loop side is :mod:`subd.service.stages`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from subd.workers.process import settle_heap


@dataclass(frozen=True, slots=True)
class Attach:
    """Build ``host`` for ``channel`` in the worker (replacing an earlier one)."""

    channel: str
    host: Any  # subd.workers.hosts.FactorySpec


@dataclass(frozen=True, slots=True)
class Detach:
    channel: str


@dataclass(frozen=True, slots=True)
class ForChannel:
    channel: str
    request: Any


class MultiplexHost:
    """A worker host serving several channels; ``preload`` (e.g. the model) is built first, so
    the worker is ready only once the model is loaded. ``share``: this is one of that many
    recogniser processes, and takes its share of the cores for torch's threads."""

    def __init__(self, preload: Any | None = None, share: int = 1) -> None:
        if share > 1:  # one of several recogniser processes: its share of the cores
            from subd.models.engine import share_cores

            share_cores(share)
        self.shared = preload.build() if preload is not None else None
        self.hosts: dict[str, Any] = {}

    def handle(self, request: Any) -> Any:
        if isinstance(request, ForChannel):
            host = self.hosts.get(request.channel)
            if host is None:
                raise KeyError(f"channel {request.channel!r} is not attached")
            return host.handle(request.request)
        if isinstance(request, Attach):
            dropped = self._close(request.channel)
            host = self.hosts[request.channel] = request.host.build()
            settle_heap(dropped)  # the channel's host lives as long as the channel
            # a recogniser's update costs, measured as it was built (subd.recognise.warmup)
            return getattr(host, "update_costs", None) or True
        if isinstance(request, Detach):
            settle_heap(self._close(request.channel), idle=not self.hosts)
            return True
        raise TypeError(f"unexpected request {type(request).__name__}")

    def _close(self, channel: str) -> bool:
        """Let the channel's host go; whether there was one."""
        host = self.hosts.pop(channel, None)
        close = getattr(host, "close", None)
        if close is not None:
            close()
        return host is not None

    def close(self) -> None:
        for channel in list(self.hosts):
            self._close(channel)


_ENGINES: dict[tuple[str, str, int], Any] = {}


def shared_engine(model: str = "tiny.en", precision: str = "auto", threads: int = 0) -> Any:
    """The Whisper engine of this process, loaded once per (model, precision, threads):
    ``[recognizer] precision`` on the CPU, "auto" and "int8" quantised, "fp32" not (CUDA's
    fp16 and bf16 are refused before the process starts: subd.service.daemon)."""
    key = (model, precision, threads)
    if key not in _ENGINES:
        from subd.models.engine import WhisperEngine, live_threads

        _ENGINES[key] = WhisperEngine.load(model, threads=threads or live_threads(),
                                           quantize=precision in ("auto", "int8"))
    return _ENGINES[key]


def shared_streaming_recognizer(model: str = "tiny.en", precision: str = "auto",
                                threads: int = 0, **opts: Any) -> Any:
    """A streaming recogniser (its own state) over this process's shared engine."""
    from subd.recognise.streaming import StreamingRecognizer

    return StreamingRecognizer(model, engine=shared_engine(model, precision, threads), **opts)
