"""The Server-Sent Events sink: encoding (wire), the in-process sink, fan-out worker processes
and the link between them.

May import: ``subd.sinks``, ``subd.layout`` and the top-level modules; never ``subd.server``.
"""
