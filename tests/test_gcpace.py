"""Garbage collection paced by the publisher: off while a pipeline runs, run after publishing."""

from __future__ import annotations

import gc
import weakref

from subd.pipeline.gcpace import GcPacer


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a  # only the cycle collector frees these
    return weakref.ref(a)


def test_automatic_collection_is_off_and_cycles_are_freed_after_a_publish() -> None:
    pacer = GcPacer()
    assert gc.isenabled()
    pacer.acquire()
    try:
        assert not gc.isenabled()
        ref = cycle()
        junk = [[] for _ in range(5 * gc.get_threshold()[0])]  # far past the gen-0 threshold
        del junk
        assert ref() is not None  # nothing collected it behind the publisher's back
        generations = []
        while ref() is not None and len(generations) < 200:
            gen = pacer.after_publish()
            if gen is None:  # below the threshold: allocate as ticks would
                _ = [[] for _ in range(gc.get_threshold()[0])]
                continue
            generations.append(gen)
        assert ref() is None, "the cycle was never collected"
        assert generations and set(generations) <= {0, 1, 2}
        assert sum(pacer.n_collections) == len(generations)
    finally:
        pacer.release()
    assert gc.isenabled()


def test_nested_users_and_a_disabled_gc_are_respected() -> None:
    pacer = GcPacer()
    pacer.acquire()
    pacer.acquire()
    pacer.release()
    assert not gc.isenabled() and pacer.active  # one user left
    pacer.release()
    assert gc.isenabled() and not pacer.active
    pacer.release()  # an extra release is harmless
    assert gc.isenabled()
    assert pacer.after_publish() is None  # inactive: never collects
    gc.disable()
    try:
        pacer.acquire()
        pacer.release()
        assert not gc.isenabled()  # it was off before: stays off
    finally:
        gc.enable()
