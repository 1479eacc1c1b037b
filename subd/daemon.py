"""Wiring: configuration -> source, worker processes, sinks, HTTP server, and the pipeline.

Order matters for timing: worker processes are spawned (and load their models) *before* the
publisher asks for SCHED_FIFO, so they never inherit real-time priority; the clock's t0 is set
only when everything is ready, so the first tick is not eaten by start-up.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.resources
import importlib.util
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from subd.clock import Clock, MonotonicClock, request_realtime_priority
from subd.config import Config
from subd.errors import AudioInputError, ConfigError, ModelError
from subd.events_log import EventsLog
from subd.ring import AudioHistory
from subd.scheduler import Observer, Pipeline, Source, TickSettings
from subd.sinks import load_sink_factory
from subd.sources import FileSource, MicSource, PcmStreamSource, QueueSource, make_push_handler
from subd.stages import FactorySpec, RecogniserHost, TagHost, resolve_tagger
from subd.tickstats import Counters
from subd.types import SAMPLE_RATE_HZ
from subd.worker import InlineWorker, ProcessWorker

log = logging.getLogger("subd.daemon")

DEMO_CLIP = ("data", "demo.wav")


def recognizer_spec(model: str, factory: str = "", **opts: Any) -> FactorySpec:
    """The streaming recogniser, imported in the worker process: subd.streaming's by default,
    or any ``module:callable`` taking no arguments (``[recognizer] factory``)."""
    if factory:
        return FactorySpec(factory)
    if importlib.util.find_spec("subd.streaming") is None:
        raise ModelError("the streaming recogniser (subd/streaming.py) is not installed")
    return FactorySpec("subd.streaming:StreamingRecognizer", {"model": model, **opts})


def demo_clip_path() -> Path:
    ref = importlib.resources.files("subd").joinpath(*DEMO_CLIP)
    if not ref.is_file():
        raise AudioInputError("the bundled demo clip subd/data/demo.wav is missing")
    return Path(str(ref))


def build_source(config: Config, *, seed: int = 0) -> Source:
    src = config.source
    kind = src.kind
    if kind == "auto":
        kind = "mic" if src.device else "file"
    if kind == "file":
        path = Path(src.path) if src.path else demo_clip_path()
        return FileSource.from_path(path, speed=Fraction(str(src.speed)),
                                    jitter_ms=src.jitter_ms, chunk_ms=src.chunk_ms,
                                    loops=1_000_000 if src.loop else 1, seed=seed)
    if kind == "stdin":
        return PcmStreamSource(fmt=src.pcm_format, chunk_ms=src.chunk_ms)
    if kind == "mic":
        return MicSource(src.device, src.chunk_ms)
    if not config.server.push_token:
        raise ConfigError("[server] push_token: the HTTP audio source needs a bearer token")
    return QueueSource("http push")


def build_sink(name: str, options: dict[str, Any]) -> Any:
    factory = load_sink_factory(name)
    from_mapping = getattr(factory, "from_mapping", None)
    return from_mapping(options) if from_mapping else factory(**options)


def sink_options(config: Config, name: str) -> dict[str, Any]:
    opts = dict(config.extra.get("sink_options", {}).get(name, {}))
    if name == "sse":
        opts.setdefault("host", "")  # mounted on the daemon's own server
        opts.setdefault("latency_ms", config.tick.latency_ms)
    return opts


@dataclass
class Daemon:
    config: Config
    source: Source
    sinks: list[Any] = field(default_factory=list)
    events_path: str | None = None
    recognizer: FactorySpec | None = None
    observer: Observer | None = None
    clock: Clock = field(default_factory=MonotonicClock)
    serve: tuple[str, int] | None = None  # our own HTTP server (SSE routes, audio push)
    pipeline: Pipeline | None = None
    bound_port: int | None = None

    def _workers(self, history: AudioHistory) -> tuple[Any, Any]:
        cfg = self.config
        rec_spec = self.recognizer or recognizer_spec(cfg.recognizer.model,
                                                      cfg.recognizer.factory)
        host_kwargs = {"recognizer": rec_spec, "history_capacity": history.capacity,
                       "history_name": history.shm_name}
        if cfg.recognizer.process:
            rec = ProcessWorker("recognise", FactorySpec("subd.stages:RecogniserHost",
                                                         host_kwargs))
        else:
            rec = InlineWorker("recognise", RecogniserHost(rec_spec, history.capacity,
                                                           history=history), self.clock)
        tagger = resolve_tagger(cfg.pipeline.tagger)
        if tagger is not None and cfg.pipeline.tag_process:
            tag = ProcessWorker("tag", FactorySpec("subd.stages:TagHost", {"tagger": tagger}))
        else:
            tag = InlineWorker("tag", TagHost(tagger), self.clock)
        return rec, tag

    async def _serve(self, stack: AsyncExitStack) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=2 << 20)
        for sink in self.sinks:
            if hasattr(sink, "handle_events"):
                from subd.http import add_routes

                add_routes(app, sink)
        if isinstance(self.source, QueueSource) and not isinstance(self.source, MicSource):
            app.router.add_post("/push", make_push_handler(
                self.source, token=self.config.server.push_token))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        host, port = self.serve
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        server = site._server  # noqa: SLF001 - the bound port when port = 0
        self.bound_port = server.sockets[0].getsockname()[1] if server else port
        log.info("serving http://%s:%d/events", host, self.bound_port)

    async def run(self) -> Counters:
        cfg = self.config
        async with AsyncExitStack() as stack:
            history = AudioHistory(cfg.recognizer.history_s * SAMPLE_RATE_HZ,
                                   shared=cfg.recognizer.process)
            stack.callback(history.close)
            rec, tag = self._workers(history)
            stack.push_async_callback(rec.close)
            stack.push_async_callback(tag.close)
            started = await asyncio.gather(rec.start(cfg.recognizer.start_timeout_s),
                                           tag.start(cfg.recognizer.start_timeout_s),
                                           return_exceptions=True)
            for outcome in started:
                if isinstance(outcome, BaseException):
                    raise outcome
            if isinstance(self.source, MicSource):
                self.source.open()
                stack.callback(self.source.close)
            for sink in self.sinks:
                await sink.start()
                stack.push_async_callback(sink.close)
            if self.serve is not None:
                await self._serve(stack)
            events = EventsLog(self.events_path) if self.events_path else None
            if events is not None:
                stack.callback(events.close)
            if cfg.tick.realtime:
                request_realtime_priority()
            speed = getattr(self.source, "speed", None)
            settings = TickSettings(
                fps=cfg.tick.fps, latency_ms=cfg.tick.latency_ms,
                lookahead_ms=cfg.tick.lookahead_ms,
                rate=speed if isinstance(speed, Fraction) else Fraction(1),
                min_update_ms=cfg.recognizer.min_update_ms,
                miss_tolerance_ms=cfg.tick.miss_tolerance_ms,
                drain_timeout_s=cfg.pipeline.drain_timeout_s)
            self.pipeline = Pipeline(clock=self.clock, settings=settings, source=self.source,
                                     recogniser=rec, tagger=tag, history=history,
                                     sinks=self.sinks, events=events, observer=self.observer)
            gc.freeze()  # start-up objects leave the collector's view: shorter GC pauses
            counters = await self.pipeline.run()
        log.info("published %d ticks: %d deadline misses, %d fallbacks, %d stale slots, "
                 "%d degraded", counters.ticks, counters.deadline_misses, counters.fallbacks,
                 counters.stale_slots, counters.degraded_ticks)
        return counters
