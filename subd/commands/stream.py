"""``subd stream IN.wav``: the live pipeline on a file, paced like a live source."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
from pathlib import Path

from subd.config import Config, SinksConfig, load_config
from subd.errors import UserError
from subd.pipeline.ticks import parse_fps, parse_rate
from subd.script import CHINESE_SCRIPTS
from subd.validate import PROMPT_HELP, check_piped_stdin, check_prompt, check_writable_folder

log = logging.getLogger("subd.stream")


def parse_host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UserError(f"--serve {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8765")
    return host.strip("[]"), int(port)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("stream", help="run the live pipeline on a file or on live PCM "
                              "from stdin")
    p.add_argument("input", help="audio or video file (WAV/FLAC/OGG by libsndfile, anything "
                   "else through ffmpeg), or - for live raw PCM on stdin "
                   "(--format, --rate, --channels), e.g. from ffmpeg -re ... -f s16le -")
    p.add_argument("--format", dest="pcm_format", choices=("s16le", "f32le"),
                   help="stdin PCM sample format (default: [source] pcm_format, s16le)")
    p.add_argument("--rate", dest="pcm_rate_hz", type=int,
                   help="stdin PCM sample rate in Hz (default: [source] pcm_rate_hz, 16000)")
    p.add_argument("--channels", dest="pcm_channels", type=int,
                   help="stdin PCM interleaved channels, mixed to mono (default: 1)")
    p.add_argument("--speed", default="1", help="pace at this many times real time (default 1)")
    p.add_argument("--jitter-ms", type=int, default=0,
                   help="deliver chunks randomly late by up to this many ms")
    p.add_argument("--srt", help="write committed cues to this live SRT file")
    p.add_argument("--events", help="write the JSON-lines events log here")
    p.add_argument("--serve", metavar="HOST:PORT", help="serve /events (SSE) and /overlay")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print no captions: by default each committed cue is printed on "
                        "stdout as it is committed (its times, then its lines)")
    p.add_argument("--latency-ms", type=int, help="D: audio-to-publication latency")
    p.add_argument("--lookahead-ms", type=int, help="A: look-ahead fetch window (150)")
    p.add_argument("--fps", help="tick rate: 30 (default), 25, 30000/1001 ...")
    p.add_argument("--model", help="recogniser model (default: tiny.en for English, base for "
                   "other languages)")
    p.add_argument("--language", help="ISO code of the speech (en, zh, ja, ...) or auto "
                   "(default: [recognizer] language)")
    p.add_argument("--chinese-script", choices=tuple(CHINESE_SCRIPTS),
                   help="the script Chinese is written in (default: [recognizer] "
                   "chinese_script, simplified)")
    p.add_argument("--prompt", help=PROMPT_HELP + " (default: [recognizer] prompt)")
    p.add_argument("--device", help="recogniser device: auto, cpu, cuda or cuda:N "
                   "(default: [recognizer] device)")
    p.add_argument("--config", help="configuration file (defaults: built in); its outputs "
                                     "([sinks] enabled, [events], [channels]) are not used: "
                                     "those are --srt, --events and --serve")
    p.add_argument("--seed", type=int, default=0, help="jitter random seed")
    p.set_defaults(func=run)


def stream_config(args: argparse.Namespace) -> Config:
    cfg = load_config(args.config)
    unused = [name for name, given in (
        ("[sinks] enabled", cfg.sinks.enabled != SinksConfig().enabled),
        ("[events] path", bool(cfg.events.path)), ("[channels]", bool(cfg.channels))) if given]
    if unused:  # a user who set them expects files that would not come
        log.warning("%s: %s not used by subd stream: its outputs are --srt, --events and "
                    "--serve", args.config, ", ".join(unused))
    if args.jitter_ms < 0 or args.jitter_ms > 5000:
        raise UserError(f"--jitter-ms {args.jitter_ms}: must be 0..5000")
    speed = parse_rate(args.speed)
    tick = cfg.tick
    if args.fps is not None:
        parse_fps(args.fps)
        tick = dataclasses.replace(tick, fps=args.fps)
    if args.latency_ms is not None:
        if not 100 <= args.latency_ms <= 60_000:
            raise UserError(f"--latency-ms {args.latency_ms}: must be 100..60000")
        tick = dataclasses.replace(tick, latency_ms=args.latency_ms)
    if args.lookahead_ms is not None:
        if not 0 <= args.lookahead_ms < tick.latency_ms:
            raise UserError(f"--lookahead-ms {args.lookahead_ms}: must be 0..latency")
        tick = dataclasses.replace(tick, lookahead_ms=args.lookahead_ms)
    if args.input == "-":  # live: it comes at its own pace
        if speed != 1 or args.jitter_ms:
            raise UserError("--speed and --jitter-ms pace a file; stdin (-) is live")
        check_piped_stdin("subd stream")
        pcm = {k: v for k in ("pcm_format", "pcm_rate_hz", "pcm_channels")
               if (v := getattr(args, k)) is not None}
        source = dataclasses.replace(cfg.source, kind="stdin", path="", **pcm)
        from subd.sources.pcm import PcmSpec  # here: numpy and soxr off every command's start

        # the same checks and words as subd transcribe -'s
        PcmSpec(source.pcm_format, source.pcm_rate_hz, source.pcm_channels)
    else:
        given = [o for o, k in (("--format", "pcm_format"), ("--rate", "pcm_rate_hz"),
                                ("--channels", "pcm_channels")) if getattr(args, k) is not None]
        if given:
            raise UserError(f"{', '.join(given)}: for raw PCM on stdin (-); a file says its own")
        source = dataclasses.replace(cfg.source, kind="file", path=args.input,
                                     speed=float(speed), jitter_ms=args.jitter_ms, loop=False)
    rec = cfg.recognizer
    if args.language:
        rec = with_language(rec, args.language)
    if args.model:
        rec = dataclasses.replace(rec, model=args.model)
    if args.chinese_script:
        rec = dataclasses.replace(rec, chinese_script=args.chinese_script)
    if args.prompt is not None:
        rec = dataclasses.replace(rec, prompt=check_prompt(args.prompt, "--prompt"))
    if args.language:
        try:
            rec.validate()  # an English-only model asked for another language
        except UserError as exc:
            raise UserError(str(exc).replace("[recognizer] language", "--language")) from None
    if args.device:
        rec = dataclasses.replace(rec, device=args.device)
        try:
            rec.validate()
        except UserError as exc:
            raise UserError(str(exc).replace("[recognizer] device", "--device")) from None
    return cfg.replace(tick=tick, source=source, recognizer=rec)


def with_language(rec, language: str):
    """``rec`` for ``--language``; a model that was the old language's default follows it
    (tiny.en for English, base otherwise)."""
    from subd.errors import ConfigError
    from subd.script import check_language, default_model

    try:
        code = check_language(language, "--language")
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    model = default_model(code) if rec.model == default_model(rec.language) else rec.model
    return dataclasses.replace(rec, language=code, model=model)


def run(args: argparse.Namespace) -> int:
    from subd.pipeline.tickstats import Counters
    from subd.service.daemon import Daemon, build_sink, build_source, sink_options
    from subd.tasks import cancel_all

    cfg = stream_config(args)
    source = build_source(cfg, seed=args.seed)
    if args.input != "-":
        source.speed = parse_rate(args.speed)  # exact: the config holds a float
    sinks = []
    if args.srt:
        out = Path(args.srt)
        check_writable_folder(out.parent, f"--srt {out}")
        sinks.append(build_sink("srt", {"directory": str(out.parent.resolve()),
                                        "filename": out.name}))
    if not args.quiet:
        sinks.append(build_sink("text", {}))
    serve = None
    if args.serve:
        serve = parse_host_port(args.serve)
        sinks.append(build_sink("sse", sink_options(cfg, "sse")))
    if args.events:
        out = Path(args.events)
        check_writable_folder(out.parent, f"--events {out}")
    daemon = Daemon(cfg, source, sinks=sinks, events_path=args.events, serve=serve)

    async def main() -> int:
        # SIGTERM/SIGINT drain the stream as under `subd run` (files finalised, workers and
        # the shared audio history closed): the default action killed the process with its
        # shared memory left behind and a worker traceback
        from subd.commands.run import DRAIN_TIMEOUT_S, _serve
        from subd.service.signals import SignalController

        try:
            return await _serve(daemon, SignalController(drain=daemon.drain,
                                                         drain_timeout_s=DRAIN_TIMEOUT_S))
        finally:
            await cancel_all()  # the net under every owner's own shutdown

    code = asyncio.run(main())
    first = next(iter(daemon.channels.values()), None)
    counters = first.counters if first is not None and first.counters else Counters()
    summary = {k: v for k, v in counters.as_dict().items() if k != "stage_ms"}
    print(json.dumps(summary), file=sys.stderr)
    return code

