"""Small event-time building blocks of the decision rules: held conditions, windows, a token bucket.

All times are nanoseconds of event time (tick starts and ends), passed in: nothing
here reads a clock, so a replay of the same ticks gives the same answers.

>>> h = Held(grid_ns=10)
>>> [h.update(t, c) for t, c in [(0, True), (10, True), (20, False), (30, True)]]
[10, 20, 0, 10]
>>> w = Window(window_ns=30, grid_ns=10)
>>> for t, v in [(0, 1.0), (10, 2.0), (20, 3.0), (30, 4.0)]:
...     w.add(t, v)
>>> w.values(), w.covered()
([2.0, 3.0, 4.0], True)
>>> b = TokenBucket(per_ns=1 / 10, burst=2)
>>> [b.take(0, 1), b.take(0, 1), b.take(0, 1), b.take(10, 1)]
[True, True, False, True]
"""

from __future__ import annotations

import math
from collections import deque


class Held:
    """How long (ns, to the end of the latest tick) a condition has held on consecutive ticks."""

    __slots__ = ("grid_ns", "last", "since")

    def __init__(self, grid_ns: int) -> None:
        self.grid_ns = grid_ns
        self.since: int | None = None
        self.last: int | None = None

    def update(self, tick_ns: int, holds: bool) -> int:
        gap = self.last is not None and tick_ns - self.last > self.grid_ns  # a missing tick breaks the run
        self.last = tick_ns
        if not holds:
            self.since = None
            return 0
        if self.since is None or gap:
            self.since = tick_ns
        return tick_ns + self.grid_ns - self.since

    def reset(self) -> None:
        self.since = self.last = None


class Window:
    """The values of the ticks ending within the last ``window_ns``; missing values are not kept."""

    __slots__ = ("_items", "first", "grid_ns", "newest", "window_ns")

    def __init__(self, window_ns: int, grid_ns: int) -> None:
        self.window_ns = window_ns
        self.grid_ns = grid_ns
        self._items: deque[tuple[int, float]] = deque()
        self.newest: int | None = None
        self.first: int | None = None  # first tick since the last reset: the window must be spanned

    def add(self, tick_ns: int, value: float | None) -> None:
        self.newest = tick_ns
        if self.first is None:
            self.first = tick_ns
        if value is not None:
            self._items.append((tick_ns, value))
        start = tick_ns + self.grid_ns - self.window_ns
        while self._items and self._items[0][0] < start:
            self._items.popleft()

    def values(self) -> list[float]:
        return [v for _, v in self._items]

    def covered(self, fraction: float = 0.9) -> bool:
        """The window has elapsed since the first tick, and at least ``fraction`` of its ticks have a value."""
        if self.first is None or self.newest is None or self.newest + self.grid_ns - self.first < self.window_ns:
            return False
        need = max(1, math.ceil(fraction * self.window_ns / self.grid_ns))
        return len(self._items) >= need

    def p95(self) -> float | None:
        """Nearest-rank 95th percentile, or None when the window is not covered."""
        if not self.covered():
            return None
        xs = sorted(self.values())
        return xs[max(0, math.ceil(0.95 * len(xs)) - 1)]

    def mean(self) -> float | None:
        if not self.covered():
            return None
        xs = self.values()
        return sum(xs) / len(xs)

    def reset(self) -> None:
        self._items.clear()
        self.first = self.newest = None


class TokenBucket:
    """Refills ``per_ns`` tokens per nanosecond of event time up to ``burst``; an action takes ``cost``."""

    __slots__ = ("burst", "last", "per_ns", "tokens")

    def __init__(self, per_ns: float, burst: float) -> None:
        self.per_ns = per_ns
        self.burst = burst
        self.tokens = burst
        self.last: int | None = None

    def take(self, now_ns: int, cost: float) -> bool:
        if self.last is not None and now_ns > self.last:
            self.tokens = min(self.burst, self.tokens + (now_ns - self.last) * self.per_ns)
        self.last = now_ns if self.last is None else max(self.last, now_ns)
        if self.tokens + 1e-9 < cost:
            return False
        self.tokens -= cost
        return True
