"""The worker's clocks, injected: wall time (event-time limits, progress marks) and monotonic
time (flush intervals, quiet clocks, beacon waits, cooldowns). Tests drive both.

>>> t = ManualClock(wall_ns=5, mono_ns=1)
>>> t.advance(10); (t.wall_ns(), t.mono_ns())
(15, 11)
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def wall_ns(self) -> int: ...

    def mono_ns(self) -> int: ...


class SystemClock:
    def wall_ns(self) -> int:
        return time.time_ns()

    def mono_ns(self) -> int:
        return time.monotonic_ns()


SYSTEM_CLOCK: Clock = SystemClock()


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, wall_ns: int = 0, mono_ns: int = 0) -> None:
        self._wall, self._mono = wall_ns, mono_ns

    def wall_ns(self) -> int:
        return self._wall

    def mono_ns(self) -> int:
        return self._mono

    def advance(self, ns: int) -> None:
        self._wall += ns
        self._mono += ns
