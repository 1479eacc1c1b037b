"""Starting and stopping asyncio tasks the same way everywhere.

Every task of the package is started by :func:`start_task`: it has a name (in logs, and in
asyncio's own reports), its failure is logged once, as one line, by this module (the traceback
at debug level), and it is registered until it ends, so that :func:`cancel_all` cancels what is
still running when the process shuts down (``subd run`` and ``subd stream`` call it last).
Owners still cancel and await their own tasks (:func:`cancel_and_wait`) in the order their
shutdown needs; ``cancel_all`` is the net under them. A cancellation is never a failure, and
never swallowed: it propagates to whoever awaits the task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

from subd.errors import UserError

log = logging.getLogger("subd.tasks")
T = TypeVar("T")

_live: set[asyncio.Task[Any]] = set()  # started here and not ended yet (any event loop)


def start_task(coro: Coroutine[Any, Any, T], name: str,
               expected: tuple[type[BaseException], ...] = ()) -> asyncio.Task[T]:
    """Run ``coro`` as a task named ``name`` on the running loop; its failure is logged, unless
    it is one of the ``expected`` exceptions, which whoever awaits the task handles."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    _live.add(task)
    task.add_done_callback(lambda t: _ended(t, expected))
    return task


def _ended(task: asyncio.Task[Any], expected: tuple[type[BaseException], ...] = ()) -> None:
    _live.discard(task)
    if task.cancelled():
        return
    exc = task.exception()  # retrieved here: asyncio never reports it as "never retrieved"
    if exc is None or isinstance(exc, expected):
        return
    text = " ".join(str(exc).split())
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    # bad input (a stream that cannot be read) is the user's to fix, not a bug of ours
    level = logging.WARNING if isinstance(exc, UserError) else logging.ERROR
    log.log(level, "task %s failed: %s", task.get_name(), line)
    log.debug("task %s failed", task.get_name(), exc_info=exc)


def live_tasks() -> list[asyncio.Task[Any]]:
    """The tasks started here that are still running on the current loop."""
    loop = asyncio.get_running_loop()
    return [t for t in _live if t.get_loop() is loop and not t.done()]


async def cancel_all(timeout_s: float = 5.0) -> list[str]:
    """Cancel every task started here that still runs on this loop (shutdown); returns the
    names of those that were still running. Waits at most ``timeout_s`` for them to end."""
    current = asyncio.current_task()
    tasks = [t for t in live_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout_s)
    return sorted(t.get_name() for t in tasks)


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel ``task`` and wait for it to end; a cancellation of the caller itself propagates."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
