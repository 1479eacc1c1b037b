"""Deterministic test doubles (a scripted recogniser and recording sinks). Benchmarks use them
as baselines and tests as fixtures; the daemon never imports them.

May import: ``subd.sinks``, ``subd.layout`` and the top-level modules.
"""
