"""A scope with ``n`` torch intra-op threads, for code that runs small products on one thread.

torch is not imported here: where it was never imported (a pass-through tagger), the scope does
nothing, so callers that may run without a model need not load torch to use it."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


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
