"""What the daemon builds from its configuration: the recogniser spec, sources (and the guard
around a channel's source), sinks and their options, the tagger, the layout stage, the demo clip."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from pathlib import Path
from typing import Any

from subd.clock import Clock
from subd.config import ChannelSpec, Config
from subd.errors import AudioInputError, ConfigError, ModelError
from subd.pipeline.scheduler import Source
from subd.server.standalone import serve_if_configured
from subd.sinks import load_sink_factory
from subd.sources.decode import DEMO_CLIP, demo_clip_path  # noqa: F401 - named here by the daemon
from subd.validate import check_writable_folder
from subd.workers.hosts import FactorySpec, resolve_tagger

log = logging.getLogger("subd.service.build")



def recognizer_spec(model: str, factory: str = "", **opts: Any) -> FactorySpec:
    """The streaming recogniser, imported in the worker process: subd.recognise.streaming's
    over the process's shared engine by default, or any ``module:callable`` taking no arguments
    (``[recognizer] factory``)."""
    if factory:
        return FactorySpec(factory)
    if importlib.util.find_spec("subd.recognise.streaming") is None:
        raise ModelError("the streaming recogniser (subd/recognise/streaming.py) is not installed")
    return FactorySpec("subd.service.supervisor:shared_streaming_recognizer",
                       {"model": model, **opts})


def build_source(config: Config, *, seed: int = 0, spec: ChannelSpec | None = None,
                 token: str | None = None) -> Source:
    from fractions import Fraction

    from subd.sources.live import FileSource, PcmStreamSource, QueueSource
    from subd.sources.mic import MicSource

    src = (spec or config.channel_specs()[0]).source
    kind = src.kind
    if kind == "auto":
        kind = "mic" if src.device else "file"
    if kind == "file":
        path = Path(src.path) if src.path else demo_clip_path()
        return FileSource.from_path(path, speed=Fraction(str(src.speed)),
                                    jitter_ms=src.jitter_ms, chunk_ms=src.chunk_ms,
                                    loops=1_000_000 if src.loop else 1, seed=seed)
    if kind == "stdin":
        return PcmStreamSource(fmt=src.pcm_format, rate_hz=src.pcm_rate_hz,
                               channels=src.pcm_channels, chunk_ms=src.chunk_ms)
    if kind == "mic":
        return MicSource(src.device, src.chunk_ms)
    if not (token or config.server.push_token):
        raise ConfigError("[server] push_token: the HTTP audio source needs a bearer token "
                          "(or SUBD_PUSH_TOKEN in the environment)")
    return QueueSource("http push")


def build_sink(name: str, options: dict[str, Any]) -> Any:
    factory = load_sink_factory(name)
    from_mapping = getattr(factory, "from_mapping", None)
    sink = from_mapping(options) if from_mapping else factory(**options)
    return serve_if_configured(sink)


def check_outputs(config: Config) -> None:
    """One line (exit 2) before the daemon starts, or a reload is refused, where a channel's
    caption files or events log could not be written: their folder cannot be made or takes no
    file. A folder lost later is the sinks' own affair (logged, counted, tried again)."""
    from subd.sinks.files import CueFileSink

    for spec in config.channel_specs():
        # a channel's options may be its own table's or the top level's: name the channel
        where = f"channel {spec.name}: " if config.channels else ""
        for name in spec.sinks.enabled:
            factory = load_sink_factory(name)
            if isinstance(factory, type) and issubclass(factory, CueFileSink):
                sink = factory.from_mapping(sink_options(config, name, spec))
                check_writable_folder(sink.path.parent, f"{where}[sinks.{name}] directory "
                                                        f"{sink.config.directory}")
        if spec.events.path:
            check_writable_folder(Path(spec.events.path).parent,
                                  f"{where}[events] path {spec.events.path}")


def sink_options(config: Config, name: str, spec: ChannelSpec | None = None) -> dict[str, Any]:
    if spec is None:
        opts = dict(config.extra.get("sink_options", {}).get(name, {}))
        latency_ms = config.tick.latency_ms
    else:
        opts = dict(spec.sink_options.get(name, {}))
        latency_ms = spec.tick.latency_ms
    if name == "sse":
        opts.setdefault("host", "")  # mounted on the daemon's own server
        opts.setdefault("latency_ms", latency_ms)
    return opts


