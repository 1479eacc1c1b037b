"""SSE fan-out worker process: writes each tick's event to the client sockets handed to it.

Why a process: on loopback one ``send`` costs ~4 us of kernel time (the receiver's TCP path
runs inside it): 500 readers take ~2 ms a tick on one core. Threads do not spread that (the
GIL; two sending threads were slower than one): worker processes split the clients.

Division of labour: the SSE sink (the parent, :mod:`subd.sinks.sse.link`) keeps HTTP, CORS,
replay and the encoding of every event; a worker only writes. Once a client's headers and
catch-up are in the kernel, the parent passes its socket (SCM_RIGHTS) to a worker and stops
writing to it. The worker then applies the same policy as the in-process fan-out: clients that
keep up are written first, in one loop; a client with more than ``client_buffer_bytes`` unsent
is skipped forward (counted) and gets a full resync when it reads again; one stalled for
``drop_after_ms`` is reset. Times come from the parent's clock inside each message, so the
policy is the same under a test's fake clock.

Waking a sleeping process takes 0.2-0.4 ms on the development VM, more than half the fan-out
budget. So the parent sends tick k ahead, at its
look-ahead (``SSESink.prepare``, T(k) - 4 ms), with its release time T(k) on the monotonic
clock: the worker sleeps until ``SPIN_EARLY_NS`` before it, polls from there, and writes at
T(k) itself, at the same moment as the parent writes its own share. A tick sent without a
release time (a plain ``publish``) is written as soon as it arrives.

Messages on a SOCK_SEQPACKET pair, first byte the kind; a payload longer than ``PART_BYTES``
is split, every part but the last sent as ``+`` messages::

    parent -> worker  A add(id, now) + the socket   T tick(now, release) + chunk-framed delta
                      F full: chunk-framed resync   H heartbeat(now)   R remove(id)   Q quit
    worker -> parent  G gone(id, dropped)
                      S stats(n_skipped, buffered_bytes, n_ready, n_fast, send_ns)

``n_fast`` is how many clients the latest tick's tight loop wrote to and ``send_ns`` the
loop's time per client (a moving average): the parent balances its own share against the
workers' with them (``SSESink._rebalance``).
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable

PART_BYTES = 65536
HEARTBEAT_FRAMED = b"6\r\n: hb\n\n\r\n"  # sse.chunk(sse.HEARTBEAT)
NS_PER_MS = 1_000_000
SPIN_EARLY_NS = 1_000_000  # a held tick: sleep until this long before its release, then poll
MORE = b"+"
ADD, TICK, FULL, HEARTBEAT, REMOVE, QUIT = b"A", b"T", b"F", b"H", b"R", b"Q"
GONE, STATS = b"G", b"S"
ID_NOW = struct.Struct("<qq")  # client id, now_ns
NOW = struct.Struct("<q")
TICK_HEAD = struct.Struct("<qq")  # parent's now_ns, release time on time.monotonic_ns (0: now)
GONE_MSG = struct.Struct("<cqB")  # kind, client id, 1 if dropped for not reading
# kind, n_skipped, buffered_bytes, n_ready, n_fast, send_ns (see FanoutWorker._write_tick)
STATS_MSG = struct.Struct("<cqqqqq")
SEND_NS_QUANTUM = 100  # send_ns is reported in these steps, so a report is not sent every tick


def split_message(kind: bytes, head: bytes, payload: bytes) -> list[bytes]:
    """One logical message as SEQPACKET datagrams: ``+`` parts, then kind + head + last part."""
    parts = [MORE + payload[i : i + PART_BYTES]
             for i in range(0, max(0, len(payload) - PART_BYTES), PART_BYTES)]
    tail = payload[len(parts) * PART_BYTES :]
    return [*parts, kind + head + tail]


def reset_on_close(sock: socket.socket) -> None:
    """Make the socket's last close a reset (SO_LINGER 0): the client learns at once, and the
    bytes it never read are freed. A plain close of a socket whose peer does not read queues
    the FIN behind them, and the kernel keeps both for minutes."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass


