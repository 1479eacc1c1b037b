"""Front-end kernels (log-mel features, GPU selection) with CPU reference implementations,
installed as ``subd.kernels``.

May import: the top-level modules of ``subd`` (errors, types) only; nothing above them.
"""
