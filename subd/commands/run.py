"""``subd run [--config config.toml]``: the daemon, with its operations around it.

Logging is one line per event (journald-friendly, repeats rate-limited); the service manager
hears READY/WATCHDOG/STATUS/STOPPING over NOTIFY_SOCKET (and worker processes never inherit
the socket); SIGTERM or SIGINT drains and exits 0, a second SIGINT forces, SIGHUP reloads the
configuration file (a bad one is refused, and the old configuration stays).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from subd.config import load_config
from subd.tasks import cancel_all, start_task

log = logging.getLogger("subd.run")

DRAIN_TIMEOUT_S = 4.5  # SIGTERM -> exit within 5 s, the files finalised


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run the subtitle daemon")
    p.add_argument("--config", help="configuration file (default: built-in defaults, the "
                                     "same as the shipped config.toml)")
    p.set_defaults(func=run)


def _keep_notify_to_ourselves() -> None:
    """Drop the notify variables from our environment once the Notifier has read them, so
    worker processes (spawned with this environment) cannot notify on our behalf."""
    from subd.service.notify import scrub_child_environment

    clean = scrub_child_environment(dict(os.environ))
    for key in set(os.environ) - set(clean):
        del os.environ[key]


async def _serve(daemon, controller) -> int:
    from subd.service.signals import EXIT_FORCED

    controller.install()
    # its failure is this function's to report (raised as the CLI's one line, or logged below)
    run_task = start_task(daemon.run(), "daemon", expected=(Exception,))
    wait_task = start_task(controller.wait(), "signals")
    try:
        done, _ = await asyncio.wait({run_task, wait_task},
                                     return_when=asyncio.FIRST_COMPLETED)
        if run_task in done and not controller.stopping:  # every channel ended by itself
            wait_task.cancel()
            await asyncio.gather(wait_task, return_exceptions=True)
            run_task.result()  # a start-up error is raised here
            return daemon.exit_code
        code = await wait_task
        if code == EXIT_FORCED or not run_task.done():
            run_task.cancel()
        results = await asyncio.gather(run_task, return_exceptions=True)
        if isinstance(results[0], Exception):
            log.error("the daemon ended with %s: %s", type(results[0]).__name__, results[0])
        return code
    finally:
        controller.uninstall()
        daemon.notifier.close()
        left = await cancel_all()  # the net under every owner's own shutdown
        if left:
            log.warning("tasks still running at exit, cancelled: %s", ", ".join(left))


def run(args: argparse.Namespace) -> int:
    import subd.service.logs
    from subd.server.safety import resolve_token
    from subd.service.build import build_layout, check_outputs
    from subd.service.daemon import Daemon
    from subd.service.health import HealthLimits, HealthMonitor
    from subd.service.metrics import Metrics
    from subd.service.notify import Notifier
    from subd.service.signals import Reloader, SignalController

    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    level = logging.DEBUG if getattr(args, "verbose", False) else logging.INFO
    repeat = subd.service.logs.setup_logging(level)
    try:
        cfg = load_config(args.config)
        build_layout(cfg.pipeline.layout, cfg)  # [layout] checked before anything starts
        check_outputs(cfg)
        token = resolve_token(cfg.server.push_token)
        notifier = Notifier()
        _keep_notify_to_ourselves()
        metrics = Metrics()
        health = HealthMonitor(HealthLimits())
        daemon = Daemon(cfg, serve=(cfg.server.host, cfg.server.port), notifier=notifier,
                        metrics=metrics, health=health, log_filter=repeat, supervise=True,
                        push_token=token)
        path = args.config

        def load():
            new = load_config(path) if path else load_config(None)
            check_outputs(new)  # a reload into a folder that takes no file is refused
            return new

        reloader = Reloader(cfg, load, daemon.apply_config,
                            on_result=lambda result: metrics.reloads.labels(result).inc())

        async def main() -> int:
            controller = SignalController(drain=daemon.drain, reload=reloader,
                                          drain_timeout_s=DRAIN_TIMEOUT_S, notifier=notifier)
            return await _serve(daemon, controller)

        return asyncio.run(main())
    finally:
        repeat.flush_all()
        for handler in list(root.handlers):  # in-process callers (tests) get theirs back
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
