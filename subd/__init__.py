"""subd: real-time subtitle daemon.

The top level holds what every folder shares (cli, config, errors, types, clock, the audio
history, tasks, validation); those modules may import only each other. The folders import
downward: see each folder's ``__init__`` and docs/DESIGN.md ("Where things are").
"""
__version__ = "0.1.0"
