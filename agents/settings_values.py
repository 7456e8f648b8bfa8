"""The kinds of value a setting holds, and how raw text or TOML becomes one (``agents.settings``)."""

from __future__ import annotations

import math
import typing
from typing import Any, Literal

__all__ = ["Secret", "SettingsError", "convert"]


class Secret:
    """A credential: compares and reads like a string only through ``get()``."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return "Secret('****')" if self._value else "Secret('')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class SettingsError(ValueError):
    """A setting is missing, unknown or has a value of the wrong kind."""


def convert(name: str, hint: Any, raw: Any) -> Any:
    """``raw`` (text from the environment, or a TOML value) as the type ``hint`` names.

    >>> convert("flush_rows", int, "500"), convert("web_enabled", bool, "off")
    (500, False)
    >>> convert("grid_ms", int, 2.9)
    Traceback (most recent call last):
    ...
    agents.settings_values.SettingsError: grid_ms=2.9: expected int
    """
    if hint is Secret:
        return raw if isinstance(raw, Secret) else Secret(str(raw))
    if typing.get_origin(hint) is Literal:
        allowed = typing.get_args(hint)
        if raw not in allowed:
            raise SettingsError(f"{name}={raw!r}: expected one of {', '.join(map(str, allowed))}")
        return raw
    try:
        if hint is bool:
            if isinstance(raw, bool):
                return raw
            low = str(raw).strip().lower()
            if low not in {"1", "0", "true", "false", "yes", "no", "on", "off"}:
                raise ValueError(raw)
            return low in {"1", "true", "yes", "on"}
        if hint is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(raw)  # a TOML true or 2.9 is a mistake, not a 1 or a 2
            return int(raw)
        if hint is float:
            if isinstance(raw, bool):
                raise ValueError(raw)
            val = float(raw)
            if not math.isfinite(val):
                raise ValueError(raw)
            return val
    except (TypeError, ValueError):
        raise SettingsError(f"{name}={raw!r}: expected {hint.__name__}") from None
    return str(raw)
