"""Building frozen config dataclasses from TOML tables, with one-line ConfigErrors: the core
sections' rules (:func:`build_section`, fields carrying :func:`rng` and :func:`choice` in their
metadata) and the sinks' and stages' own checks (:func:`check_range`, :func:`from_mapping`);
and the check, before any work, that an output folder takes files
(:func:`check_writable_folder`)."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from subd.errors import ConfigError, UserError

T = TypeVar("T")


def check_range(section: str, key: str, value: float, lo: float, hi: float) -> None:
    if not (lo <= value <= hi):
        raise ConfigError(f"[{section}] {key} = {value!r}: must be in {lo}..{hi}")


def check_choice(section: str, key: str, value: object, choices: tuple[object, ...]) -> None:
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ConfigError(f"[{section}] {key} = {value!r}: must be one of {allowed}")


def from_mapping(
    cls: type[T], section: str, data: Mapping[str, Any], /, **extra: Any
) -> T:
    """``cls(**data)`` rejecting unknown keys and wrong basic types with a one-line error.

    Nested config dataclasses (e.g. ``layout``) may be given as tables. ``extra`` supplies
    values that do not come from the file (they win over the table).
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    fields.pop("section", None)  # set by the loader, not by the file
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"[{section}] unknown key {key!r} (known keys: {known})")
        spec = fields[key]
        default = spec.default
        if default is dataclasses.MISSING and spec.default_factory is not dataclasses.MISSING:
            default = spec.default_factory()
        if dataclasses.is_dataclass(default) and isinstance(value, Mapping):
            sub = f"{section}.{key}"
            has_section = any(f.name == "section" for f in dataclasses.fields(default))
            extra_sub = {"section": sub} if has_section else {}
            value = from_mapping(type(default), sub, value, **extra_sub)
        elif isinstance(default, tuple) and isinstance(value, list):
            value = tuple(value)
        elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if default is not None and default is not dataclasses.MISSING:
            expected = type(default)
            if not isinstance(value, expected) or (
                isinstance(value, bool) and expected is not bool
            ):
                raise ConfigError(
                    f"[{section}] {key} = {value!r}: expected {expected.__name__}"
                )
        kwargs[key] = value
    kwargs.update(extra)
    try:
        return cls(**kwargs)
    except TypeError as exc:  # missing required keys
        raise ConfigError(f"[{section}] {exc}") from None


def rng(lo: float | None = None, hi: float | None = None) -> dict:
    return {"range": (lo, hi)}


def choice(*values: str) -> dict:
    return {"choices": values}


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _check_value(section: str, key: str, tp: Any, value: Any, meta: dict) -> Any:
    where = f"[{section}] {key}"
    origin = typing.get_origin(tp)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list of {_type_name(item_tp)}")
        return [_check_value(section, key, item_tp, v, {}) for v in value]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
    elif tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        value = float(value)
    elif tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
    lo, hi = meta.get("range", (None, None))
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ConfigError(f"{where}: {value!r} is out of range ({lo}..{hi})")
    choices = meta.get("choices")
    if choices and value not in choices:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(choices)}")
    return value


def build_section(name: str, cls: type[T], table: dict[str, Any]) -> T:
    """Validate one TOML table into ``cls`` (a dataclass with defaults for every field)."""
    if not isinstance(table, dict):
        raise ConfigError(f"[{name}]: expected a table")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(
            f"[{name}] {unknown[0]}: unknown key (known: {', '.join(sorted(fields))})"
        )
    values = {k: _check_value(name, k, hints[k], v, dict(fields[k].metadata))
              for k, v in table.items()}
    try:
        obj = cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[{name}]: {exc}") from None
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj


def check_writable_folder(folder: Path, what: str) -> None:
    """One line and exit 2 before the work where files cannot be written into ``folder`` (it
    cannot be made, or is not writable): not an internal error after it. ``what`` names the
    output in the message (the file, or the option)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".subd-check.", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except FileExistsError:  # mkdir: the folder's name is a file's
        raise UserError(f"{what}: cannot write ({folder} is not a folder)") from None
    except OSError as exc:
        raise cannot_write(what, exc) from None


def cannot_write(what: str, exc: OSError) -> UserError:
    """The one-line error for an output ``what`` that ``exc`` kept from being written."""
    return UserError(f"{what}: cannot write ({exc.strerror or type(exc).__name__})")


def check_piped_stdin(command: str) -> None:
    """``-`` reads raw PCM from stdin: a terminal there is a mistake, said in one line (typed
    keys would be taken for audio, or the command would wait for ever)."""
    import sys

    if sys.stdin is not None and sys.stdin.isatty():
        raise UserError(f"-: standard input is a terminal; pipe raw PCM into it, e.g. ffmpeg -i "
                        f"IN -f s16le -ar 16000 -ac 1 - | {command} -")


PROMPT_MAX_CHARS = 1000  # and at most subd.models.words.USER_PROMPT_TOKENS of it reach a decode
PROMPT_HELP = ("names and terms to expect, spelled as they should be written (\"Gwynplaine, "
               "Tilney, Westminster\"): Whisper's prompt, before the words just said in every "
               "decode's context; a hint, not a rule")


def check_prompt(value: object, key: str = "[recognizer] prompt") -> str:
    """A user's prompt: text of at most ``PROMPT_MAX_CHARS`` characters, one line."""
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if len(value) > PROMPT_MAX_CHARS:
        raise ConfigError(f"{key}: {len(value)} characters, at most {PROMPT_MAX_CHARS} (names "
                          "and terms to expect, not a script)")
    if any(ch in value for ch in "\r\n\0"):
        raise ConfigError(f"{key}: one line of text, without line breaks")
    return value
