"""The parameters of efficiency drift (``streams.detect.drift``) and the River detector they choose.

What each parameter means for the rule is in docs/drift.md.

>>> p = DriftParams()
>>> p.drop, p.hold_ns, p.run_limit_ns, p.sizes(1_000_000_000)
(0.12, 3000000000, 30000000000, (60, 20))
>>> DriftParams(floor=0.2)
Traceback (most recent call last):
...
ValueError: floor must be in (0, drop=0.12), got 0.2
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from streams.detect.change import ChangeDetector, check_detector, make_detector


@dataclass(frozen=True, slots=True)
class DriftParams:
    drop: float = 0.12  # a drop at least this deep (fraction below baseline), held for hold_ns, must alert
    floor: float = 0.10  # a drop shallower than this must never alert
    hold_ns: int = 3_000_000_000  # how long the drop must persist (event time)
    baseline_ns: int = 60_000_000_000  # baseline = median over this much accepted history
    min_baseline_ns: int = 20_000_000_000  # no detection before this much baseline history
    # Depth test: deeper than the floor by this many standard errors of the run's level (and than the midpoint).
    confidence_z: float = 2.33
    # Duration: accept hold_ns minus this many errors of the estimate while they fit in max_tolerance_ns (tapering
    # to none at twice that); fractions this many errors from 0 or 1 count as 0 or (inner ticks) 1.
    edge_z: float = 2.0
    max_tolerance_ns: int = 100_000_000
    max_gap_ns: int = 250_000_000  # high ticks spanning at most this much do not end a run (or a recovery)
    max_run_ns: int | None = None  # a run unconfirmed after this much goes to the baseline (None: 10 holds)
    detector: Literal["page_hinkley", "adwin"] = "page_hinkley"
    # PageHinkley on value/baseline ratios: a 12% drop moves its sum ~0.11 per tick, so
    # 0.3 is crossed in ~3 ticks, while with 2% noise a false crossing needs ~10^6 ticks.
    ph_delta: float = 0.01
    ph_threshold: float = 0.3
    ph_min_instances: int = 10
    adwin_delta: float = 0.002
    # The load-conditioned norm (streams.detect.load_curve), used when ticks carry their power: bands of this
    # relative width of power, each ready after load_need_ns of healthy ticks and holding at most load_cap.
    load_band: float = 0.03
    load_need_ns: int = 5_000_000_000
    load_cap: int = 64
    # A tick is a load transition, neither judged nor learnt, when the trend of its power over the last
    # load_move_ns would move it by more than load_move (relative) within load_lag_ns, the time the power
    # lags the work by: its FLOPS/W then matches no steady load.
    load_move: float = 0.03
    load_move_ns: int = 2_000_000_000
    load_lag_ns: int = 500_000_000

    def __post_init__(self) -> None:
        if not 0 < self.drop < 1:
            raise ValueError(f"drop must be a fraction in (0, 1), got {self.drop}")
        if not 0 < self.floor < self.drop:
            raise ValueError(f"floor must be in (0, drop={self.drop}), got {self.floor}")
        if self.hold_ns <= 0:
            raise ValueError(f"hold_ns must be > 0, got {self.hold_ns}")
        if not 0 < self.min_baseline_ns <= self.baseline_ns:
            raise ValueError("need 0 < min_baseline_ns <= baseline_ns")
        if not (self.confidence_z >= 0 and self.edge_z >= 0):
            raise ValueError("confidence_z and edge_z must be >= 0")
        if not 0 <= self.max_tolerance_ns < self.hold_ns:
            raise ValueError("need 0 <= max_tolerance_ns < hold_ns")
        if not 0 <= self.max_gap_ns < self.hold_ns:
            raise ValueError("need 0 <= max_gap_ns < hold_ns")
        if self.max_run_ns is not None and self.max_run_ns < self.hold_ns:
            raise ValueError("max_run_ns must be >= hold_ns")
        if self.detector not in ("page_hinkley", "adwin"):
            raise ValueError(f"detector must be 'page_hinkley' or 'adwin', got {self.detector!r}")
        if not 0 < self.load_band < 1 or self.load_need_ns <= 0 or self.load_cap < 3:
            raise ValueError("need 0 < load_band < 1, load_need_ns > 0 and load_cap >= 3")
        if not self.load_move > 0 or self.load_move_ns <= 0 or self.load_lag_ns <= 0:
            raise ValueError("need load_move > 0, load_move_ns > 0 and load_lag_ns > 0")
        # The detectors validate their own parameters: a bad one fails here, not at the first frame.
        kind, params = _detector_args(self)
        check_detector(kind, **params)

    @property
    def run_limit_ns(self) -> int:
        """How long a run may stay open unconfirmed."""
        return 10 * self.hold_ns if self.max_run_ns is None else self.max_run_ns

    @property
    def low(self) -> float:
        """A tick is low (starts or extends a run) below ``baseline * (1 - low)``; back up at or above."""
        return self.floor / 2

    @property
    def mid(self) -> float:
        """The least depth a run's level must have to confirm (more when noise demands it)."""
        return (self.drop + self.floor) / 2

    def sizes(self, grid_ns: int) -> tuple[int, int]:
        """(baseline buffer length, values needed before detecting) at this grid."""
        if grid_ns <= 0:
            raise ValueError(f"grid_ns must be > 0, got {grid_ns}")
        if self.baseline_ns < grid_ns:
            raise ValueError("baseline_ns must span at least one grid tick")
        return self.baseline_ns // grid_ns, min(self.baseline_ns // grid_ns, -(-self.min_baseline_ns // grid_ns))

    def curve_sizes(self, grid_ns: int) -> tuple[int, int]:
        """(pairs held per load band, pairs that make it ready) at this grid."""
        need = min(max(3, -(-self.load_need_ns // grid_ns)), self.load_cap)
        return max(need, min(self.baseline_ns // grid_ns, self.load_cap)), need


def detector_for(p: DriftParams) -> ChangeDetector:
    """A fresh River change detector as the parameters say."""
    kind, params = _detector_args(p)
    return make_detector(kind, **params)


def _detector_args(p: DriftParams) -> tuple[Literal["page_hinkley", "adwin"], dict[str, Any]]:
    if p.detector == "adwin":
        return "adwin", {"delta": p.adwin_delta}
    return "page_hinkley", {"delta": p.ph_delta, "threshold": p.ph_threshold, "min_instances": p.ph_min_instances}
