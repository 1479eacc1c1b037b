"""Subcommands: each module defines register(subparsers)."""
