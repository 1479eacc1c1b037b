"""Garbage collection paced by the publisher: never inside the window before a deadline.

CPython collects when allocations cross a threshold, wherever that happens: a generation-1 pass
in a process holding the model and 1000 client connections takes ~1-5 ms, a full pass tens of
ms, and one that starts at T(k) - 1 ms makes tick k late. While a pipeline runs, automatic
collection is off and the publisher runs the collection CPython would have run, right after it
has published a tick (the point furthest from the next deadline), with CPython's own
thresholds. What exists at start-up (modules, models, configuration) is frozen first, so full
passes only scan what was allocated since.
"""

from __future__ import annotations

import gc


class GcPacer:
    """Process-wide: pipelines in one process share it (``acquire``/``release`` nest)."""

    def __init__(self) -> None:
        self._users = 0
        self._was_enabled = True
        self.n_collections = [0, 0, 0]  # passes run by ``after_publish``, per generation

    @property
    def active(self) -> bool:
        return self._users > 0

    def acquire(self) -> None:
        if self._users == 0:
            self._was_enabled = gc.isenabled()
            gc.freeze()
            gc.disable()
        self._users += 1

    def release(self) -> None:
        if self._users == 0:
            return
        self._users -= 1
        if self._users == 0:
            gc.unfreeze()
            if self._was_enabled:
                gc.enable()

    def after_publish(self) -> int | None:
        """Run the pass that is due, if any; returns its generation."""
        if self._users == 0:
            return None
        threshold = gc.get_threshold()
        count = gc.get_count()
        if count[0] < threshold[0]:
            return None
        generation = 0
        if count[1] + 1 >= threshold[1]:  # as CPython: a generation is collected when the
            generation = 1  # number of passes of the younger one crosses its threshold
            if count[2] + 1 >= threshold[2]:
                generation = 2
        gc.collect(generation)
        self.n_collections[generation] += 1
        return generation


PACER = GcPacer()
