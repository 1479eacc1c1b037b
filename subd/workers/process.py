"""Stage workers: where a stage host runs, and how the event loop talks to it.

:class:`ProcessWorker` runs a host in a spawned process (its own GIL, normal scheduling
priority) and talks over a pipe; the event loop watches the pipe with ``add_reader`` so waiting
costs no thread and no polling. :class:`InlineWorker` runs a host in the event loop itself:
for hosts with no model work (the pass-through tagger) and for fake-clock tests, where a
``delay_fn`` says how long each request "takes" on the injected clock.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from subd.clock import Clock
from subd.errors import ModelError, UserError
from subd.workers.hosts import FactorySpec

log = logging.getLogger("subd.workers.process")
# Freed heap goes back to the OS at most this often. Every trim costs the requests after it
# their page faults: the recogniser touched ~70 MB of returned heap again on its next update
# (subd run, 4 file channels sharing it, trim after every answer: 17.6k minor faults and 36 ms
# of system time an update, CPU p50 252 ms; without: 3 faults, 214 ms). Once in 10 s that is
# one update in ~25, and the heap still cannot wander for long.
TRIM_EVERY_NS = 10_000_000_000


def _heap_trimmer(every_ns: int = TRIM_EVERY_NS, trim: Callable[[int], Any] | None = None,
                  now_ns: Callable[[], int] = time.monotonic_ns) -> Callable[[], None]:
    """glibc's ``malloc_trim(0)`` (or ``trim``), at most every ``every_ns``; a no-op where
    there is none. Called after each answer is sent.

    The recogniser's tensors change size with the window (the encoder span, the decoded
    tokens), and glibc keeps freed heap for reuse that a later, differently sized tensor
    cannot always use: a stage process's RSS wandered 605-640 MB over a 30 min soak with a
    trim after every request, and grew 470 -> 730 MB over 120 windows of random lengths
    without. A trim after every request cost each update its page faults (TRIM_EVERY_NS)."""
    if trim is None:
        try:
            import ctypes

            trim = ctypes.CDLL("libc.so.6").malloc_trim
            trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            return lambda: None
    last_ns = -every_ns  # the first answer returns what loading the model left freed

    def trim_heap() -> None:
        nonlocal last_ns
        if now_ns() - last_ns >= every_ns:
            trim(0)
            last_ns = now_ns()

    return trim_heap


_IN_STAGE_PROCESS = False  # set in a worker process (the daemon's own heap is GcPacer's)


# hosts let go since the last full pass: their few reference cycles (62 objects for a used tag
# host) stay frozen until then; the rest of a host is freed at once, by reference counting
_owed_hosts = 0
OWED_HOSTS_LIMIT = 64


def settle_heap(dropped: bool = False, collect: bool = False, idle: bool = False) -> None:
    """In a stage process, after long-lived objects were built (the model, a channel's host):
    freeze what is alive, so that CPython's full collections no longer walk it. The tagger
    process holds ~170k tracked objects with 4 channels attached, and a full pass over them
    took 80 ms on an idle core (286 ms under load, subd run with 4 file channels): the tag pass
    it fell into overran 2 ticks, and the tick fell back. ``collect``: collect first (the
    model's load, before any channel is served; a full pass while channels are served would
    be the stall this avoids, so an attached host is frozen as it is, with what little
    garbage is young then). ``dropped``: a host was let go. Reference counting frees it, frozen
    or not, except its reference cycles; those wait for a full pass (everything unfrozen,
    collected, frozen again), run when the process serves no channel (``idle``) or once
    ``OWED_HOSTS_LIMIT`` hosts are owed. Running it at every channel that left stalled the
    channels that stayed: 105-125 ms here on an idle core, and with 4 channels ending within a
    second (subd bench daemon), degraded ticks and a fallback on the last one. Elsewhere (an
    inline worker in the daemon's own process, whose heap GcPacer paces) it does nothing."""
    global _owed_hosts
    if not _IN_STAGE_PROCESS:
        return
    _owed_hosts += dropped
    if collect or (_owed_hosts and (idle or _owed_hosts >= OWED_HOSTS_LIMIT)):
        gc.unfreeze()
        gc.collect()
        _owed_hosts = 0
    gc.freeze()


class WorkerError(RuntimeError):
    """The stage host raised, or its process died."""


class WorkerDied(WorkerError):
    """The stage process is gone (it exited, was killed, or its pipe broke): a fresh one can
    take over, unlike a host that raised on one request."""


def _worker_main(conn: Connection, host_spec: FactorySpec, nice: int) -> None:
    """Entry point of a worker process."""
    # The daemon decides when workers stop (it closes their pipe). A signal sent to the whole
    # process group (Ctrl-C, `timeout`, `kill -- -PGID`) must not kill them under a draining
    # daemon, which would respawn them only to shut down: `subd run` under `timeout` logged two
    # stage failures and respawns during its drain.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from subd.clock import drop_realtime_priority

    drop_realtime_priority()
    if nice:
        try:
            os.nice(nice)
        except OSError:
            pass
    try:
        host = host_spec.build()
    except UserError as exc:
        conn.send(("error", str(exc)))
        return
    except Exception as exc:  # noqa: BLE001 - reported to the parent as one line
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    global _IN_STAGE_PROCESS
    _IN_STAGE_PROCESS = True
    settle_heap(collect=True)  # the model, loaded once
    conn.send(("ready", os.getpid()))
    trim_heap = _heap_trimmer()
    try:
        while True:
            try:
                request = conn.recv()
            except (EOFError, OSError):
                break  # the daemon went away (or is shutting down): nothing left to answer
            if request is None:
                break
            try:
                answer = ("ok", host.handle(request))
            except Exception as exc:  # noqa: BLE001 - one line back to the parent
                answer = ("err", f"{type(exc).__name__}: {exc}")
            try:
                conn.send(answer)
            except OSError:
                break  # the daemon closed its end while we worked: shutting down
            trim_heap()
    finally:
        close = getattr(host, "close", None)
        if close:
            close()
        try:
            conn.close()
        except OSError:
            pass


# What the fork server imports once, so that a stage process forked from it starts with it:
# ``import torch`` alone took 2-2.5 s of every (re)spawn on the loaded 2-core machine.
FORKSERVER_PRELOAD = ("torch",)


def _context(start_method: str) -> mp.context.BaseContext:
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # read when the server starts (at the first worker's start, a fresh interpreter with
        # the daemon's environment then); it runs nothing but these imports, so a process
        # forked from it inherits no thread and no torch thread pool
        ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return ctx


def _launch(proc: mp.process.BaseProcess, child: Connection) -> None:
    try:
        proc.start()
    finally:
        child.close()  # the child has its own copy now (or never will)


class ProcessWorker:
    """A stage host in its own process; one request in flight at a time.

    ``start_method`` "forkserver" (the default): processes are forked from multiprocessing's
    fork server, a clean process started once (the first worker's start) that has imported
    ``FORKSERVER_PRELOAD``; a respawn then skips ``import torch``. "spawn": a fresh
    interpreter each time."""

    def __init__(self, name: str, host_spec: FactorySpec, *, start_method: str = "forkserver",
                 nice: int = 0) -> None:
        self.name = name
        self._spec = host_spec
        self._ctx = _context(start_method)
        self._nice = nice
        self._conn: Connection | None = None
        self._proc: mp.process.BaseProcess | None = None
        self._pending: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dead = False
        self._ready = False
        self._launching: asyncio.Future | None = None
        self.on_exit: Callable[[], None] | None = None  # called when a ready process dies
        self.busy_since_ns: int | None = None

    async def start(self, timeout_s: float = 300.0) -> None:
        """Spawn the process and wait until its host is built; after :meth:`close` it can be
        started again (a respawn)."""
        self._loop = asyncio.get_running_loop()
        self._dead = False
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=_worker_main, args=(child, self._spec, self._nice),
                                 name=f"subd-{self.name}", daemon=True)
        self._proc = proc
        self._conn = parent
        # in a thread: the fork server's first start waits for its imports (seconds, and again
        # if the server has to be started anew), which must not stall the event loop; a start
        # that is cancelled still forks, and close() waits for it
        self._launching = self._loop.run_in_executor(None, _launch, proc, child)
        await asyncio.shield(self._launching)
        self._pending = self._loop.create_future()
        self._loop.add_reader(parent.fileno(), self._on_readable)
        try:
            kind, payload = await asyncio.wait_for(self._pending, timeout_s)
        except TimeoutError:
            await self.close()
            raise ModelError(f"{self.name} worker did not start within {timeout_s:.0f} s") from None
        finally:
            self._pending = None
        if kind == "error":
            await self.close()
            raise ModelError(f"{self.name} worker: {payload}")
        self._ready = True
        log.debug("%s worker ready (pid %s)", self.name, payload)

    def _on_readable(self) -> None:
        assert self._conn is not None
        try:
            message = self._conn.recv()
        except (EOFError, OSError):
            self._dead = True
            self._detach()
            if self._pending is not None and not self._pending.done():
                self._pending.set_exception(WorkerDied(f"{self.name} worker died "
                                                       f"({self.exit_text()})"))
            if self._ready and self.on_exit is not None:
                self._ready = False
                self.on_exit()  # a supervisor respawns it (subd.service.stages)
            return
        fut, self._pending = self._pending, None
        if fut is None or fut.done():
            return
        kind, payload = message
        if kind in ("ok", "ready", "error"):
            fut.set_result(payload if kind == "ok" else (kind, payload))
        else:
            fut.set_exception(WorkerError(f"{self.name}: {payload}"))

    def _detach(self) -> None:
        if self._conn is not None and self._loop is not None:
            try:
                self._loop.remove_reader(self._conn.fileno())
            except (OSError, ValueError):
                pass

    def twin(self) -> ProcessWorker:
        """An unstarted worker for the same host (a spare, kept loaded to take over)."""
        return ProcessWorker(self.name, self._spec, start_method=self._ctx.get_start_method(),
                             nice=self._nice)

    @property
    def alive(self) -> bool:
        return self._ready and not self._dead

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def exit_text(self) -> str:
        """How the process ended, as far as is known now ("killed by SIGKILL", "exit 1")."""
        proc = self._proc
        if proc is None:
            return "not started"
        code = proc.exitcode  # a non-blocking poll: never stall the event loop on a reap
        if code is None:
            return "pipe closed"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit {code}"

    def kill(self) -> None:
        """SIGKILL the process (a hung stage: it may be stopped or spinning in native code, so
        nothing gentler is sure to work). Its pipe then closes and the caller sees it die."""
        if self._proc is not None and self._proc.pid is not None:
            try:
                os.kill(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def call(self, request: Any, now_ns: int = 0) -> Any:
        if self._conn is None or self._dead:
            raise WorkerDied(f"{self.name} worker is not running ({self.exit_text()})")
        if self._pending is not None and not self._pending.done():
            raise WorkerError(f"{self.name} worker is busy")
        assert self._loop is not None
        fut = self._loop.create_future()
        self._pending = fut
        self.busy_since_ns = now_ns
        try:
            try:
                self._conn.send(request)
            except OSError as exc:  # the process is gone; its EOF may not have been read yet
                self._detach()
                raise WorkerDied(f"{self.name} worker died ({exc})") from None
            return await fut
        finally:
            self.busy_since_ns = None

    async def close(self, timeout_s: float = 5.0) -> None:
        self._ready = False  # a process we stop is not a death
        if self._launching is not None:  # a start that was cancelled: let it finish first
            await asyncio.wait([self._launching])
            self._launching = None
        if self._conn is not None:
            self._detach()
            try:
                self._conn.send(None)
            except (OSError, ValueError):
                pass
        if self._proc is not None and self._proc.pid is None:
            self._proc = None  # it never started
        if self._proc is not None:
            proc = self._proc
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, proc.join, timeout_s)
            if proc.is_alive():  # hung or stopped (SIGSTOP); workers ignore SIGTERM by design
                self.kill()
                await loop.run_in_executor(None, proc.join, 2.0)
            self._proc = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class InlineWorker:
    """A stage host in the event loop. ``delay_fn(request)`` simulates its duration on
    ``clock`` (tests); without it the host runs synchronously and returns at once."""

    def __init__(self, name: str, host: Any, clock: Clock,
                 delay_fn: Callable[[Any], int] | None = None) -> None:
        self.name = name
        self.host = host
        self.clock = clock
        self.delay_fn = delay_fn
        self.busy_since_ns: int | None = None

    @property
    def update_costs(self) -> Any:
        """A recogniser host's update costs, measured as it was built (subd.recognise.warmup)."""
        return getattr(self.host, "update_costs", None)

    async def start(self, timeout_s: float = 0.0) -> None:
        return None

    async def call(self, request: Any, now_ns: int = 0) -> Any:
        if self.busy_since_ns is not None:
            raise WorkerError(f"{self.name} worker is busy")
        self.busy_since_ns = now_ns
        try:
            result = self.host.handle(request)
            if self.delay_fn is not None:
                delay_ns = int(self.delay_fn(request))
                await self.clock.sleep_until(self.clock.now_ns() + delay_ns, precise=False)
                result = _with_duration(result, delay_ns)
            return result
        finally:
            self.busy_since_ns = None

    async def close(self, timeout_s: float = 0.0) -> None:
        close = getattr(self.host, "close", None)
        if close:
            close()


def _with_duration(result: Any, duration_ns: int) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(result) and hasattr(result, "duration_ns"):
        return dataclasses.replace(result, duration_ns=duration_ns)
    return result