def moving_average(average_ns: float, loop_ns: int, n: int, n_short: int = 0, *,
                   min_n: int = 8, weight: float = 1 / 16) -> float:
    """The fan-out loop's time per client, averaged over ticks. Not counted: a loop of fewer
    than ``min_n`` clients (its fixed costs would pass for per-client ones), or one where more
    than a tenth of the writes were short (full sockets cost another path). The first loop
    counted sets the average."""
    if n < min_n or n_short * 10 > n:
        return average_ns
    per_client = loop_ns / n
    return per_client if average_ns <= 0 else average_ns + weight * (per_client - average_ns)


class _Conn:
    __slots__ = ("id", "sock", "send", "pending", "stalled_ns", "resync", "last_write_ns",
                 "watched")

    def __init__(self, client_id: int, sock: socket.socket, now_ns: int) -> None:
        self.id = client_id
        self.sock = sock
        self.send = sock.send
        self.pending = bytearray()  # bytes the kernel did not take yet
        self.stalled_ns: int | None = None
        self.resync = False
        self.last_write_ns = now_ns
        self.watched = False  # registered for EVENT_WRITE while ``pending`` drains


class FanoutWorker:
    """The worker's loop: one selector over the control socket and draining clients."""

    def __init__(self, ctl: socket.socket, client_buffer_bytes: int, drop_after_ms: int,
                 heartbeat_ms: int) -> None:
        self.ctl = ctl
        self.limit = client_buffer_bytes
        self.drop_after_ns = drop_after_ms * NS_PER_MS
        self.heartbeat_ns = heartbeat_ms * NS_PER_MS
        self.sel = selectors.DefaultSelector()
        self.sel.register(ctl, selectors.EVENT_READ, None)
        self.conns: dict[int, _Conn] = {}  # insertion order = write order
        self.n_skipped = 0
        self._rx = bytearray(PART_BYTES + 64)
        self._parts = bytearray()
        self._now = 0  # the parent's clock at the latest tick
        self._held: tuple[int, bytes] | None = None  # (release_ns, tick body) not written yet
        self._reported: tuple[int, ...] | None = None
        self.n_fast = 0  # clients written in the latest tick's tight loop
        self.send_ns = 0.0  # that loop's time per client, moving average (0: not measured)
        self._handlers: dict[bytes, Callable[[bytes, list[int]], None]] = {
            ADD: self._add, TICK: self._tick, FULL: self._full_state,
            HEARTBEAT: self._heartbeat, REMOVE: self._remove_msg,
        }

    def run(self) -> None:
        self._report()  # the first report says: ready
        while True:
            for key, _ in self.sel.select(self._timeout_s()):
                if key.data is None:
                    if not self._read_control():
                        return
                else:
                    self._flush(key.data)
            if self._held is not None and \
                    time.monotonic_ns() >= self._held[0] - SPIN_EARLY_NS:
                self._release()

    def _timeout_s(self) -> float | None:
        """Block until a message comes; with a tick held, until its spin window opens.

        epoll sleeps in whole milliseconds and ``selectors`` rounds a timeout up: asked for
        0.3 ms it sleeps 1 ms, and the worker woke after the release time (measured: p99
        +0.07 ms, max +0.19 ms late, with the tick sent 1-2 ms ahead). So it sleeps only the
        whole milliseconds that fit before the spin window and polls the rest."""
        if self._held is None:
            return None
        wait_ns = self._held[0] - SPIN_EARLY_NS - time.monotonic_ns()
        return max(0, wait_ns // NS_PER_MS) / 1000

    def _release(self) -> None:
        """Spin to the held tick's release time, then write it."""
        assert self._held is not None
        release_ns, body = self._held
        self._held = None
        while time.monotonic_ns() < release_ns:
            pass
        self._write_tick(body)

    # -- control messages ---------------------------------------------------------------

    def _read_control(self) -> bool:
        """Handle every queued message; False when the parent is gone or said quit."""
        view = memoryview(self._rx)
        while True:
            try:
                n, anc, _flags, _addr = self.ctl.recvmsg_into(
                    [view], socket.CMSG_SPACE(4 * 4))
            except BlockingIOError:
                self._report()
                return True
            except OSError:
                return False
            fds = [fd for level, kind, data in anc
                   if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                   for fd in struct.unpack(f"{len(data) // 4}i", data[: len(data) // 4 * 4])]
            if n == 0 or view[:1] == QUIT:
                if self._held is not None:  # the last tick still goes out
                    self._release()
                return False
            kind = bytes(view[:1])
            if kind == MORE:
                self._parts += view[1:n]
                continue
            body = bytes(self._parts) + bytes(view[1:n]) if self._parts else bytes(view[1:n])
            self._parts.clear()
            self._handlers[kind](body, fds)

    def _add(self, body: bytes, fds: list[int]) -> None:
        client_id, now = ID_NOW.unpack(body)
        for fd in fds[1:]:
            os.close(fd)
        if not fds:
            self._send_gone(client_id, dropped=False)
            return
        sock = socket.socket(fileno=fds[0])
        sock.setblocking(False)
        self.conns[client_id] = _Conn(client_id, sock, now)

    def _remove_msg(self, body: bytes, fds: list[int]) -> None:
        (client_id,) = NOW.unpack(body)
        conn = self.conns.get(client_id)
        if conn is not None:
            self._close(conn, abort=False)

    def _tick(self, body: bytes, fds: list[int]) -> None:
        if self._held is not None:  # a newer tick came before the held one's time: order first
            self._release()
        (_, release_ns) = TICK_HEAD.unpack_from(body)
        if release_ns > time.monotonic_ns():
            self._held = (release_ns, body)
        else:
            self._write_tick(body)

    def _write_tick(self, body: bytes) -> None:
        (now, _) = TICK_HEAD.unpack_from(body)
        framed = body[TICK_HEAD.size :]
        self._now = now
        size = len(framed)
        lagging, partial, failed = [], [], []
        t0 = time.monotonic_ns()
        # Clients that keep up first, in one tight loop: this loop is the fan-out's latency.
        for conn in self.conns.values():
            if conn.pending or conn.resync or conn.stalled_ns is not None:
                lagging.append(conn)
                continue
            try:
                n = conn.send(framed)
            except BlockingIOError:
                n = 0
            except OSError:  # reset or closed by the peer
                failed.append(conn)
                continue
            conn.last_write_ns = now
            if n != size:
                partial.append((conn, n))
        self.n_fast = len(self.conns) - len(lagging) - len(failed)
        self.send_ns = moving_average(self.send_ns, time.monotonic_ns() - t0, self.n_fast,
                                      len(partial))
        for conn, n in partial:
            self._keep(conn, framed[n:])
        for conn in failed:
            self._close(conn, abort=True)
            self._send_gone(conn.id, dropped=False)
        limit = self.limit
        for conn in lagging:
            if len(conn.pending) > limit:
                self._stalled(conn, now)
            elif conn.resync:
                conn.stalled_ns = None
                self.n_skipped += 1  # this delta is dropped; the full event follows (F)
            else:
                conn.stalled_ns = None
                self._write(conn, framed, now)

    def _full_state(self, body: bytes, fds: list[int]) -> None:
        # The resync for the latest tick, sent only while some client is ready for one.
        if self._held is not None:  # its tick is written first: the order stays tick, resync
            self._release()
        for conn in list(self.conns.values()):
            if conn.resync and len(conn.pending) <= self.limit:
                conn.resync = False
                self._write(conn, body, self._now)

    def _heartbeat(self, body: bytes, fds: list[int]) -> None:
        (now,) = NOW.unpack(body)
        for conn in list(self.conns.values()):
            if now - conn.last_write_ns < self.heartbeat_ns:
                continue
            if len(conn.pending) > self.limit:
                self._stalled(conn, now)
            else:
                self._write(conn, HEARTBEAT_FRAMED, now)

    # -- writing ------------------------------------------------------------------------

    def _stalled(self, conn: _Conn, now: int) -> None:
        self.n_skipped += 1
        if conn.stalled_ns is None:
            conn.stalled_ns = now
            conn.resync = True
        elif now - conn.stalled_ns > self.drop_after_ns:
            self._close(conn, abort=True)
            self._send_gone(conn.id, dropped=True)

    def _write(self, conn: _Conn, data: bytes, now: int) -> None:
        conn.last_write_ns = now
        if conn.pending:
            conn.pending += data
            return
        try:
            n = conn.sock.send(data)
        except BlockingIOError:
            n = 0
        except OSError:  # reset or closed by the peer
            self._close(conn, abort=True)
            self._send_gone(conn.id, dropped=False)
            return
        if n < len(data):
            self._keep(conn, data[n:])

    def _keep(self, conn: _Conn, rest: bytes) -> None:
        """Bytes the kernel did not take: kept, and sent as the socket drains."""
        conn.pending += rest
        if not conn.watched:
            conn.watched = True
            self.sel.register(conn.sock, selectors.EVENT_WRITE, conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            n = conn.sock.send(conn.pending)
        except BlockingIOError:
            return
        except OSError:
            self._close(conn, abort=True)
            self._send_gone(conn.id, dropped=False)
            return
        del conn.pending[:n]
        if not conn.pending:
            self.sel.unregister(conn.sock)
            conn.watched = False

    def _close(self, conn: _Conn, *, abort: bool) -> None:
        self.conns.pop(conn.id, None)
        if conn.watched:
            self.sel.unregister(conn.sock)
            conn.watched = False
        conn.pending = bytearray()  # unsent bytes are discarded: memory is freed now
        if abort:
            reset_on_close(conn.sock)
            try:  # this is a duplicate: the parent's close, the last one, sends the reset
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        conn.sock.close()

    # -- reports to the parent -------------------------------------------------------------

    def _send_gone(self, client_id: int, *, dropped: bool) -> None:
        self._send(GONE_MSG.pack(GONE, client_id, int(dropped)))

    def _report(self) -> None:
        ready = sum(1 for c in self.conns.values() if c.resync and len(c.pending) <= self.limit)
        stats = (self.n_skipped, sum(len(c.pending) for c in self.conns.values()), ready,
                 self.n_fast, round(self.send_ns / SEND_NS_QUANTUM) * SEND_NS_QUANTUM)
        if stats != self._reported:
            self._reported = stats
            self._send(STATS_MSG.pack(STATS, *stats))

    def _send(self, msg: bytes) -> None:
        try:
            self.ctl.send(msg)
        except BlockingIOError:  # the parent is not reading: a later report replaces this one
            self._reported = None
        except OSError:
            pass


def set_priority(priority: int) -> None:
    """SCHED_FIFO ``priority``, or normal scheduling for 0 (or where FIFO is not allowed).

    By default (0) real-time priority is the daemon's publisher thread's only: a worker
    spawned after it was granted inherits SCHED_FIFO, and the models need the cores between
    ticks. An edge has no model: its workers run at FIFO just below its loop ([sinks.sse]
    fanout_priority), since a normal writer waits behind the readers it wakes and any other
    load (subd bench edge, 500 clients, loaded 2-core machine: p99 10.6 ms normal, 1.9 ms
    FIFO). A worker spins only from SPIN_EARLY_NS before a release, never on a client."""
    for policy, prio in ((os.SCHED_FIFO, priority), (os.SCHED_OTHER, 0)):
        if policy == os.SCHED_OTHER or priority > 0:
            try:
                return os.sched_setscheduler(0, policy, os.sched_param(prio))
            except (AttributeError, OSError):
                pass


def main(argv: list[str]) -> int:
    fd, limit, drop_ms, heartbeat_ms, priority = (int(a) for a in argv)
    set_priority(priority)
    # It ends when the sink closes its control socket; a signal to the whole process group
    # (Ctrl-C, `timeout`) must not take its clients down under a draining daemon.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ctl = socket.socket(fileno=fd)
    ctl.setblocking(False)
    try:
        FanoutWorker(ctl, limit, drop_ms, heartbeat_ms).run()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
