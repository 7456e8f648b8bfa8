"""The robust baseline of ``streams.detect.drift``: a median buffer of accepted values and its noise.

Which values are accepted, and when the buffer is re-learnt, is ``streams.detect.drift``'s
business (see docs/drift.md); this holds the last ``cap`` of them twice, in
arrival order (so the oldest can age out) and sorted (so the median and the quartiles
are O(1) to read and a value costs O(log N) to add).

>>> b = Baseline(cap=4, need=3)
>>> for v in (1.0, 2.0):
...     b.accept(v)
>>> b.value is None  # fewer than ``need`` values: not ready
True
>>> for v in (3.0, 4.0, 5.0):  # 1.0 ages out
...     b.accept(v)
>>> b.value, b.values()
(3.5, [2.0, 3.0, 4.0, 5.0])
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable


def median(s: list[float]) -> float:
    """The median of a sorted, non-empty list."""
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


class Baseline:
    """The last ``cap`` accepted values; a baseline once it holds ``need`` of them."""

    __slots__ = ("_sorted", "_values", "cap", "need")

    def __init__(self, cap: int, need: int) -> None:
        self.cap, self.need = cap, need
        self._values: deque[float] = deque(maxlen=cap)
        self._sorted: list[float] = []  # the same values, sorted, for an O(1) median and quartiles

    def __len__(self) -> int:
        return len(self._sorted)

    @property
    def value(self) -> float | None:
        """The median, or None while fewer than ``need`` values are held."""
        return None if len(self._sorted) < self.need else median(self._sorted)

    @property
    def noise(self) -> float | None:
        """Per-tick noise relative to the baseline (interquartile range / 1.349 / median), or None.

        The IQR rather than a standard deviation: robust to the outliers a median buffer
        keeps, and it still includes whatever the workload itself wobbles.
        """
        s, n = self._sorted, len(self._sorted)
        base = self.value
        if base is None or base <= 0:
            return None
        return (s[(3 * n) // 4] - s[n // 4]) / 1.349 / base

    def median(self) -> float:
        """The median of what is held, ready or not (it must hold something)."""
        return median(self._sorted)

    def accept(self, value: float) -> None:
        if len(self._values) == self.cap:  # the deque drops its oldest on append: drop it from the sorted copy too
            old = self._values[0]
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._values.append(value)
        bisect.insort(self._sorted, value)

    def reset(self, values: Iterable[float]) -> None:
        """Hold these values (the last ``cap`` of them) instead of what was held."""
        self._values = deque(values, maxlen=self.cap)
        self._sorted = sorted(self._values)

    def values(self) -> list[float]:
        """The values held, oldest first (for a snapshot)."""
        return list(self._values)

    def lengths(self) -> tuple[int, int]:
        """(values, sorted copy) held, which must stay equal and bounded by ``cap``."""
        return len(self._values), len(self._sorted)
