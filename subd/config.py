"""Typed configuration: config.toml -> frozen per-section dataclasses, validated at load time.

Each section's fields carry their allowed range in metadata (:func:`rng`, :func:`choice`); a bad
key or value raises :class:`ConfigError` naming the section, the key and what is allowed, so the
daemon never starts on a bad file. Other modules add sections with ``@register_section("sse")``
(validated by :func:`load_config` if imported before loading) or ``config.section("sse",
SseConfig)`` at use time (the raw table kept and validated on first access: sections unknown at
load time never break the daemon's core)."""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from subd.errors import ConfigError
from subd.script import CHINESE_SCRIPTS, DEFAULT_CHINESE_SCRIPT, check_language, default_model
from subd.types import DEFAULT_ENCODER_SPAN, ENCODER_SPANS
from subd.validate import build_section, check_prompt, choice, rng  # noqa: F401 - named here

T = TypeVar("T")

_SECTIONS: dict[str, type] = {}
# Sections read at use time by modules the configuration does not import (validated there,
# before anything starts): [layout] by subd.service.build, [punct] by the daemon for the tagger.
# Any other top-level table is an error: a misspelt [recogniser] must not go unseen.
_USE_TIME_SECTIONS = {"layout", "punct"}


def declare_section(name: str) -> None:
    """Accept ``[name]`` at load time; its owner validates it (``Config.section``)."""
    _USE_TIME_SECTIONS.add(name)


def register_section(name: str):
    def deco(cls: type[T]) -> type[T]:
        _SECTIONS[name] = cls
        return cls

    return deco


@register_section("tick")
@dataclass(frozen=True, slots=True)
class TickConfig:
    fps: str = "30"  # exact rational: "30", "25", "30000/1001"
    latency_ms: int = field(default=2000, metadata=rng(100, 60_000))
    lookahead_ms: int = field(default=150, metadata=rng(0, 10_000))
    realtime: bool = True  # ask for SCHED_FIFO (logged either way)
    miss_tolerance_ms: float = field(default=0.0, metadata=rng(0, 1000))  # 0 = half a period
    max_latency_ms: int = field(default=10_000, metadata=rng(100, 60_000))  # reload limit for D

    @property
    def latency_ns(self) -> int:
        """D on the nanosecond timeline."""
        return self.latency_ms * 1_000_000


@register_section("source")
@dataclass(frozen=True, slots=True)
class SourceConfig:
    kind: str = field(default="auto", metadata=choice("auto", "file", "mic", "stdin", "http"))
    path: str = ""  # file source; "" = the bundled demo clip
    speed: float = field(default=1.0, metadata=rng(0.01, 1000))
    jitter_ms: int = field(default=0, metadata=rng(0, 5000))
    loop: bool = True  # file: start over at the end (a daemon keeps running)
    device: str = ""  # microphone: index or name substring; "" = no microphone configured
    chunk_ms: int = field(default=20, metadata=rng(1, 2000))
    pcm_format: str = field(default="s16le", metadata=choice("s16le", "f32le"))
    # stdin / HTTP push PCM's rate and channels (a push may say its own: ?rate=, ?channels=)
    pcm_rate_hz: int = field(default=16_000, metadata=rng(1_000, 384_000))
    pcm_channels: int = field(default=1, metadata=rng(1, 64))
    quiet_after_ms: int = field(default=3000, metadata=rng(100, 600_000))  # live: no audio
    # for this long -> the source is reported down (pusher gone, device unplugged)


