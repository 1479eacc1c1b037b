"""GPU serving in one place: the deadline-aware scheduler of every stream's GPU work and the
continuously batched streaming server.

May import: ``subd.models``, ``subd.kernels``, ``subd.recognise``, ``subd.workers`` (the
recogniser host it serves) and the top-level modules.
"""
