"""Building frozen sink config dataclasses from TOML tables, with one-line ConfigErrors."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from subd.errors import ConfigError

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