def nvidia_present() -> bool:
    """An NVIDIA driver on this machine (its device nodes or /proc entry), seen without torch."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia/version")


@register_section("recognizer")
@dataclass(frozen=True, slots=True)
class RecognizerConfig:
    model: str = ""  # "" = by language: tiny.en for English, base for any other (or auto)
    # "auto" (identified on each channel's first speech) or an ISO code: en, zh, ja, de, ...
    language: str = "en"
    # Chinese written in simplified, traditional, taiwan or hongkong script, or as decoded
    chinese_script: str = field(default=DEFAULT_CHINESE_SCRIPT, metadata=choice(*CHINESE_SCRIPTS))
    prompt: str = ""  # names and terms to expect: before every decode's context (models.words)
    # "" = subd.recognise.streaming.StreamingRecognizer(model); or "module:callable"
    factory: str = ""
    process: bool = True  # run in its own process (never share the publisher's GIL)
    min_update_ms: int = field(default=200, metadata=rng(0, 10_000))
    # the cadence on a GPU (the batched recogniser on CUDA): "auto" = derived from D
    # (subd.pipeline.cadence: 520 ms at D = 2 s, 200 at 1 s, 1000 from 3 s) or N ms (0..10000)
    gpu_update_ms: str | int = "auto"
    # "measured" or N ms: updates planned as lasting N, on the audio's clock (config.toml)
    update_cost_ms: str | int = "measured"
    # encoder input: the window's audio + this padding (0: Whisper's full 30 s; see
    # subd.recognise.options.StreamingConfig.encoder_pad_ms)
    encoder_pad_ms: int = field(default=2000, metadata=rng(0, 30_000))
    # ... rounded up to this bucket (few encoder shapes recur); and the committed audio the
    # window keeps before it moves on (the cut span's left context). Many channels on one GPU:
    # 2000 and 3000 encode far fewer frames (docs/MEASUREMENTS.md, "A smaller cut window")
    encoder_bucket_ms: int = field(default=4000, metadata=rng(20, 30_000))
    trim_after_ms: int = field(default=15000, metadata=rng(500, 20_000))
    # per update: the cut span above, Whisper's full 30 s input, or "auto" (subd.pipeline.deadline)
    encoder_span: str = field(default=DEFAULT_ENCODER_SPAN, metadata=choice(*ENCODER_SPANS))
    history_s: int = field(default=40, metadata=rng(31, 600))  # > Whisper's 30 s window
    start_timeout_s: int = field(default=300, metadata=rng(1, 3600))
    # where the recogniser runs: "auto" (the first GPU if torch sees one, else the CPU),
    # "cpu", "cuda" or "cuda:N"; CUDA asked for and absent is a one-line error at start
    device: str = "auto"
    # weights: "auto" = int8 on the CPU, fp16 on CUDA; int8 is CPU only, fp16/bf16 CUDA only
    precision: str = field(default="auto",
                           metadata=choice("auto", "int8", "fp32", "fp16", "bf16"))
    # every channel's decodes batched in one recogniser (subd.gpu.serve): "auto" = on CUDA,
    # off on the CPU (2 cores: it does not pay there); "on"; "off" (one decode at a time)
    batched: str = field(default="auto", metadata=choice("auto", "on", "off"))
    # how many batched recogniser processes share the channels (subd.service.sharding): "auto"
    # = 1 on the CPU, on CUDA half the cores (at most 4); or N (1..64)
    gpu_processes: str | int = "auto"
    # windows a batched process decodes at once: "auto" = what its GPU share allows (<= 256), or N
    gpu_max_rows: str | int = "auto"
    # on the CPU (not batched): how many recogniser processes share the channels out, each
    # deciding one channel's update at a time (subd.service.sharding): "auto" = one per
    # channel up to the usable cores (at most 4), each with its share of the cores; or N
    cpu_processes: str | int = "auto"
    # a loaded, idle twin of each stage process takes over at once when one dies or hangs
    # (subd.service.stages): recovery without a model load, for one more model in memory
    spare_process: bool = False

    def __post_init__(self) -> None:
        if not self.model:  # frozen: the default model is chosen once, here
            object.__setattr__(self, "model", default_model(self.language))
        check_prompt(self.prompt)

    def window_options(self) -> dict[str, int]:
        """The streaming recogniser's window keys set here (subd.recognise.streaming)."""
        return {"encoder_pad_ms": self.encoder_pad_ms, "encoder_bucket_ms": self.encoder_bucket_ms,
                "trim_after_ms": self.trim_after_ms}

    def planned_cost_ms(self) -> int:  # update_cost_ms for the tick pipeline: 0 = measured
        return 0 if self.update_cost_ms == "measured" else int(self.update_cost_ms)

    def on_gpu(self) -> bool:
        """The daemon's recogniser is the batched one on CUDA (as subd.service.daemon decides: not
        the CPU, an NVIDIA driver present, batched not "off", no custom recogniser factory)."""
        return (not self.factory and self.batched != "off" and self.device != "cpu"
                and nvidia_present())

    def validate(self) -> None:
        check_language(self.language)
        if self.model.endswith(".en") and self.language not in ("en", "auto"):
            raise ConfigError(f"[recognizer] language = {self.language!r}: the model "
                              f"{self.model!r} knows only English (use model = \"base\")")
        if not re.fullmatch(r"auto|cpu|cuda(:\d{1,2})?", self.device):
            raise ConfigError(f"[recognizer] device: {self.device!r} is not one of auto, cpu, "
                              "cuda, cuda:N")
        # refused here, before any worker starts and without importing torch: the recogniser
        # process checks the rest (a CPU-only torch, a GPU index out of range; subd.gpu.device)
        if self.device.startswith("cuda") and not nvidia_present():
            raise ConfigError(f"[recognizer] device = {self.device!r}: CUDA is not available: "
                              "no NVIDIA driver on this machine")
        if self.batched == "off" and self.device.startswith("cuda"):
            raise ConfigError("[recognizer] batched = \"off\": the serial recogniser runs on "
                              "the CPU; device cuda needs batched = \"auto\" or \"on\"")
        for key, word, lo, hi, unit in (
                ("gpu_processes", "auto", 1, 64, "number of processes"),
                ("gpu_max_rows", "auto", 1, 4096, "number of rows"),
                ("cpu_processes", "auto", 1, 64, "number of processes"),
                ("gpu_update_ms", "auto", 0, 10_000, "number of milliseconds"),
                ("update_cost_ms", "measured", 20, 10_000, "number of milliseconds")):
            value = getattr(self, key)
            if value != word and (isinstance(value, bool) or not isinstance(value, int)
                                  or not lo <= value <= hi):
                raise ConfigError(f"[recognizer] {key} = {value!r}: \"{word}\" or a whole "
                                  f"{unit}, {lo}..{hi}")
        if self.precision == "int8" and self.device.startswith("cuda"):
            raise ConfigError("[recognizer] precision: int8 runs on the CPU only "
                              "(use fp16 or bf16 on CUDA)")
        if self.precision in ("fp16", "bf16") and (self.device == "cpu" or self.batched == "off"
                                                   or not nvidia_present()):
            raise ConfigError(f"[recognizer] precision: {self.precision} needs CUDA, and the "
                              "recogniser runs on the CPU here (use int8 or fp32)")


