"""What every leak detector shares: the event it emits, the hold/clear hysteresis, a frame's price.

>>> ep = Episode(hold_ns=2, clear_ns=2)
>>> [ep.step(t, bad) for t, bad in enumerate([True, True, True, False, None, False, False])]
[None, None, 'fire', None, None, 'resolve', None]
>>> ep.onset_ns is None
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from schemas.frame_messages import GpuFrame

EvidenceValue = int | float | str | bool | None
Step = Literal["fire", "resolve"]
S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class LeakEvent:
    """One state change of one leak episode on one GPU (or a node's ``"host"``)."""

    rule: str
    state: Literal["firing", "resolved"]
    onset_ns: int  # where the episode began: the alert id's onset
    tick_ns: int  # the tick that confirmed or ended it
    value: float
    threshold: float
    baseline: float | None = None
    evidence: Mapping[str, EvidenceValue] = field(default_factory=dict)


class Episode:
    """Hysteresis over a per-tick verdict: fire after ``hold_ns`` of bad ticks in a row (from the first
    one, the onset), resolve after ``clear_ns`` of good ones. ``None`` (no data) changes nothing."""

    __slots__ = ("_bad_since", "_good_since", "clear_ns", "hold_ns", "last_onset_ns", "onset_ns")

    def __init__(self, hold_ns: int, clear_ns: int) -> None:
        self.hold_ns, self.clear_ns = hold_ns, clear_ns
        self.onset_ns: int | None = None  # set while firing
        self.last_onset_ns = 0  # the latest episode's onset, kept after it resolved (its resolved message's id)
        self._bad_since: int | None = None
        self._good_since: int | None = None

    @property
    def firing(self) -> bool:
        return self.onset_ns is not None

    @property
    def pending_onset(self) -> int | None:
        """The first bad tick of the current run (firing or not)."""
        return self.onset_ns if self.onset_ns is not None else self._bad_since

    def step(self, t_ns: int, bad: bool | None) -> Step | None:
        if bad is None:
            return None
        if bad:
            self._good_since = None
            if self._bad_since is None:
                self._bad_since = t_ns
            if self.onset_ns is None and t_ns - self._bad_since >= self.hold_ns:
                self.onset_ns = self.last_onset_ns = self._bad_since
                return "fire"
            return None
        self._bad_since = None if self.onset_ns is None else self._bad_since
        if self.onset_ns is None:
            return None
        if self._good_since is None:
            self._good_since = t_ns
        if t_ns - self._good_since >= self.clear_ns:
            self.onset_ns = self._bad_since = self._good_since = None
            return "resolve"
        return None

    def reset(self) -> None:
        self.onset_ns = self._bad_since = self._good_since = None


def value(g: GpuFrame, column: str) -> float | None:
    """A sampled aggregate of the frame, None where the cell was empty."""
    v = g.values.get(column)
    return v if v is not None and math.isfinite(v) else None


def price_per_h(g: GpuFrame, grid_ns: int) -> float | None:
    """The GPU's hourly price as the frame's derived cost says (None without a price)."""
    cost = g.derived.get("cost_usd")
    if cost is None or not math.isfinite(cost):
        return None
    return cost * 3600.0 * S / grid_ns


def burn(price_h: float | None, share: float) -> float | None:
    """USD per hour that ``share`` of the GPU-hour wastes (``evidence.cost_usd_per_h``)."""
    if price_h is None:
        return None
    return round(price_h * min(1.0, max(0.0, share)), 4)


def rounded(v: float | None, digits: int = 3) -> float | None:
    """``v`` rounded for evidence, None kept."""
    return None if v is None else round(v, digits)


def util_drop(base_util: float | None, util_now: float | None) -> float:
    """The share of the GPU's own busy time lost: 1 - now / baseline (0 when it did not fall)."""
    if base_util is None or util_now is None or base_util <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - util_now / base_util))
