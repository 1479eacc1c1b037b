"""Benchmarks (`subd bench NAME`): each module defines register(subparsers).

Imported only when ``subd bench`` runs (see ``subd.cli``), never by the daemon. May import
any folder of the package, ``subd.testing`` and the top-level modules; nothing imports them.
"""