@register_section("pipeline")
@dataclass(frozen=True, slots=True)
class PipelineConfig:
    tagger: str = "auto"  # "auto" (subd.punct.stream if installed), "none", or "module:factory"
    layout: str = "builtin"  # "builtin" (the [layout] section) or "module:factory"
    tag_process: bool = True  # run a real tagger in its own process
    drain_timeout_s: float = field(default=30.0, metadata=rng(0, 3600))


@register_section("server")
@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = field(default=8765, metadata=rng(0, 65535))
    push_token: str = ""  # bearer token for POST /push (HTTP audio source); "" = no push route


@register_section("sinks")
@dataclass(frozen=True, slots=True)
class SinksConfig:
    enabled: list[str] = field(default_factory=lambda: ["sse"])  # options: [sinks.NAME]


@register_section("events")
@dataclass(frozen=True, slots=True)
class EventsConfig:
    path: str = ""  # JSON-lines events log; "" = none


_BUS_URL = re.compile(r"^(redis|rediss)://[^\s]*$|^unix:///[^\s]+$")
_BUS_PREFIX = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@register_section("bus")
@dataclass(frozen=True, slots=True)
class BusConfig:
    """[bus]: tick events to Redis Streams for edge servers (subd.bus, subd edge)."""

    url: str = ""  # "" = no bus; redis://HOST:PORT/DB, rediss://..., unix:///path/redis.sock
    prefix: str = "subd"  # keys: PREFIX:{CHANNEL}:events (the stream), PREFIX:{CHANNEL}:lease
    lead_ms: int = field(default=20, metadata=rng(2, 40))  # written at T(k) - lead_ms
    stream_maxlen: int = field(default=9000, metadata=rng(100, 10_000_000))  # ~ entries kept
    lease_ttl_ms: int = field(default=3000, metadata=rng(300, 600_000))
    backlog_ticks: int = field(default=9000, metadata=rng(1, 10_000_000))  # Redis away

    def validate(self) -> None:
        if self.url and not _BUS_URL.match(self.url):
            raise ConfigError(f"[bus] url: {self.url!r} is not a redis://, rediss:// or "
                              "unix:/// URL")
        if not _BUS_PREFIX.match(self.prefix):
            raise ConfigError(f"[bus] prefix: {self.prefix!r}: 1-64 of A-Z, a-z, 0-9, _ . -")


