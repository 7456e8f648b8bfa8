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
from statistics import median


class Recent:
    """The values of the ticks within ``span_ns`` of the latest one."""

    __slots__ = ("_sum", "_t", "_v", "span_ns")

    def __init__(self, span_ns: int) -> None:
        self.span_ns = span_ns
        self._t: deque[int] = deque()
        self._v: deque[float] = deque()
        self._sum = 0.0  # kept as items come and go; re-summed now and then against drift

    def add(self, t_ns: int, v: float) -> None:
        times, vals = self._t, self._v
        times.append(t_ns)
        vals.append(v)
        self._sum += v
        cut = t_ns - self.span_ns
        while times[0] <= cut:
            times.popleft()
            self._sum -= vals.popleft()
        if len(vals) == 1:
            self._sum = v

    def values(self) -> list[float]:
        return list(self._v)

    def median(self) -> float | None:
        # A sort of a few hundred floats beats numpy's median on so few (no array to build).
        return float(median(self._v)) if self._v else None

    def total(self) -> float:
        return self._sum

    def mean(self) -> float | None:
        return self._sum / len(self._v) if self._v else None

    def __len__(self) -> int:
        return len(self._v)

    @property
    def covered_ns(self) -> int:
        """From the oldest to the newest tick held, one tick included (0 when empty)."""
        if not self._t:
            return 0
        return self._t[-1] - self._t[0] + 1


class Slots:
    """Means of ``slot_ns`` slots over the last ``span_ns``: a long past in a few numbers."""

    __slots__ = ("_done_t", "_done_v", "_n", "_slot", "_sum", "slot_ns")

    def __init__(self, slot_ns: int, span_ns: int) -> None:
        self.slot_ns = slot_ns
        keep = max(1, span_ns // slot_ns)
        self._done_t: deque[int] = deque(maxlen=keep)
        self._done_v: deque[float] = deque(maxlen=keep)
        self._slot: int | None = None
        self._sum = 0.0
        self._n = 0

    def add(self, t_ns: int, v: float) -> bool:
        """Add one tick's value; True when it closed a slot."""
        slot = t_ns // self.slot_ns
        closed = False
        if slot != self._slot:
            prev = self._slot
            if prev is not None and self._n:
                self._done_t.append(prev * self.slot_ns)
                self._done_v.append(self._sum / self._n)
                closed = True
            self._sum, self._n = 0.0, 0
            self._slot = slot
        self._sum += v
        self._n += 1
        return closed

    def means(self) -> list[float]:
        return list(self._done_v)

    def times(self) -> list[int]:
        return list(self._done_t)

    def median(self) -> float | None:
        return float(median(self._done_v)) if self._done_v else None

    @property
    def covered_ns(self) -> int:
        return len(self._done_v) * self.slot_ns