def build_layout(spec: str, config: Config | None = None) -> Any:
    """A channel's layout stage, which lays out the cues once per tick for every sink:
    ``[pipeline] layout`` = "builtin" (:class:`subd.layout.cues.CueLayout` with the [layout]
    section) or a "module:factory" building an object with ``apply(state)`` and ``finish()``.
    A layout holds its open cue: every channel gets its own."""
    if spec in ("", "builtin"):
        from subd.layout.cues import CueLayout, LayoutConfig

        table = config.extra.get("layout", {}) if config is not None else {}
        return CueLayout(table if isinstance(table, LayoutConfig)
                         else LayoutConfig.from_mapping(table))
    if spec == "none":
        raise ConfigError("[pipeline] layout = 'none': every sink takes its cues from the "
                          "pipeline now; use 'builtin' (the [layout] section) or "
                          "'module:factory'")
    return FactorySpec(spec).build()


def layout_key(spec: str, config: Config) -> tuple[str, str]:
    """What a channel's layout is built from (a reload rebuilds it only when this changes)."""
    return spec, repr(config.extra.get("layout", {}))


class GuardedSource:
    """A channel's source as its pipeline sees it. Ingest ends when the channel is asked to
    stop (drain). With ``path`` (a looping file) the file is read again at every pass: when it
    has vanished the channel reports its source down and gets paced silence, a second at a
    time, until the file is back, so its clock runs on and the audio timeline stays whole."""

    def __init__(self, inner: Any, stop: asyncio.Event, report: Any,
                 path: Path | None = None) -> None:
        self.inner = inner
        self.stop = stop
        self.report = report  # report(up: bool, detail: str)
        self.path = path
        self.live = inner.live
        self.pullable = inner.pullable
        self.speed = getattr(inner, "speed", None)
        self.t0_ns = 0
        self._clock: Clock | None = None

    async def start(self, clock: Clock) -> int:
        self._clock = clock
        self.t0_ns = await self.inner.start(clock)
        return self.t0_ns

    async def chunks(self) -> Any:
        from subd.types import AudioChunk

        source, offset = self.inner, 0
        while True:
            end = offset
            async for chunk in source.chunks():
                if self.stop.is_set():
                    return
                end = offset + chunk.start_sample + chunk.n_samples
                yield chunk if not offset else AudioChunk(chunk.start_sample + offset,
                                                          chunk.samples)
            if self.path is None or self.stop.is_set():
                return
            offset = end
            source = await self._next_pass(offset)

    async def _next_pass(self, offset: int) -> Any:
        import numpy as np

        from subd.sources.decode import load_audio
        from subd.sources.live import NS_PER_S, FileSource
        from subd.types import SAMPLE_RATE_HZ

        inner = self.inner
        try:
            audio = await asyncio.get_running_loop().run_in_executor(None, load_audio,
                                                                     self.path)
            self.report(True, "")
        except AudioInputError as exc:
            self.report(False, f"file vanished or unreadable: {exc}")
            audio = np.zeros(SAMPLE_RATE_HZ, dtype=np.float32)
        source = FileSource(audio, speed=inner.speed, jitter_ms=inner.jitter_ns // 1_000_000,
                            chunk_ms=inner.chunk_samples * 1000 // SAMPLE_RATE_HZ,
                            name=inner.name)
        await source.start(self._clock)
        speed = inner.speed
        source.t0_ns = self.t0_ns + offset * NS_PER_S * speed.denominator // (
            SAMPLE_RATE_HZ * speed.numerator)
        return source


def serial_host_spec(model: str | None, share: int = 1, precision: str = "auto") -> FactorySpec:
    """The serial recogniser process's host: channels attach their recognisers to it, over
    ``model``'s engine loaded first (None: nothing preloaded, a custom recogniser decodes on
    its own) in ``[recognizer] precision`` on the CPU (fp16 and bf16 are a one-line error);
    ``share``: one of that many such processes (subd.service.sharding)."""
    from subd.gpu.device import resolve_precision

    resolve_precision(precision, "cpu")  # the serial recogniser runs on the CPU
    preload = None
    if model is not None:
        recognizer_spec(model)  # a clear error if the recogniser is not installed
        preload = FactorySpec("subd.service.supervisor:shared_engine",
                              {"model": model, "precision": precision})
    return FactorySpec("subd.service.supervisor:MultiplexHost", {"preload": preload,
                                                                 "share": share})


def tagger_factory(config: Config) -> FactorySpec | None:
    """The tagger of ``[pipeline] tagger``, with ``[punct]`` as its options where it is the
    shipped CRF tagger (checked when the tag stage starts, before any channel)."""
    spec = resolve_tagger(config.pipeline.tagger)
    punct = config.extra.get("punct", {})
    if not punct:
        return spec
    if spec is None or not spec.target.endswith(":make_punct_stream"):
        log.warning("[punct] is set but the tagger is %r: its options are not used",
                    config.pipeline.tagger)
        return spec
    return FactorySpec(spec.target, {**spec.kwargs, **punct})
