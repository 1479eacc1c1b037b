"""``subd run [--config config.toml]``: the daemon."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from subd.config import load_config

log = logging.getLogger("subd.run")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run the subtitle daemon")
    p.add_argument("--config", help="configuration file (default: built-in defaults, the "
                                     "same as the shipped config.toml)")
    p.set_defaults(func=run)


async def _run(daemon) -> int:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    stopping = []

    def stop(signum: int) -> None:
        if not stopping:
            stopping.append(signum)
            log.info("%s: stopping", signal.Signals(signum).name)
            task.cancel()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, signum)
    try:
        await daemon.run()
    except asyncio.CancelledError:
        if not stopping:
            raise
    return 0


def run(args: argparse.Namespace) -> int:
    from subd.daemon import Daemon, build_sink, build_source, sink_options

    cfg = load_config(args.config)
    source = build_source(cfg)
    sinks = [build_sink(name, sink_options(cfg, name)) for name in cfg.sinks.enabled]
    needs_server = any(hasattr(s, "handle_events") for s in sinks) or cfg.source.kind == "http"
    serve = (cfg.server.host, cfg.server.port) if needs_server else None
    daemon = Daemon(cfg, source, sinks=sinks, events_path=cfg.events.path or None, serve=serve)
    return asyncio.run(_run(daemon))
