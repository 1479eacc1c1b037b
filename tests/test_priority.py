"""Real-time priority stays on the publisher thread: a fan-out worker spawned while the daemon
runs at SCHED_FIFO, and a respawned stage process, run at normal priority."""

from __future__ import annotations

import asyncio
import os

import pytest

from subd.sinks.sse.link import WorkerLink


@pytest.fixture
def fifo_thread():
    """This thread at SCHED_FIFO, as the daemon's publisher (root or CAP_SYS_NICE needed)."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (AttributeError, PermissionError, OSError):
        pytest.skip("SCHED_FIFO not allowed here")
    try:
        yield
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def test_a_fan_out_worker_spawned_at_fifo_runs_at_normal_priority(fifo_thread):
    async def main() -> int:
        link = WorkerLink(client_buffer_bytes=65536, drop_after_ms=1000, heartbeat_ms=1000,
                          on_gone=lambda *_: None, on_fail=lambda _: None)
        try:
            assert await link.wait_ready()
            return os.sched_getscheduler(link.proc.pid)
        finally:
            await link.close()

    assert os.sched_getscheduler(0) == os.SCHED_FIFO
    assert asyncio.run(main()) == os.SCHED_OTHER


def test_a_stage_process_spawned_at_fifo_runs_at_normal_priority(fifo_thread):
    from subd.workers.hosts import FactorySpec
    from subd.workers.process import ProcessWorker

    async def main() -> int:
        worker = ProcessWorker("probe", FactorySpec("subd.workers.hosts:TagHost"))
        await worker.start(60)
        try:
            return os.sched_getscheduler(worker.pid)
        finally:
            await worker.close()

    assert asyncio.run(main()) == os.SCHED_OTHER
