"""Benchmarks (`subd bench NAME`): each module defines register(subparsers)."""
