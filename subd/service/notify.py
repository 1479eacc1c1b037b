"""The systemd notify protocol (sd_notify), spoken directly over the NOTIFY_SOCKET datagram socket.

systemd starts a ``Type=notify`` service with ``NOTIFY_SOCKET`` set to an AF_UNIX datagram socket
(a path, or an abstract-namespace name written with a leading ``@``). The daemon sends
newline-separated ``KEY=VALUE`` assignments: ``READY=1`` once it serves, ``WATCHDOG=1`` at least
every ``WATCHDOG_USEC`` µs (we ping from the tick loop, so a stalled clock gets the service
restarted), ``STATUS=...`` free text, ``RELOADING=1`` + ``MONOTONIC_USEC`` around a reload and
``STOPPING=1`` when shutting down. Without ``NOTIFY_SOCKET`` every call is a cheap no-op.

Sending never blocks and never raises: a notification that cannot be delivered is logged once;
the tick loop must not be disturbed by the service manager.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

log = logging.getLogger("subd.service.notify")

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"
WATCHDOG_USEC_ENV = "WATCHDOG_USEC"
WATCHDOG_PID_ENV = "WATCHDOG_PID"


def socket_address(value: str) -> str | bytes:
    """The address to send to: a filesystem path, or abstract name (``@name`` -> ``\\0name``)."""
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    return value


def watchdog_interval_ns(env: Mapping[str, str], pid: int | None = None) -> int | None:
    """The watchdog timeout in ns; None when it is off or meant for another PID."""
    raw = env.get(WATCHDOG_USEC_ENV)
    if not raw:
        return None
    owner = env.get(WATCHDOG_PID_ENV)
    if owner and owner.strip() != str(os.getpid() if pid is None else pid):
        return None
    try:
        usec = int(raw)
    except ValueError:
        log.warning("ignoring %s=%r: not an integer", WATCHDOG_USEC_ENV, raw)
        return None
    return usec * 1000 if usec > 0 else None


def _clean_status(text: str) -> str:
    # A newline would start a new assignment: keep STATUS one line.
    return " ".join(text.split())


class Notifier:
    """Sends sd_notify messages; every method is a no-op when NOTIFY_SOCKET is unset."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        now_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        env = os.environ if env is None else env
        self._now_ns = now_ns
        raw = env.get(NOTIFY_SOCKET_ENV, "")
        self._address: str | bytes | None = socket_address(raw) if raw else None
        self._sock: socket.socket | None = None
        self._warned = False
        self.watchdog_timeout_ns = watchdog_interval_ns(env) if self._address else None
        # Ping at half the timeout, as sd_watchdog_enabled(3) recommends.
        self.watchdog_every_ns = (
            self.watchdog_timeout_ns // 2 if self.watchdog_timeout_ns else None
        )
        self._last_ping_ns: int | None = None

    @property
    def enabled(self) -> bool:
        return self._address is not None

    @property
    def watchdog_enabled(self) -> bool:
        return self.watchdog_every_ns is not None

    def send(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` lines in one datagram; True when it was handed to the socket."""
        if self._address is None or not assignments:
            return False
        payload = "\n".join(assignments).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto(payload, self._address)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("cannot notify the service manager at %s: %s", self._display(), exc)
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        lines = ["READY=1"]
        if status:
            lines.append(f"STATUS={_clean_status(status)}")
        return self.send(*lines)

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={_clean_status(text)}")

    def reloading(self) -> bool:
        """Announce a reload; send :meth:`ready` when it is over (ok or not)."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self, status: str | None = None) -> bool:
        lines = ["STOPPING=1"]
        if status:
            lines.append(f"STATUS={_clean_status(status)}")
        return self.send(*lines)

    def watchdog(self, now_ns: int | None = None) -> bool:
        """Ping the watchdog if half its timeout has passed since the last ping.

        Cheap enough to call on every tick: it sends at most once per half-interval.
        Returns True when a ping was sent.
        """
        if self.watchdog_every_ns is None:
            return False
        now = self._now_ns() if now_ns is None else now_ns
        if self._last_ping_ns is not None and now - self._last_ping_ns < self.watchdog_every_ns:
            return False
        self._last_ping_ns = now
        return self.send("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _display(self) -> str:
        addr = self._address
        return "@" + addr[1:].decode(errors="replace") if isinstance(addr, bytes) else str(addr)


def scrub_child_environment(env: dict[str, str]) -> dict[str, str]:
    """A copy of ``env`` without the notify variables, for worker processes we spawn.

    Only the main PID may notify (NotifyAccess=main); a worker that inherited the socket could
    otherwise send READY/WATCHDOG on the daemon's behalf and hide a stalled tick loop.
    """
    return {
        k: v
        for k, v in env.items()
        if k not in (NOTIFY_SOCKET_ENV, WATCHDOG_USEC_ENV, WATCHDOG_PID_ENV)
    }
