"""GPU serving in one place: the deadline-aware scheduler of every stream's GPU work and the
batched serving of the daemon's recognisers (the continuously batched simulation that
``subd bench gpu`` compares with is ``subd/bench/gpu_stream.py``).

May import: ``subd.models``, ``subd.kernels``, ``subd.recognise``, ``subd.workers`` (the
recogniser host it serves) and the top-level modules.
"""
