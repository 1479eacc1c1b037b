"""``subd edge``: a stateless server that relays channels from the bus (:mod:`subd.bus`) to
viewers, each event released at its due time on this machine's clock.

May import: ``subd.bus``, ``subd.server`` (overlay, request safety), ``subd.sinks`` (the SSE
sink it relays through), ``subd.pipeline.gcpace`` and the top-level modules.
"""
