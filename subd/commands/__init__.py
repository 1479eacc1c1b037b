"""Subcommands (``subd run``, ``stream``, ``transcribe``, ``train-punct``): each module defines
register(subparsers).

May import: any folder except ``subd.bench`` and ``subd.testing``, and the top-level modules;
only ``subd.cli`` imports them. Heavy imports (torch) stay inside the command that needs them.
"""
