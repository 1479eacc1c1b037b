"""A scope with ``n`` torch intra-op threads, for code that runs small products on one thread,
and the cores this process may use (:func:`usable_cores`), which thread and process counts are
shared out from.

torch is not imported here: where it was never imported (a pass-through tagger), the scope does
nothing, so callers that may run without a model need not load torch to use it."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a cgroup or taskset may leave
    fewer than the machine has); the machine's count where the platform has no mask."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else n
    if before == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
