"""Process signals: SIGTERM/SIGINT drain and exit, a second SIGINT forces, SIGHUP reloads.

- SIGTERM, or a first SIGINT: tell systemd STOPPING=1, run the daemon's ``drain()`` (stop ingest,
  finish the pipeline, finalise every open cue to the files) for at most ``drain_timeout_s``,
  then exit 0. A drain that overruns is cancelled and logged; it still exits 0 because the stop
  was asked for (systemd must not restart a unit it is stopping).
- A second SIGINT during the drain cancels it at once: exit 130. A second SIGTERM is ignored:
  systemd escalates to SIGKILL after TimeoutStopSec by itself.
- SIGHUP: RELOADING=1, ``reload()``, READY=1. Reloads never overlap; a SIGHUP during a reload
  runs one more reload after it. :class:`Reloader` wraps "load the file, then apply it" so that
  an invalid file keeps the old configuration and logs why.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from subd.errors import UserError
from subd.service.notify import Notifier
from subd.tasks import start_task

log = logging.getLogger("subd.service.signals")

EXIT_OK = 0
EXIT_FORCED = 130

T = TypeVar("T")


async def _maybe_await(value) -> None:
    if inspect.isawaitable(value):
        await value


class SignalController:
    def __init__(
        self,
        drain: Callable[[], Awaitable[None]],
        reload: Callable[[], Awaitable[object] | object] | None = None,
        drain_timeout_s: float = 5.0,
        notifier: Notifier | None = None,
    ) -> None:
        self._drain = drain
        self._reload = reload
        self.drain_timeout_s = drain_timeout_s
        self._notifier = notifier or Notifier(env={})
        self._stop_requested = asyncio.Event()
        self._forced = asyncio.Event()
        self._reload_task: asyncio.Task | None = None
        self._reload_again = False
        self._installed: list[int] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stop_reason = ""

    # -- installation ---------------------------------------------------------------------------

    def install(self) -> None:
        """Route SIGTERM, SIGINT and SIGHUP to this controller (call from the running loop)."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_signal_handler(signal.SIGTERM, self._on_signal, signal.SIGTERM)
        self._loop.add_signal_handler(signal.SIGINT, self._on_signal, signal.SIGINT)
        self._installed = [signal.SIGTERM, signal.SIGINT]
        if self._reload is not None:
            self._loop.add_signal_handler(signal.SIGHUP, self._on_signal, signal.SIGHUP)
            self._installed.append(signal.SIGHUP)

    def uninstall(self) -> None:
        if self._loop is None:
            return
        for signum in self._installed:
            self._loop.remove_signal_handler(signum)
        self._installed = []

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGHUP:
            self.request_reload()
        elif not self._stop_requested.is_set():
            self.request_stop(f"{name} received")
        elif signum == signal.SIGINT:
            log.warning("second SIGINT: stopping now without finishing the drain")
            self._forced.set()
        else:
            log.info("%s received again while draining; still draining", name)

    # -- requests (also usable without signals) ------------------------------------------------

    def request_stop(self, reason: str) -> None:
        if not self._stop_requested.is_set():
            self.stop_reason = reason
            log.info("%s: draining (up to %.1f s)", reason, self.drain_timeout_s)
            self._stop_requested.set()

    def force(self) -> None:
        self._forced.set()

    @property
    def stopping(self) -> bool:
        return self._stop_requested.is_set()

    def request_reload(self) -> None:
        if self._reload is None or self.stopping:
            return
        if self._reload_task is not None and not self._reload_task.done():
            self._reload_again = True
            return
        self._reload_task = start_task(self._run_reloads(), "reload")

    async def _run_reloads(self) -> None:
        while True:
            self._reload_again = False
            self._notifier.reloading()
            try:
                await _maybe_await(self._reload())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a failed reload must not end the daemon
                log.error("reload failed: %s: %s; keeping the previous configuration",
                          type(exc).__name__, exc)
            finally:
                self._notifier.ready()
            if not self._reload_again:
                return

    # -- the main wait --------------------------------------------------------------------------

    async def wait(self) -> int:
        """Wait for a stop request, drain, and return the process exit code."""
        await self._stop_requested.wait()
        self._notifier.stopping(f"stopping: {self.stop_reason}")
        if self._reload_task is not None and not self._reload_task.done():
            self._reload_task.cancel()
        drain = start_task(self._drain(), "drain")
        forced = start_task(self._forced.wait(), "forced-stop")
        try:
            done, _ = await asyncio.wait(
                {drain, forced}, timeout=self.drain_timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            forced.cancel()
        if drain in done:
            if drain.exception() is not None:
                exc = drain.exception()
                log.error("drain failed: %s: %s", type(exc).__name__, exc)
            else:
                log.info("drained; exiting")
            return EXIT_OK
        drain.cancel()
        try:
            await drain
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # noqa: BLE001 - we are leaving anyway; say why, once
            log.error("drain failed while cancelled: %s: %s", type(exc).__name__, exc)
        if self._forced.is_set():
            return EXIT_FORCED
        log.warning("drain did not finish within %.1f s; exiting anyway", self.drain_timeout_s)
        return EXIT_OK


class Reloader(Generic[T]):
    """Load a configuration, and apply it only if it loaded: a bad file changes nothing.

    ``load()`` reads and validates (raising :class:`~subd.errors.UserError` — ConfigError — or
    OSError with a one-line reason); ``apply(new)`` switches the running daemon over.
    """

    def __init__(
        self,
        current: T,
        load: Callable[[], T],
        apply: Callable[[T], Awaitable[object] | object],
        on_result: Callable[[str], None] | None = None,
    ) -> None:
        self.current = current
        self._load = load
        self._apply = apply
        self._on_result = on_result  # "ok" | "invalid" | "apply_failed", e.g. for metrics

    async def __call__(self) -> bool:
        try:
            # in a thread: reading and checking a configuration took 30 ms (sink plugins are
            # looked up in every installed package's metadata), and on the event loop every
            # channel published a tick that much late at each SIGHUP
            new = await asyncio.to_thread(self._load)
        except (UserError, OSError, ValueError) as exc:
            log.error("reload rejected, keeping the previous configuration: %s", exc)
            self._report("invalid")
            return False
        try:
            await _maybe_await(self._apply(new))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - keep running on the old configuration
            log.error("reload could not be applied, keeping the previous configuration: %s: %s",
                      type(exc).__name__, exc)
            self._report("apply_failed")
            return False
        self.current = new
        log.info("configuration reloaded")
        self._report("ok")
        return True

    def _report(self, result: str) -> None:
        if self._on_result is not None:
            self._on_result(result)
