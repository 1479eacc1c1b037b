"""What a bench (or a test) needs to drive a daemon it started on this machine: a port to give
it, its JSON endpoints, and a bounded wait for it to get somewhere.

Kept in one place so every bench asks the daemon the same way and gives up the same way."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any

from subd.errors import UserError

POLL_S = 0.1


def free_port() -> int:
    """A loopback port nothing listens on now (the kernel's pick), for a daemon about to start:
    a fixed port would clash with a second run or a leftover daemon."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(port: int, path: str) -> dict[str, Any]:
    """The JSON body of ``path`` on a local daemon, also of a 503: /healthz says in its body why
    it is unhappy, and a bench wants those figures either way."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def wait_until(predicate: Any, limit_s: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something truthy and return that.

    A daemon that is still starting refuses connections or answers without the key asked for,
    so those errors count as "not yet"; past ``limit_s`` the bench stops with a one-line
    error naming ``what`` it waited for, instead of hanging."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            got = predicate()
        except (OSError, ValueError, LookupError):  # not up yet
            got = None
        if got:
            return got
        time.sleep(POLL_S)
    raise UserError(f"timed out waiting for {what}")
