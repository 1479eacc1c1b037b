"""SIGTERM drains and exits 0, a second SIGINT forces, SIGHUP reloads, a bad file is refused."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
from daemon_helpers import beats_during

from subd.errors import ConfigError
from subd.service.notify import Notifier
from subd.service.signals import EXIT_FORCED, EXIT_OK, Reloader, SignalController


@pytest.fixture
def notify_pair(tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    notifier = Notifier(env={"NOTIFY_SOCKET": path})
    yield notifier, sock
    notifier.close()
    sock.close()


def _received(sock: socket.socket) -> list[str]:
    sock.setblocking(False)
    out = []
    try:
        while True:
            out.append(sock.recv(4096).decode())
    except BlockingIOError:
        return out


async def _eventually(predicate, limit_s: float = 10.0) -> None:
    for _ in range(int(limit_s / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never became true")


async def _controlled(ctl: SignalController, *signals: int, between=None) -> int:
    ctl.install()
    try:
        waiter = asyncio.ensure_future(ctl.wait())
        for signum in signals:
            await asyncio.sleep(0.01)
            os.kill(os.getpid(), signum)
            if between is not None:
                await between()
        return await waiter
    finally:
        ctl.uninstall()


def test_sigterm_drains_then_exits_zero(notify_pair):
    notifier, sock = notify_pair
    drained = []

    async def drain():
        await asyncio.sleep(0.05)
        drained.append(True)

    code = asyncio.run(_controlled(SignalController(drain, notifier=notifier), signal.SIGTERM))
    assert code == EXIT_OK
    assert drained == [True]
    assert _received(sock) == ["STOPPING=1\nSTATUS=stopping: SIGTERM received"]


def test_drain_that_overruns_is_cancelled_and_still_exits_zero():
    seen = []

    async def drain():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    ctl = SignalController(drain, drain_timeout_s=0.2)
    assert asyncio.run(_controlled(ctl, signal.SIGTERM)) == EXIT_OK
    assert seen == ["cancelled"]


def test_second_sigint_forces():
    async def drain():
        await asyncio.Event().wait()

    ctl = SignalController(drain, drain_timeout_s=60.0)
    assert asyncio.run(_controlled(ctl, signal.SIGINT, signal.SIGINT)) == EXIT_FORCED


def test_sighup_reloads_and_a_bad_file_keeps_the_old_configuration(notify_pair, caplog):
    notifier, sock = notify_pair
    files = iter([{"latency_ms": 2000}, ConfigError("[latency] delay_ms = -1: must be >= 0")])
    applied = []
    results = []

    def load():
        item = next(files)
        if isinstance(item, Exception):
            raise item
        return item

    reloader = Reloader({"latency_ms": 1500}, load, applied.append, on_result=results.append)

    async def drain():
        pass

    async def settle():  # each SIGHUP's reload has reported before the next signal
        n_before = settle.n
        await _eventually(lambda: len(results) > n_before or len(results) == 2)
        settle.n = len(results)

    settle.n = 0

    ctl = SignalController(drain, reload=reloader, notifier=notifier)
    with caplog.at_level(logging.INFO, logger="subd.service.signals"):
        code = asyncio.run(_controlled(ctl, signal.SIGHUP, signal.SIGHUP, signal.SIGTERM,
                                       between=settle))
    assert code == EXIT_OK
    assert applied == [{"latency_ms": 2000}]
    assert reloader.current == {"latency_ms": 2000}
    assert results == ["ok", "invalid"]
    assert any("keeping the previous configuration" in r.getMessage()
               and "delay_ms = -1" in r.getMessage() for r in caplog.records)
    messages = [m.split("\n")[0] for m in _received(sock)]
    assert messages == ["RELOADING=1", "READY=1", "RELOADING=1", "READY=1", "STOPPING=1"]


def test_sighups_during_a_reload_coalesce():
    calls = []

    async def main():
        release = asyncio.Event()

        async def reload():
            calls.append(len(calls))
            await release.wait()

        async def drain():
            pass

        ctl = SignalController(drain, reload=reload)
        ctl.install()
        try:
            for _ in range(3):
                os.kill(os.getpid(), signal.SIGHUP)
                await asyncio.sleep(0.02)
            assert calls == [0]  # one running, the other two folded into one more
            release.set()
            await _eventually(lambda: len(calls) == 2)
            await asyncio.sleep(0.05)  # room for a wrong third reload to show up
            ctl.request_stop("test over")
            return await ctl.wait()
        finally:
            ctl.uninstall()

    assert asyncio.run(main()) == EXIT_OK
    assert calls == [0, 1]


def test_a_reload_reads_its_file_off_the_event_loop():
    """Reading and checking a configuration took 30 ms; on the event loop every channel's next
    tick went out that much late at each SIGHUP. The loop keeps running while it loads."""
    import threading
    import time

    seen = {}

    def load():
        seen["thread"] = threading.get_ident()
        time.sleep(0.2)  # a slow load
        return {"new": True}

    async def main() -> int:
        reloader = Reloader({"new": False}, load, lambda new: None)
        done, beats = await beats_during(reloader())
        assert done and reloader.current == {"new": True}
        return beats

    assert asyncio.run(main()) >= 5
    assert seen["thread"] != threading.get_ident()


def test_real_process_exits_zero_on_sigterm_after_draining():
    script = textwrap.dedent(
        """
        import asyncio, sys
        from subd.service.signals import SignalController

        async def drain():
            await asyncio.sleep(0.1)
            print("drained", flush=True)

        async def main():
            ctl = SignalController(drain, drain_timeout_s=3)
            ctl.install()
            print("ready", flush=True)
            return await ctl.wait()

        sys.exit(asyncio.run(main()))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert out == "drained\n"