CHANNEL_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
_CHANNEL_KEYS = ("tick", "source", "sinks", "events")


@dataclass(frozen=True, slots=True)
class ChannelSpec:
    """One channel: source, tick (latency), sinks, events log, prompt (None: [recognizer]'s)."""

    name: str
    tick: TickConfig
    source: SourceConfig
    sinks: SinksConfig
    events: EventsConfig
    sink_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    prompt: str | None = None

    def prompt_in(self, recognizer: RecognizerConfig) -> str:
        return recognizer.prompt if self.prompt is None else self.prompt


@dataclass(frozen=True, slots=True)
class Config:
    tick: TickConfig
    source: SourceConfig
    recognizer: RecognizerConfig
    pipeline: PipelineConfig
    server: ServerConfig
    sinks: SinksConfig
    events: EventsConfig
    path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # name -> validated section or raw table
    channels: tuple[ChannelSpec, ...] = ()  # [channels.NAME]; () = one channel from the top

    def channel_specs(self) -> tuple[ChannelSpec, ...]:
        """The channels to run: [channels.NAME] tables, or one "main" channel made of the
        top-level [tick], [source], [sinks] and [events] sections."""
        if self.channels:
            return self.channels
        return (ChannelSpec("main", self.tick, self.source, self.sinks, self.events,
                            dict(self.extra.get("sink_options", {}))),)

    def section(self, name: str, cls: type[T]) -> T:
        """A section owned by another module, validated with the same rules."""
        got = self.extra.get(name, {})
        if isinstance(got, cls):
            return got
        return build_section(name, cls, got)

    def replace(self, **sections: Any) -> Config:
        return dataclasses.replace(self, **sections)


_CORE = ("tick", "source", "recognizer", "pipeline", "server", "sinks", "events", "channels")


