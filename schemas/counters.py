"""Running totals that a service reports: the one base of the stats objects.

A stats object is a slotted dataclass of counters; ``as_dict`` is what goes into the
service's JSON summary (mappings such as ``Counter`` as plain dicts, nested counters as
their own dicts). ``unreported`` names the fields left out of it.

>>> from collections import Counter
>>> from dataclasses import dataclass, field
>>> @dataclass(slots=True)
... class Seen(Counters):
...     lines: int = 0
...     by_kind: Counter[str] = field(default_factory=Counter)
>>> s = Seen(); s.lines += 2; s.by_kind["bad"] += 1
>>> s.as_dict()
{'lines': 2, 'by_kind': {'bad': 1}}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar


@dataclass(slots=True)
class Counters:
    """Base of a stats dataclass; see the module docstring."""

    unreported: ClassVar[frozenset[str]] = frozenset()

    def as_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name not in self.unreported}


def _plain(value: Any) -> Any:
    if isinstance(value, Counters):
        return value.as_dict()
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return value
