"""The aligner's contract: its settings, what it is told after a restart, and what an advance returns."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from streams.align.aggregate import FrameBatch


@dataclass(frozen=True, slots=True)
class AlignParams:
    """Grid and lateness settings (all in nanoseconds).

    >>> AlignParams().grid_ns
    1000000000
    """

    grid_ns: int = 1_000_000_000
    allowed_lateness_ns: int = 2_000_000_000
    idle_ns: int = 15_000_000_000  # quiet time after which a stream that fell behind stops holding
    step_idle_ns: int = 500_000_000  # the same for a per-step stream, which pauses with its job
    max_open_ticks: int = 3_600
    max_open_samples: int = 4_000_000  # ~200 MB of open samples; beyond it the oldest ticks close
    forget_ns: int = 3_600_000_000_000  # a node quiet this long, with nothing open, is forgotten (streams.align.forget)
    remember_ns: int = 7 * 86_400_000_000_000  # how long (event time) a forgotten node's closed tick is kept

    def __post_init__(self) -> None:
        if not 100_000_000 <= self.grid_ns <= 60_000_000_000:
            raise ValueError("grid_ns must be between 100 ms and 60 s")
        if self.allowed_lateness_ns < 0:
            raise ValueError("allowed_lateness_ns must be >= 0")
        if self.idle_ns <= 0 or self.step_idle_ns <= 0:
            raise ValueError("idle_ns and step_idle_ns must be > 0")
        if self.max_open_ticks < 1 or self.max_open_samples < 1:
            raise ValueError("max_open_ticks and max_open_samples must be >= 1")
        if self.forget_ns < self.idle_ns:
            raise ValueError("forget_ns must be at least idle_ns")
        if self.remember_ns < self.forget_ns:
            raise ValueError("remember_ns must be at least forget_ns")


@dataclass(frozen=True, slots=True)
class LateSamples:
    """Samples of one ``add`` call that fell in cells already written."""

    source: Hashable
    position: int
    indices: list[int]  # into that call's ts_ns / values
    total: int  # samples in that call
    # Why: "disorder" (older than its own series' newest by more than the lateness less the series'
    # reach, ``streams.align.holds``), "cap" (its
    # cells closed early to keep max_open_samples) or "idle" (they closed while its series or
    # source counted as idle, or by the max_open_ticks cap).
    why: str = field(default="idle", compare=False)


@dataclass(frozen=True, slots=True)
class Advance:
    frames: FrameBatch
    late: list[LateSamples]


@dataclass(frozen=True, slots=True)
class Recovered:
    """What durable storage says about a node, so a restarted aligner neither repeats nor forgets.

    ``boundaries``: per node, the newest tick already written (ticks up to it are final).
    ``counters``: the last raw value of each (node, gpu, sensor index) counter series.
    """

    boundaries: Mapping[str, int] = field(default_factory=dict)
    counters: Mapping[tuple[str, str, int], float] = field(default_factory=dict)