def _split_sinks(table: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """[sinks] keys, and its [sinks.NAME] tables (each sink's options)."""
    table = dict(table)
    options = {k: table.pop(k) for k in list(table) if isinstance(table[k], dict)}
    return table, options


def _channel_specs(data: dict[str, Any]) -> tuple[ChannelSpec, ...]:
    channels = data.get("channels", {})
    if not isinstance(channels, dict):
        raise ConfigError("[channels]: expected tables [channels.NAME]")
    specs = []
    for name, table in channels.items():
        where = f"channels.{name}"
        if not CHANNEL_NAME.match(name):
            raise ConfigError(f"[{where}]: a channel name is 1-32 of a-z, 0-9, _ and -, "
                              f"starting with a letter or digit")
        if not isinstance(table, dict):
            raise ConfigError(f"[{where}]: expected a table")
        unknown = sorted(set(table) - {*_CHANNEL_KEYS, "prompt"})
        if unknown:
            raise ConfigError(f"[{where}] {unknown[0]}: unknown key "
                              f"(known: {', '.join(_CHANNEL_KEYS)}, prompt)")
        prompt = table.get("prompt")
        merged: dict[str, Any] = {}
        for key in _CHANNEL_KEYS:
            top, own = data.get(key, {}), table.get(key, {})
            if not isinstance(own, dict):
                raise ConfigError(f"[{where}.{key}]: expected a table")
            merged[key] = {**(top if isinstance(top, dict) else {}), **own}
        sinks, options = _split_sinks(merged["sinks"])  # a channel's [..sinks.NAME] wins
        built = {key: build_section(f"{where}.{key}", _SECTIONS[key], merged[key])
                 for key in ("tick", "source", "events")}
        specs.append(ChannelSpec(name, sinks=build_section(f"{where}.sinks", SinksConfig, sinks),
                                 sink_options=options, **built, prompt=None if prompt is None
                                 else check_prompt(prompt, f"[{where}] prompt")))
    return tuple(specs)


def config_from_dict(data: dict[str, Any], path: str = "") -> Config:
    core = {}
    extra: dict[str, Any] = {}
    for name, table in data.items():
        if name in _CORE:
            continue
        if not isinstance(table, dict):
            raise ConfigError(f"{name}: top-level keys must be tables ([{name}])")
        if name not in _SECTIONS and name not in _USE_TIME_SECTIONS:
            known = sorted({*_CORE, *_SECTIONS, *_USE_TIME_SECTIONS})
            raise ConfigError(f"[{name}]: unknown section (known: {', '.join(known)})")
        cls = _SECTIONS.get(name)
        extra[name] = build_section(name, cls, table) if cls else table
    sinks_table = dict(data.get("sinks", {})) if isinstance(data.get("sinks"), dict) else {}
    # [sinks.NAME] tables are the options of each sink, validated by the sink itself
    sinks_table, extra["sink_options"] = _split_sinks(sinks_table)
    channels = _channel_specs(data)
    data = {**data, "sinks": sinks_table}
    for name in _CORE[:-1]:
        core[name] = build_section(name, _SECTIONS[name], data.get(name, {}))
    from subd.clock import parse_fps  # fps is a string: check it here, not at the first tick
    from subd.sinks import available_sinks

    known = available_sinks()  # reads every installed package's metadata: 6 ms, once
    for where, tick, sinks in (("", core["tick"], core["sinks"]),
                               *((f"channels.{c.name}.", c.tick, c.sinks) for c in channels)):
        try:
            parse_fps(tick.fps)
        except ConfigError as exc:
            raise ConfigError(f"[{where}tick] {exc}") from None
        _check_sink_names(f"{where}sinks", sinks.enabled, known)
    return Config(**core, path=path, extra=extra, channels=channels)


def _check_sink_names(section: str, names: list[str], known: dict) -> None:
    """Sink names must be registered (entry-point group ``subd.sinks``) when the file loads."""
    for name in names:
        if name not in known:
            raise ConfigError(f"[{section}] enabled: unknown sink {name!r} "
                              f"(registered sinks: {', '.join(sorted(known)) or 'none'})")


def load_config(path: str | Path | None = None) -> Config:
    """Load ``path`` (None: built-in defaults). One-line ConfigError on any problem."""
    if path is None:
        return config_from_dict({})
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: configuration file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read configuration: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from None
    try:
        return config_from_dict(data, str(p))
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None
