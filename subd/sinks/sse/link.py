"""The SSE sink's end of one fan-out worker process (see :mod:`subd.sinks.sse.worker`).

Sends are non-blocking and ordered: what the worker has not taken yet waits in a bounded
backlog, flushed when the socket is writable, so the publisher never blocks on a worker. A
worker that exits, or falls ``MAX_BACKLOG_BYTES`` behind, is declared failed: the sink then
disconnects its clients, which reconnect with ``Last-Event-ID`` and lose nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable

from subd.sinks.sse import worker as w

log = logging.getLogger(__name__)
MAX_BACKLOG_BYTES = 8 << 20
_RUN_BY_PATH = ("import runpy, sys; sys.argv.pop(0); "
                "runpy.run_path(sys.argv[0], run_name='__main__')")


class WorkerLink:
    def __init__(self, *, client_buffer_bytes: int, drop_after_ms: int, heartbeat_ms: int,
                 on_gone: Callable[[int, bool], None],
                 on_fail: Callable[[WorkerLink], None], priority: int = 0) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        args = (child.fileno(), client_buffer_bytes, drop_after_ms, heartbeat_ms, priority)
        # The worker inherits this thread's scheduling policy (SCHED_FIFO where granted) and
        # sets its own first thing: SCHED_FIFO ``priority``, or normal scheduling if 0 (or not
        # allowed) (worker.main). It needs the standard library only: run by path,
        # isolated (-I: no cwd on sys.path), so it starts fast and small, without the
        # package's imports (numpy).
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _RUN_BY_PATH, w.__file__, *map(str, args)],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL)
        child.close()
        parent.setblocking(False)
        self.sock = parent
        self._on_gone = on_gone
        self._on_fail = on_fail
        self._backlog: deque[tuple[bytes, int | None]] = deque()
        self._backlog_bytes = 0
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(parent.fileno(), self._readable)
        self.alive = True
        self.ready: asyncio.Future[None] = self._loop.create_future()  # its first report
        self.n_clients = 0  # clients handed to this worker and not gone
        self.n_skipped = 0  # as last reported by the worker
        self.buffered_bytes = 0
        self.n_ready = 0  # clients waiting for a full resync
        self.n_fast = 0  # clients in its latest tight loop (+ those handed over since)
        self.send_ns = 0  # that loop's time per client (0: not measured yet)

    # -- parent -> worker -----------------------------------------------------------------

    def add(self, client_id: int, fd: int, now_ns: int) -> None:
        """Hand over a client socket; ``fd`` is a duplicate that this link closes once sent."""
        self._send(w.ADD + w.ID_NOW.pack(client_id, now_ns), fd)

    def tick(self, now_ns: int, framed: bytes, release_ns: int = 0) -> None:
        """Tick event for the worker's clients, written at ``release_ns`` (time.monotonic_ns;
        0: as soon as it arrives)."""
        for msg in w.split_message(w.TICK, w.TICK_HEAD.pack(now_ns, release_ns), framed):
            self._send(msg)

    def full(self, framed: bytes) -> None:
        for msg in w.split_message(w.FULL, b"", framed):
            self._send(msg)

    def heartbeat(self, now_ns: int) -> None:
        self._send(w.HEARTBEAT + w.NOW.pack(now_ns))

    def remove(self, client_id: int) -> None:
        self._send(w.REMOVE + w.NOW.pack(client_id))

    def _send(self, msg: bytes, fd: int | None = None) -> None:
        if not self.alive:
            if fd is not None:
                os.close(fd)
            return
        if not self._backlog and self._send_now(msg, fd):
            return
        if not self._backlog:
            self._loop.add_writer(self.sock.fileno(), self._writable)
        self._backlog.append((msg, fd))
        self._backlog_bytes += len(msg)
        if self._backlog_bytes > MAX_BACKLOG_BYTES:
            self._fail(f"fell {self._backlog_bytes} bytes behind")

    def _send_now(self, msg: bytes, fd: int | None) -> bool:
        """True once sent (or failed: the link is dead); False if the socket is full."""
        try:
            if fd is None:
                self.sock.send(msg)
            else:
                socket.send_fds(self.sock, [msg], [fd])
                os.close(fd)
        except BlockingIOError:
            return False
        except OSError as exc:
            if fd is not None:
                os.close(fd)
            self._fail(f"control socket: {exc}")
        return True

    def _writable(self) -> None:
        while self._backlog and self.alive:
            msg, fd = self._backlog[0]
            if not self._send_now(msg, fd):
                return
            self._backlog.popleft()
            self._backlog_bytes -= len(msg)
        if self.alive:
            self._loop.remove_writer(self.sock.fileno())

    # -- worker -> parent -----------------------------------------------------------------

    def _readable(self) -> None:
        while self.alive:
            try:
                msg = self.sock.recv(256)
            except BlockingIOError:
                return
            except OSError as exc:
                self._fail(f"control socket: {exc}")
                return
            if not msg:
                self._fail(f"exited with status {self.proc.poll()}")
                return
            if not self.ready.done():
                self.ready.set_result(None)
            if msg[:1] == w.GONE:
                _, client_id, dropped = w.GONE_MSG.unpack(msg)
                self._on_gone(client_id, bool(dropped))
            elif msg[:1] == w.STATS:
                (_, self.n_skipped, self.buffered_bytes, self.n_ready, self.n_fast,
                 self.send_ns) = w.STATS_MSG.unpack(msg)

    # -- lifecycle --------------------------------------------------------------------------

    def _fail(self, why: str) -> None:
        if not self.alive:
            return
        log.error("SSE fan-out worker %d failed (%s): its clients are disconnected",
                  self.proc.pid, why)
        self._detach()
        self.proc.kill()
        self._on_fail(self)

    def _detach(self) -> None:
        self.alive = False
        if not self.ready.done():
            self.ready.set_exception(ConnectionError("fan-out worker failed"))
            self.ready.exception()  # retrieved: start() reports the failure itself
        self._loop.remove_reader(self.sock.fileno())
        self._loop.remove_writer(self.sock.fileno())
        for _, fd in self._backlog:
            if fd is not None:
                os.close(fd)
        self._backlog.clear()
        self._backlog_bytes = 0
        self.sock.close()

    async def wait_ready(self, timeout_s: float = 10.0) -> bool:
        try:
            await asyncio.wait_for(asyncio.shield(self.ready), timeout_s)
        except (TimeoutError, ConnectionError):
            self._fail("did not start")
        return self.alive

    async def close(self, timeout_s: float = 2.0) -> None:
        """Ask the worker to quit after what it was sent; kill it if it does not."""
        if self.alive:
            deadline = self._loop.time() + timeout_s
            self._send(w.QUIT)
            while self._backlog and self.alive and self._loop.time() < deadline:
                await asyncio.sleep(0.01)
            if self.alive:
                self._detach()
        try:
            await asyncio.wait_for(asyncio.to_thread(self.proc.wait), timeout_s)
        except TimeoutError:
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait)
