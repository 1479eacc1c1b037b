"""The slot ring: one preallocated slot per tick, holding what the publish path uses.

Tick k lives in slot ``k mod N`` with N = ceil((D + A)/P) + 3 spares. A slot holds the tick's
stage flags, how its state is to be built (``mode``: ready, or degraded when the tag stage
overran) and, from T(k) − 2 ms, the tick's prepared :class:`~subd.types.CaptionState` (laid
out once, in the pipeline) and its SSE event, encoded once into the slot's own buffer
(:class:`~subd.sinks.sse.wire.TickEvent`), which the publisher hands to every SSE sink and
which they write at T(k). Slots and their buffers are made once; the hot path (acquire, flag,
release) allocates nothing, and a buffer grows only for an event longer than any before it.
A slot still busy (not published) when the ring comes round is *stale*: it is counted and
reused, and its tick is published as a fallback (the publisher finds the slot gone at that
tick's deadline, and encodes its event into the ring's one spare buffer, counted in
``spare_count``). The audio is not here: it is stored once, in the shared
:class:`~subd.history.AudioHistory`.
"""

from __future__ import annotations

import enum
import math
from fractions import Fraction

from subd.sinks.sse.wire import TickEvent
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
    """One tick's stage flags, build mode, prepared state and encoded event."""

    __slots__ = ("index", "k", "flags", "mode", "state", "event")

    def __init__(self, index: int) -> None:
        self.index = index
        self.k = -1
        self.flags = 0
        self.mode: str | None = None  # how the state is built: READY, DEGRADED, or not yet
        self.state: CaptionState | None = None  # prepared at T(k) − 2 ms, sent at T(k)
        self.event = TickEvent()  # its bytes, encoded at T(k) − 2 ms; the buffer is reused

    def reset(self, k: int) -> None:
        self.k = k
        self.flags = 0
        self.mode = None
        self.state = None
        self.event.clear()

    @property
    def busy(self) -> bool:
        return self.k >= 0 and not (self.flags & _PUBLISHED)


class SlotRing:
    def __init__(self, n_slots: int) -> None:
        if n_slots < 4:
            raise ValueError("a slot ring needs at least 4 slots")
        self.n_slots = n_slots
        self._slots = [Slot(i) for i in range(n_slots)]
        self.spare = TickEvent()  # the event of a tick whose slot is gone (lapped: stale)
        self.stale_count = 0
        self.last_stale_k = -1
        self.spare_count = 0  # ticks encoded into the spare: published without their slot

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

    def event_for(self, k: int) -> TickEvent:
        """Where tick k's event is encoded: its slot's buffer, or, if the slot is gone, the
        spare (counted). The spare is free again once tick k is published, before the next
        tick is prepared."""
        slot = self.get(k)
        if slot is not None:
            return slot.event
        self.spare_count += 1
        return self.spare

    def mark(self, slot: Slot, flag: int) -> None:
        slot.flags |= flag

    def release(self, k: int) -> None:
        """Tick k is published: its slot may be reused without counting it stale."""
        slot = self._slots[k % self.n_slots]
        if slot.k == k:
            slot.flags |= _PUBLISHED
            slot.mode = None
            slot.state = None
            slot.event.clear()
        elif self.spare.k == k:
            self.spare.clear()

    def busy_count(self) -> int:
        return sum(1 for s in self._slots if s.busy)
