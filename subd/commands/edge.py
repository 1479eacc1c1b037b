"""``subd edge --bus URL [--listen HOST:PORT]``: serve channels from the caption bus.

A stateless server (:mod:`subd.edge`): ``/c/NAME/events`` and ``/c/NAME/overlay`` for every
channel that a daemon publishes to the bus, each tick released at its due time on this
machine's clock (``due_unix_ns``: keep the clocks NTP/PTP-disciplined). SIGTERM/SIGINT stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

log = logging.getLogger("subd.edge")


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("edge", help="serve channels from the caption bus (Redis)")
    p.add_argument("--bus", required=True, help="redis://HOST:PORT/DB (as [bus] url)")
    p.add_argument("--listen", type=_listen, default=("127.0.0.1", 8766),
                   help="HOST:PORT to serve on (default 127.0.0.1:8766; port 0: any)")
    p.add_argument("--prefix", default="subd", help="key prefix, as [bus] prefix")
    p.add_argument("--fanout-workers", type=int, default=1,
                   help="processes sharing the writing to viewers, per channel (as "
                   "[sinks.sse] fanout_workers)")
    p.add_argument("--fanout-priority", type=int, default=9,
                   help="the fan-out workers' SCHED_FIFO priority, 1..9, below the release "
                   "loop's 10 (0: normal scheduling; as [sinks.sse] fanout_priority)")
    p.add_argument("--max-clients", type=int, default=4096, help="viewers per channel")
    p.add_argument("--history-ticks", type=int, default=9000,
                   help="ticks kept per channel for Last-Event-ID replay, read from the stream "
                   "when the edge starts following it (default: [bus] stream_maxlen's)")
    p.add_argument("--cors-origin", action="append", default=[],
                   help="allowed Origin of a page reading the events (repeatable; * = any)")
    p.set_defaults(func=run)


def edge_config(args: argparse.Namespace) -> object:
    from subd.config import BusConfig, build_section
    from subd.edge.server import EdgeConfig
    from subd.sinks.sse.wire import SSEConfig

    bus = build_section("bus", BusConfig, {"url": args.bus, "prefix": args.prefix})
    sse = SSEConfig.from_mapping({"fanout_workers": args.fanout_workers,
                                  "fanout_priority": args.fanout_priority,
                                  "max_clients": args.max_clients,
                                  "history_ticks": args.history_ticks,
                                  "cors_origins": list(args.cors_origin)}, "edge")
    host, port = args.listen
    return EdgeConfig(bus.url, host, port, bus.prefix, sse=sse)


def run(args: argparse.Namespace) -> int:
    from subd.clock import request_realtime_priority
    from subd.edge.server import Edge

    config = edge_config(args)

    async def main() -> int:
        edge = Edge(config)
        await edge.start()
        request_realtime_priority(who="edge")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            await stop.wait()
        finally:
            log.info("edge: stopping")
            await edge.close()
        return 0

    return asyncio.run(main())
