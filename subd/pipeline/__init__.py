"""The tick core: ticks on exact rational time, the slot ring, the deadline-driven scheduler
and its publisher, ingest into the shared audio history, the word stream, tick statistics and
paced garbage collection.

May import: ``subd.layout`` (cues, laid out once per tick), ``subd.workers`` (what stages
exchange), ``subd.sources`` (the drift estimate of live sample clocks), ``subd.sinks`` (the
events log; the SSE wire format, a tick's event encoded in its slot) and the top-level modules.
"""
