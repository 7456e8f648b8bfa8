"""Strict TOML policy sections: one table of a policy file onto a frozen parameter dataclass.

A misspelt key is an error naming the file, the table and the key, never a rule that silently
keeps its default. Shared by the decision policy (``streams.decide.params``) and the leak
policy (``streams.leaks.params``).

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class P:
...     hold_s: float = 30.0
...     enabled: bool = True
>>> build_section(P, {"hold_s": 10}, "policy.toml", "[x]")
P(hold_s=10.0, enabled=True)
>>> try:
...     build_section(P, {"hold": 10}, "policy.toml", "[x]")
... except PolicyError as exc:
...     print(exc)
policy.toml: [x] has no key 'hold' (known: enabled, hold_s)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Set
from typing import Any


class PolicyError(ValueError):
    """A policy file that cannot be used; the text names the file and the key."""


def table(obj: Any, source: str, where: str) -> Mapping[str, Any]:
    """``obj`` as a TOML table, or a ``PolicyError`` naming ``where``."""
    if not isinstance(obj, Mapping):
        raise PolicyError(f"{source}: {where} must be a table")
    return obj


def check_keys(obj: Mapping[str, Any], known: Set[str], source: str, where: str) -> None:
    for k in obj:
        if k not in known:
            raise PolicyError(f"{source}: {where} has no key {k!r} (known: {', '.join(sorted(known))})")


def build_section(cls: Any, obj: Any, source: str, where: str, base: Any = None,
                  positive: Set[str] = frozenset()) -> Any:
    """``base`` (default ``cls()``) with the table's keys replaced, each checked against the field's type.

    Numbers must be non-negative; the names in ``positive`` must also be non-zero (divisors, windows).
    """
    tab = table(obj, source, where)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    check_keys(tab, set(fields), source, where)
    base = base if base is not None else cls()
    values: dict[str, Any] = {}
    for k, v in tab.items():
        want = type(getattr(base, k))
        if getattr(base, k) is None or want is float:
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise PolicyError(f"{source}: {where} {k} must be a non-negative number, got {v!r}")
            v = float(v)
        elif want is int:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise PolicyError(f"{source}: {where} {k} must be a non-negative integer, got {v!r}")
        elif want is bool:
            if not isinstance(v, bool):
                raise PolicyError(f"{source}: {where} {k} must be true or false, got {v!r}")
        elif not isinstance(v, want):
            raise PolicyError(f"{source}: {where} {k} must be a {want.__name__}, got {v!r}")
        if k in positive and v == 0:
            raise PolicyError(f"{source}: {where} {k} must be greater than 0")
        values[k] = v
    return dataclasses.replace(base, **values)
