"""The slot ring: one preallocated slot per tick, holding what the publish path uses.

Tick k lives in slot ``k mod N`` with N = ceil((D + A)/P) + 3 spares. A slot holds the tick's
stage flags, how its state is to be built (``mode``: ready, or degraded when the tag stage
overran) and, from T(k) − 2 ms, the tick's prepared :class:`~subd.types.CaptionState` (laid
out once, in the pipeline), which the publisher sends at T(k). Slots are made once; the hot path
(acquire, flag, release) allocates nothing. A slot still busy (not published) when the ring comes
round is *stale*: it is counted and reused, and its tick is published as a fallback (the
publisher finds the slot gone at that tick's deadline). The audio is not here: it is stored once,
in the shared :class:`~subd.history.AudioHistory`.
"""

from __future__ import annotations

import enum
import math
from fractions import Fraction

from subd.types import CaptionState


class SlotFlag(enum.IntFlag):
    TAGGED = 8
    LAID_OUT = 16
    PUBLISHED = 32


_PUBLISHED = int(SlotFlag.PUBLISHED)
READY = "ready"  # slot.mode: the tick's state can be built from the streams
DEGRADED = "degraded"  # slot.mode: built on the cheap path (tagger skipped)


def n_slots_for(latency_ns: int, lookahead_ns: int, wall_period_ns: Fraction) -> int:
    """N = ceil((D + A) / P) + 3 spare slots."""
    return math.ceil((latency_ns + lookahead_ns) / wall_period_ns) + 3


class Slot:
    """One tick's stage flags, build mode and prepared state."""

    __slots__ = ("index", "k", "flags", "mode", "state")

    def __init__(self, index: int) -> None:
        self.index = index
        self.k = -1
        self.flags = 0
        self.mode: str | None = None  # how the state is built: READY, DEGRADED, or not yet
        self.state: CaptionState | None = None  # prepared at T(k) − 2 ms, sent at T(k)

    def reset(self, k: int) -> None:
        self.k = k
        self.flags = 0
        self.mode = None
        self.state = None

    @property
    def busy(self) -> bool:
        return self.k >= 0 and not (self.flags & _PUBLISHED)


class SlotRing:
    def __init__(self, n_slots: int) -> None:
        if n_slots < 4:
            raise ValueError("a slot ring needs at least 4 slots")
        self.n_slots = n_slots
        self._slots = [Slot(i) for i in range(n_slots)]
        self.stale_count = 0
        self.last_stale_k = -1

    def acquire(self, k: int) -> Slot | None:
        """The slot for tick k, taking it over (stale protocol) if it holds an older tick.

        None if the slot already holds a *newer* tick (the ring was lapped): tick k then has
        no slot and is published as a fallback.
        """
        slot = self._slots[k % self.n_slots]
        if slot.k == k:
            return slot
        if slot.k > k:
            return None
        if slot.k >= 0 and not (slot.flags & _PUBLISHED):
            self.stale_count += 1
            self.last_stale_k = slot.k
        slot.reset(k)
        return slot

    def get(self, k: int) -> Slot | None:
        """The slot holding tick k, or None if it was never filled or was reused (stale)."""
        slot = self._slots[k % self.n_slots]
        return slot if slot.k == k else None

    def mark(self, slot: Slot, flag: int) -> None:
        slot.flags |= flag

    def release(self, k: int) -> None:
        """Tick k is published: its slot may be reused without counting it stale."""
        slot = self._slots[k % self.n_slots]
        if slot.k == k:
            slot.flags |= _PUBLISHED
            slot.mode = None
            slot.state = None

    def busy_count(self) -> int:
        return sum(1 for s in self._slots if s.busy)
