"""sd_notify over a real AF_UNIX datagram socket given as NOTIFY_SOCKET."""

from __future__ import annotations

import logging
import os
import socket
import time

import pytest

from subd.service.notify import Notifier, scrub_child_environment, socket_address


@pytest.fixture
def notify_socket(tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2.0)
    yield path, sock
    sock.close()


def _messages(sock: socket.socket) -> list[str]:
    out = []
    sock.setblocking(False)
    try:
        while True:
            out.append(sock.recv(4096).decode())
    except BlockingIOError:
        pass
    finally:
        sock.settimeout(2.0)
    return out


def test_ready_status_stopping_arrive_as_datagrams(notify_socket):
    path, sock = notify_socket
    notifier = Notifier(env={"NOTIFY_SOCKET": path})
    assert notifier.enabled
    assert notifier.ready("lag 12 ms,\nclients 3")
    assert sock.recv(4096).decode() == "READY=1\nSTATUS=lag 12 ms, clients 3"
    assert notifier.status("listening on 127.0.0.1:8080")
    assert sock.recv(4096).decode() == "STATUS=listening on 127.0.0.1:8080"
    assert notifier.stopping()
    assert sock.recv(4096).decode() == "STOPPING=1"
    notifier.close()


def test_abstract_namespace_socket():
    name = f"subd-test-notify-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2.0)
    try:
        assert socket_address("@" + name) == b"\0" + name.encode()
        notifier = Notifier(env={"NOTIFY_SOCKET": "@" + name})
        assert notifier.ready()
        assert sock.recv(4096) == b"READY=1"
        notifier.close()
    finally:
        sock.close()


def test_reloading_carries_the_monotonic_time(notify_socket):
    path, sock = notify_socket
    notifier = Notifier(env={"NOTIFY_SOCKET": path})
    before_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    notifier.reloading()
    after_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    lines = sock.recv(4096).decode().split("\n")
    assert lines[0] == "RELOADING=1"
    key, value = lines[1].split("=")
    assert key == "MONOTONIC_USEC"
    assert before_us <= int(value) <= after_us
    notifier.close()


def test_watchdog_pings_at_half_the_interval(notify_socket):
    path, sock = notify_socket
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    notifier = Notifier(env=env, now_ns=lambda: 0)
    assert notifier.watchdog_enabled
    assert notifier.watchdog_timeout_ns == 2_000_000_000
    sent = [notifier.watchdog(t_ms * 1_000_000) for t_ms in range(0, 3001, 100)]
    # Called every 100 ms for 3 s: pings at 0, 1.0, 2.0, 3.0 s only.
    assert sum(sent) == 4
    assert _messages(sock) == ["WATCHDOG=1"] * 4
    notifier.close()


def test_watchdog_meant_for_another_process_is_ignored(notify_socket):
    path, sock = notify_socket
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}
    notifier = Notifier(env=env)
    assert not notifier.watchdog_enabled
    assert not notifier.watchdog(0)
    assert _messages(sock) == []


def test_without_notify_socket_everything_is_a_no_op():
    notifier = Notifier(env={"WATCHDOG_USEC": "1000000"})
    assert not notifier.enabled
    assert not notifier.watchdog_enabled
    assert not notifier.ready("x")
    assert not notifier.watchdog(10**12)
    assert not notifier.stopping()


def test_vanished_socket_warns_once_and_never_raises(tmp_path, caplog):
    notifier = Notifier(env={"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    with caplog.at_level(logging.WARNING, logger="subd.service.notify"):
        assert not notifier.ready()
        assert not notifier.status("still here")
    notifier.close()
    warnings = [r for r in caplog.records if r.name == "subd.service.notify"]
    assert len(warnings) == 1
    assert "gone.sock" in warnings[0].getMessage()


def test_worker_environment_loses_the_notify_variables():
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "2", "PATH": "/bin"}
    assert scrub_child_environment(env) == {"PATH": "/bin"}
