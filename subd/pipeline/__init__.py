"""The tick core: ticks on exact rational time, the slot ring, the deadline-driven scheduler,
ingest into the shared audio history, the word stream, tick statistics and paced garbage
collection.

May import: ``subd.layout``, ``subd.workers`` (what stages exchange) and the top-level modules.
"""
