"""Bounded time windows the leak detectors keep per GPU: the latest ticks, and slot averages of a longer past.

>>> w = Recent(span_ns=3)
>>> for t, v in enumerate([1.0, 5.0, 2.0, 9.0]):
...     w.add(t, v)
>>> w.values(), w.median(), w.covered_ns
([5.0, 2.0, 9.0], 5.0, 3)
>>> s = Slots(slot_ns=10, span_ns=30)
>>> for t in range(0, 45, 5):
...     _ = s.add(t, float(t))
>>> s.means()  # three slots kept; the open one (40..) is not yet a mean
[12.5, 22.5, 32.5]
"""

from __future__ import annotations

from collections import deque

import numpy as np


class Recent:
    """The values of the ticks within ``span_ns`` of the latest one."""

    __slots__ = ("_items", "_sum", "span_ns")

    def __init__(self, span_ns: int) -> None:
        self.span_ns = span_ns
        self._items: deque[tuple[int, float]] = deque()
        self._sum = 0.0  # kept as items come and go; re-summed now and then against drift

    def add(self, t_ns: int, v: float) -> None:
        items = self._items
        items.append((t_ns, v))
        self._sum += v
        while items and items[0][0] <= t_ns - self.span_ns:
            self._sum -= items.popleft()[1]
        if not items or len(items) == 1:
            self._sum = sum(x for _, x in items)

    def values(self) -> list[float]:
        return [v for _, v in self._items]

    def median(self) -> float | None:
        return float(np.median(self.values())) if self._items else None

    def total(self) -> float:
        return self._sum

    def mean(self) -> float | None:
        return self.total() / len(self._items) if self._items else None

    def __len__(self) -> int:
        return len(self._items)

    @property
    def covered_ns(self) -> int:
        """From the oldest to the newest tick held, one tick included (0 when empty)."""
        if not self._items:
            return 0
        return self._items[-1][0] - self._items[0][0] + 1


class Slots:
    """Means of ``slot_ns`` slots over the last ``span_ns``: a long past in a few numbers."""

    __slots__ = ("_done", "_n", "_slot", "_sum", "slot_ns")

    def __init__(self, slot_ns: int, span_ns: int) -> None:
        self.slot_ns = slot_ns
        self._done: deque[tuple[int, float]] = deque(maxlen=max(1, span_ns // slot_ns))
        self._slot: int | None = None
        self._sum = 0.0
        self._n = 0

    def add(self, t_ns: int, v: float) -> bool:
        """Add one tick's value; True when it closed a slot."""
        slot = t_ns // self.slot_ns
        closed = False
        if self._slot is not None and slot != self._slot:
            if self._n:
                self._done.append((self._slot * self.slot_ns, self._sum / self._n))
                closed = True
            self._sum, self._n = 0.0, 0
        self._slot = slot
        self._sum += v
        self._n += 1
        return closed

    def means(self) -> list[float]:
        return [v for _, v in self._done]

    def times(self) -> list[int]:
        return [t for t, _ in self._done]

    def median(self) -> float | None:
        return float(np.median(self.means())) if self._done else None

    @property
    def covered_ns(self) -> int:
        return len(self._done) * self.slot_ns
