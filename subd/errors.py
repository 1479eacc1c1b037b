"""Errors that reach the user as one line (CLI exit code 2, or a logged daemon rejection)."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or usage: the message is a complete one-line explanation."""


class AudioInputError(UserError):
    """Audio that cannot be read: names the file and what is wrong with it."""


class ModelError(UserError):
    """A model that cannot be loaded: names the file and what was expected."""


class ConfigError(UserError):
    """A configuration value out of range: names section, key and the allowed values."""
