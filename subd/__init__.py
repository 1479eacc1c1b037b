"""subd: real-time subtitle daemon."""
__version__ = "0.1.0"
