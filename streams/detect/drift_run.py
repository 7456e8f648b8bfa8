"""The open run of ``streams.detect.drift``: its ticks, level, depth test, edge estimates, confirmation.

What a run is, and why each rule is as it is (low ticks, bridging, level, depth test,
head cut, sub-tick duration, tolerance), is in docs/drift.md; this
module holds the run's state and judges it. It never touches the baseline or the alert:
``Run.judge`` returns a ``Confirmation`` and ``streams.detect.drift.EfficiencyDrift`` acts on it,
so the order in which values teach the baseline stays in one place.

>>> from streams.detect.drift_params import DriftParams
>>> p = DriftParams(hold_ns=3, baseline_ns=10, min_baseline_ns=5, max_gap_ns=0, max_tolerance_ns=0, max_run_ns=10)
>>> r = Run()
>>> for t in range(8, 11):
...     r.add_low((t, 0.5, False))
>>> c = r.judge(p, 1, base=1.0, sigma=0.01, baseline_n=8, tick_ns=10, value=0.5, river_ns=None)
>>> c is not None and (c.onset_ns, c.evidence["held_estimate_ns"], c.level)
(8, 3, [0.5, 0.5, 0.5])
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streams.detect.drift_baseline import median
from streams.detect.drift_params import DriftParams

Tick = tuple[int, float, bool]  # (tick_ns, value, suspect)
_HALF_PI = math.pi / 2
_SQRT2 = math.sqrt(2.0)


@dataclass(frozen=True, slots=True)
class Confirmation:
    """A run confirmed as a drop: what the firing event and the new alert are made of."""

    onset_ns: int  # start of the first judged tick (a plain tick time: it is part of the alert id)
    level_ns: int  # where the new level starts (onset, or River's firing inside the run)
    level: list[float]  # accepted-quality values since level_ns
    head: list[float]  # accepted-quality values of the cut head: noise, to teach the baseline
    evidence: dict[str, float | int | str]


def depth_test(p: DriftParams, base: float, level: float, n: int, sigma: float,
               baseline_n: int) -> tuple[float, float] | None:
    """(depth, depth needed) if a run level from ``n`` ticks, against ``baseline_n`` values, is deep enough."""
    depth = (base - level) / base
    se = sigma * math.sqrt((_HALF_PI if n > 2 else 1.0) / n + _HALF_PI / baseline_n)
    need = max(p.mid, p.floor + p.confidence_z * se)
    return (depth, need) if depth >= need and depth > 0 else None


class Run:
    """An open run of low ticks (empty when none is open)."""

    __slots__ = ("inner", "pending", "prev", "river_ns", "ticks")

    def __init__(self) -> None:
        self.ticks: list[Tick] = []  # its first low tick .. its last low tick
        self.pending: list[Tick] = []  # high ticks after the last low one (bridged if a low one follows)
        self.inner: list[float] = []  # values of ticks[1:-1], sorted (the level), kept as the run grows
        self.prev: float | None = None  # value of the tick just before the first, if valued
        self.river_ns: int | None = None  # River's first firing during the run

    def __bool__(self) -> bool:
        return bool(self.ticks)

    def __len__(self) -> int:
        return len(self.ticks) + len(self.pending)

    def add_low(self, tick: Tick) -> None:
        """A low tick: the pending high ticks are bridged, and the previous last tick becomes inner."""
        if len(self.ticks) >= 2:
            bisect.insort(self.inner, self.ticks[-1][1])
        for p in self.pending:
            bisect.insort(self.inner, p[1])
        self.ticks += self.pending
        self.pending = []
        self.ticks.append(tick)

    def drain(self) -> list[Tick]:
        """All its ticks, in order (the run ends), leaving it empty."""
        ticks = self.ticks + self.pending
        self.clear()
        return ticks

    def clear(self) -> None:
        self.ticks, self.pending, self.inner = [], [], []
        self.prev, self.river_ns = None, None

    def snapshot(self) -> dict[str, Any]:
        return {"run": [list(t) for t in self.ticks], "pending": [list(t) for t in self.pending],
                "run_prev": self.prev, "run_river_ns": self.river_ns}

    @classmethod
    def restore(cls, snap: Mapping[str, Any]) -> Run:
        """From ``snapshot()`` (its keys may sit in a larger mapping); ``inner`` is derived, not stored."""
        r = cls()
        r.ticks = [(int(t), float(v), bool(s)) for t, v, s in snap["run"]]
        r.pending = [(int(t), float(v), bool(s)) for t, v, s in snap["pending"]]
        r.inner = sorted(v for _, v, _ in r.ticks[1:-1])
        r.prev = None if snap["run_prev"] is None else float(snap["run_prev"])
        r.river_ns = snap["run_river_ns"]
        return r

    def judge(self, p: DriftParams, grid_ns: int, base: float, sigma: float, baseline_n: int, tick_ns: int,
              value: float, river_ns: int | None) -> Confirmation | None:
        """The confirmation if the run, whose last low tick is the current one, is confirmed (else None).

        ``baseline_n`` is how many values the baseline holds (its error enters the depth
        test); ``river_ns`` is River's latest firing at any tick.
        """
        g = grid_ns
        run, prev, inner = self.ticks, self.prev, self.inner
        level = median(inner) if inner else median(sorted(v for _, v, _ in run))
        if depth_test(p, base, level, len(inner) or len(run), sigma, baseline_n) is None:
            return None
        # A run can open on noise shortly before a drop (or a dip) and bridge into it. The drop starts where
        # the suffix sum of (midpoint - value) is largest (the CUSUM change point): judge from there.
        midpoint = (base + level) / 2
        acc, best, start = 0.0, -math.inf, 0
        for j in range(len(run) - 1, -1, -1):
            acc += midpoint - run[j][1]
            if acc >= best:
                best, start = acc, j
        head = run[:start]
        if start:
            prev = head[-1][1] if head[-1][0] == run[start][0] - g else None
            run = run[start:]
            inner = sorted(v for _, v, _ in run[1:-1])
            level = median(inner) if inner else median(sorted(v for _, v, _ in run))
        n = len(inner) or len(run)
        test = depth_test(p, base, level, n, sigma, baseline_n)
        if test is None:
            return None
        depth, need = test
        drop_abs = base - level
        edge = sigma / depth  # the error of one tick's dropped fraction
        # edge_z errors of the duration while they fit in max_tolerance_ns, tapering to none at twice that:
        # edges that blurred cannot tell a 3 s drop from a shorter dip, and then no dip gets the benefit.
        spread = p.edge_z * g * edge * _SQRT2
        tolerance = max(0.0, min(spread, 2.0 * p.max_tolerance_ns - spread))
        first_ns, first_v, _ = run[0]
        if tick_ns + g - first_ns + (g if prev is not None else 0) < p.hold_ns - tolerance:
            return None  # too short whatever the fractions are
        # A fraction within edge_z errors of 0 is taken as 0: noise on an untouched tick next to the run (or a
        # noise-low tick that ends it) must not lengthen it. Near 1 the clip already errs short.
        zero = min(p.edge_z * edge, 0.5)

        def frac(v: float) -> float:
            r = (base - v) / drop_abs
            return 0.0 if r <= zero else 1.0 if r >= 1.0 else r

        # An inner tick counts as fully dropped unless it is clearly not (a bridged high tick, or the partial
        # last tick of a dip that a noisy tick after it extended): then only its dropped fraction counts. When
        # the first tick looks full, the tick before it (not in the run, or cut off it) may hold the onset.
        full = 1.0 - p.edge_z * edge
        onset_est = first_ns + g * (1.0 - frac(first_v))
        if prev is not None and (base - first_v) / drop_abs >= full:
            onset_est -= g * frac(prev)
        end_est = tick_ns + g * frac(value)
        undropped = 0.0
        for _, v, _ in run[1:-1]:
            if (base - v) / drop_abs < full:
                undropped += 1.0 - frac(v)
        held_est = end_est - onset_est - g * undropped
        if held_est < p.hold_ns - tolerance:
            return None
        onset = first_ns
        evidence: dict[str, float | int | str] = {
            "held_ns": tick_ns + g - onset, "held_estimate_ns": round(held_est), "onset_estimate_ns": round(onset_est),
            "tolerance_ns": round(tolerance), "ticks_below": sum(v < base * (1 - p.low) for _, v, _ in run),
            "level": level, "depth": depth, "depth_needed": need, "noise": sigma, "detector": p.detector}
        river_in = self.river_ns if self.river_ns is not None and self.river_ns >= onset else None
        if river_in is not None:
            evidence["river_onset_ns"] = river_in
        if river_ns is not None and river_ns >= onset - p.baseline_ns:
            evidence["river_last_ns"] = river_ns  # it may have seen the change before the run began
        level_ns = onset if river_in is None else river_in
        return Confirmation(onset, level_ns, [v for t, v, s in run if t >= level_ns and not s],
                            [v for _, v, s in head if not s], evidence)
