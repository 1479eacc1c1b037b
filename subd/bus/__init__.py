"""The caption bus: each channel's tick events on one Redis stream, written ahead of their due
time by the daemon that holds the channel's lease, read by any number of edge servers
(:mod:`subd.edge`).

May import: ``subd.sinks`` (the SSE wire encoding), ``subd.layout`` and the top-level modules.
"""
