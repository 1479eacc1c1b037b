"""Front-end kernels with CPU references (installed as subd.kernels)."""
