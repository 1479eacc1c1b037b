"""The SSE sink's clients, and how they are balanced over the fan-out worker processes.

A client that keeps up is written straight to its socket (:func:`_write_now`). With fan-out
workers, an up-to-date client is handed to the process that would write it soonest, by the
measured time of each process's tight write loop (:func:`quickest`); :class:`FanoutBalance`
is that policy, mixed into :class:`~subd.sinks.sse.sink.SSESink`, whose client tables it moves
clients between.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from subd.sinks.sse.link import WorkerLink
from subd.tasks import start_task

log = logging.getLogger("subd.sinks.sse.sink")


class _Client:
    __slots__ = ("id", "transport", "fd", "chunked", "done", "stalled_ns", "resync",
                 "last_write_ns", "link")

    def __init__(self, client_id: int, transport: asyncio.Transport, chunked: bool,
                 now_ns: int) -> None:
        self.id = client_id
        self.transport = transport
        sock = transport.get_extra_info("socket")
        self.fd = sock.fileno() if sock is not None else -1  # written directly when idle
        self.link: WorkerLink | None = None  # the worker writing to it, None: this process
        self.chunked = chunked
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.stalled_ns: int | None = None
        self.resync = False
        self.last_write_ns = now_ns

    def finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


def _write_now(client: _Client, data: bytes) -> bool:
    """Write to a client whose transport holds nothing unsent: straight to its socket (the
    transport's own path costs ~1 us more a client, a fifth of the send), the rest (if the
    socket is full) through the transport, which keeps the order and reports errors. True
    if the socket took it all."""
    try:
        n = os.write(client.fd, data)
    except OSError:  # full; or reset, broken pipe: the transport's write sees it and closes
        n = 0
    if n < len(data):  # the transport may keep what it is given: bytes, not a view of a slot
        client.transport.write(bytes(data[n:]))
        return False
    return True


def quickest(here_ns: float, shares: list[tuple[int, float]]) -> int | None:
    """Which worker would write one more client soonest, given each one's tight loop as
    (clients, ns per client): its index if that is sooner than ``here_ns``, else None."""
    if not shares:
        return None
    ends = [(n + 1) * ns for n, ns in shares]
    i = min(range(len(ends)), key=ends.__getitem__)
    return i if ends[i] < here_ns else None


class FanoutBalance:
    """Hand-off and rebalancing of clients between this process and the fan-out workers (for
    :class:`~subd.sinks.sse.sink.SSESink`, which owns every attribute used here)."""

    _clients: dict[_Client, None]
    _remote: dict[int, _Client]
    _links: list[WorkerLink]
    _failed: list[WorkerLink]
    _n_fast: int
    _send_ns: float
    _prepared: Any  # the tick prepare() encoded, not published yet
    _handoffs: Any  # clients to hand over once it is published
    n_dropped: int
    _heartbeat: asyncio.Task | None  # running while the sink is started
    _link_deaths: list[float]  # monotonic s of recent worker deaths

    def _hand_off(self, client: _Client) -> None:
        """Give an up-to-date client to the worker that would write it soonest (by measured
        time; by count before anything is measured), unless this process would.

        Synchronous: everything published so far is already in the kernel, and every later
        tick goes to the worker after the hand-over message, so nothing is lost or reordered.
        """
        if self._prepared is not None:  # the workers already hold the prepared tick: the
            self._handoffs.append(client)  # client gets it from here, then moves (publish)
            return
        links = [link for link in self._links if link.alive]
        sock = self._movable(client) if links and client in self._clients else None
        if sock is None:
            return
        if self._send_ns and all(lk.send_ns for lk in links):  # by time: where it ends first
            link = self._quickest_link((self._n_fast + 1) * self._send_ns, links)
            if link is None:
                return
        else:  # nothing measured yet: by count
            link = min(links, key=lambda lk: lk.n_clients)
            if link.n_clients >= len(self._clients) - 1:
                return  # this process takes its share: it is awake at T(k), a worker too
        self._move(client, link, sock)

    @staticmethod
    def _quickest_link(here_ns: float, links: list[WorkerLink]) -> WorkerLink | None:
        i = quickest(here_ns, [(link.n_fast, link.send_ns) for link in links])
        return None if i is None else links[i]

    @staticmethod
    def _movable(client: _Client) -> Any:
        """The socket of a client up to date with everything published, else None (the test
        ``publish``'s tight loop inlines, with ``fd``, to save a call per client)."""
        transport = client.transport
        if (not client.chunked or client.resync or client.stalled_ns is not None
                or transport.get_write_buffer_size() or transport.is_closing()):
            return None
        return transport.get_extra_info("socket")

    def _move(self, client: _Client, link: WorkerLink, sock: Any) -> None:
        del self._clients[client]
        self._remote[client.id] = client
        client.link = link
        link.n_clients += 1
        link.n_fast += 1  # until its next report
        link.add(client.id, os.dup(sock.fileno()), client.last_write_ns)

    def _rebalance(self) -> None:
        """Hand one up-to-date client to the worker that would write it soonest, if sooner
        than this process's tight loop ends now (one a tick: the workers' reports follow)."""
        links = [link for link in self._links if link.alive and link.send_ns]
        if not links or not self._send_ns or self._n_fast < 2:
            return
        link = self._quickest_link(self._n_fast * self._send_ns, links)
        if link is None:
            return
        for client in reversed(self._clients):  # the newest up-to-date one
            sock = self._movable(client)
            if sock is not None:
                self._n_fast -= 1
                self._move(client, link, sock)
                return

    def _gone(self, client_id: int, dropped: bool) -> None:
        """A worker closed a client: reset by the peer, or dropped for not reading."""
        client = self._remote.pop(client_id, None)
        if client is None:
            return
        if client.link is not None:
            client.link.n_clients -= 1
            client.link = None
        self.n_dropped += dropped
        self._retire(client, dropped=dropped)

    def _link_failed(self, link: WorkerLink) -> None:
        """A fan-out worker died: its clients were disconnected (they reconnect, with
        Last-Event-ID, to this process meanwhile); a new worker replaces it, after a backoff
        that doubles while workers keep dying (0.5 s .. 30 s), forever."""
        self._links = [lk for lk in self._links if lk is not link]
        self._failed.append(link)
        for client in [c for c in self._remote.values() if c.link is link]:
            client.link = None
            self._gone(client.id, dropped=False)
        if self._heartbeat is None or self._heartbeat.done():
            return  # closing, or never started
        now = time.monotonic()
        self._link_deaths = [t for t in self._link_deaths if now - t < 60]
        self._link_deaths.append(now)
        delay_s = min(0.5 * 2 ** (len(self._link_deaths) - 1), 30.0)
        start_task(self._replace_link(delay_s), "sse-fanout-respawn")

    async def _replace_link(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        if self._heartbeat is None or self._heartbeat.done():
            return
        link = self._new_link()
        self._links.append(link)
        if await link.wait_ready():
            log.info("SSE fan-out worker %d replaces one that died", link.proc.pid)
