"""Efficiency drift per GPU: FLOPS/Watt below a robust baseline for a hold, in event time.

One ``EfficiencyDrift`` follows one GPU's ticks; ``streams.detect.drift_bank.DriftBank`` holds many.
The rules (baseline, run, level, depth test, head cut, duration, River, resolution) and why
each is as it is: docs/drift.md. Deterministic: the same ``update`` calls give the same
events, and ``restore(snapshot())`` continues exactly as the original would have.

>>> d = EfficiencyDrift(DriftParams(hold_ns=3, baseline_ns=10, min_baseline_ns=5, max_gap_ns=0,
...                                 max_tolerance_ns=0, max_run_ns=10), grid_ns=1)
>>> out = [d.update(t, 1.0, "job") for t in range(8)] + [d.update(t, 0.5, "job") for t in range(8, 12)]
>>> [(e.state, e.onset_ns, e.tick_ns, e.evidence["onset_estimate_ns"]) for evs in out for e in evs]
[('firing', 8, 10, 8)]
>>> [(e.state, e.evidence["reason"]) for e in d.update(12, 1.0, "other-job")]
[('resolved', 'workload_change')]
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from streams.detect.drift_alert import OpenAlert
from streams.detect.drift_baseline import Baseline
from streams.detect.drift_params import DriftParams, detector_for
from streams.detect.drift_run import Run
from streams.detect.load_curve import LoadCurve, LoadNorm

Evidence = Mapping[str, float | int | str]


@dataclass(frozen=True, slots=True)
class DriftEvent:
    state: Literal["firing", "resolved"]
    onset_ns: int  # start of the first low tick of the confirmed run; the same in firing and resolved
    tick_ns: int  # tick at which it was confirmed / resolved
    value: float  # flops_per_watt at tick_ns (the last known one when that tick has none)
    baseline: float  # the baseline the drop was measured against
    threshold: float  # baseline * (1 - drop)
    evidence: Evidence = field(default_factory=dict)
    # firing: the instant the hold completed, read from the ticks' sub-tick profiles (onset bucket + hold);
    # None: the end of ``tick_ns``, as a tick-level rule can say no better
    at_ns: int | None = None


class EfficiencyDrift:
    """Drift state of one GPU (see the module docstring for the rules)."""

    def __init__(self, params: DriftParams, grid_ns: int) -> None:
        self.params, self.grid_ns = params, grid_ns
        self._base = Baseline(*params.sizes(grid_ns))
        self._context: str | None = None
        self._last_ns: int | None = None  # newest tick taken
        self._valued_ns: int | None = None  # newest tick with a value
        self._prev: tuple[int, float] | None = None  # newest valued tick before the current one, and its value
        self._det = detector_for(params)
        self._run = Run()
        self._river_ns: int | None = None  # River's latest firing (any tick)
        self._alert: OpenAlert | None = None
        self._curve: LoadNorm = LoadCurve(params.load_band, *params.curve_sizes(grid_ns))
        self._loaded = False  # this context's ticks carry their power: values are judged against the curve
        self._pair: tuple[float, float] | None = None  # (power, FLOPS/W) of the current tick, when loaded
        self._pairs: dict[int, tuple[float, float]] = {}  # the same for the open run's ticks
        self._subs: dict[int, tuple[float | None, ...]] = {}  # the open run's sub-tick profiles (normalised)
        self._scale = 1.0  # the curve's norm at the latest judged tick (1 without load): back to FLOPS/W
        self._powers: deque[tuple[int, float]] = deque()  # (tick, log power) over the last load_move_ns
        # Healthy (power, FLOPS/W) learnt before the curve could judge them: once it can, they seed the
        # baseline (as value / norm), so a cold start learns in one baseline span, not in a band's plus that.
        self._unjudged: deque[tuple[float, float]] = deque(maxlen=self._base.cap)
        self.ignored = 0  # ticks not newer than the last one

    @property
    def baseline(self) -> float | None:
        """The current baseline, or None while fewer than ``min_baseline_ns`` of values are held."""
        return self._base.value

    @property
    def noise(self) -> float | None:
        """Per-tick noise relative to the baseline (interquartile range / 1.349 / median), or None."""
        return self._base.noise

    def update(self, tick_ns: int, value: float | None, context: str, suspect: bool = False,
               load: float | None = None, sub: Sequence[float | None] = ()) -> list[DriftEvent]:
        """Take one tick's FLOPS/W; ``load`` is its power (W), which makes the baseline load-conditioned;
        ``sub`` its FLOPS/W in equal sub-tick buckets, which times a confirmed hold to the bucket."""
        if self._last_ns is not None and tick_ns <= self._last_ns:
            self.ignored += 1
            return []
        self._last_ns = tick_ns
        out: list[DriftEvent] = []
        if context != self._context:
            if self._alert is not None:
                v = self._alert.value if value is None or not math.isfinite(value) or self._loaded else value
                out.append(self._resolve(tick_ns, v, {"reason": "workload_change"}))
            self._learn_from_scratch(context)
        if value is None or not math.isfinite(value):
            return out
        self._pair = None
        if load is not None and load > 0 and math.isfinite(load):
            self._loaded = True
            steady = self._steady_power(tick_ns, load)
            if steady is None:  # a load transition: neither judged nor learnt
                if self._alert is None:
                    self._drop_run()
                return out
            load = steady
            norm = self._curve.expected(load)
            if norm is None or norm <= 0:  # a load this GPU has not shown yet: learn it, judge nothing
                if self._alert is None and not self._run and not suspect:
                    self._curve.accept(load, value)
                    if self.baseline is None:
                        self._unjudged.append((load, value))
                return out
            if self._unjudged and self.baseline is None:
                self._seed_baseline()
            self._pair, self._scale = (load, value), norm
            sub = [None if x is None else x / norm for x in sub]
            value /= norm
        elif self._loaded:  # this context's ticks carry power: one without cannot be put on its curve
            return out
        if self._valued_ns is not None and tick_ns - self._valued_ns > self.params.hold_ns:
            self._end_run()  # too long without data to call it one run
            if self._alert is not None:
                self._alert.up_ns = self._alert.up_last_ns = None
        self._valued_ns = tick_ns
        prev, self._prev = self._prev, (tick_ns, value)
        base = self._alert.baseline if self._alert is not None else self.baseline
        if base is None or base <= 0:  # learning (a zero baseline cannot drop further)
            self._accept(value, self._pair, suspect)
            return out
        river = self._det.update(value / base)
        if river:
            self._river_ns = tick_ns
        if self._alert is not None:
            return out + self._while_open(tick_ns, value, suspect, river)
        low = value < base * (1 - self.params.low)
        run = self._run
        if not run:
            if not low:
                self._accept(value, self._pair, suspect)
                return out
            run.prev = prev[1] if prev is not None and prev[0] == tick_ns - self.grid_ns else None
        if river and run.river_ns is None:
            run.river_ns = tick_ns
        tick = (tick_ns, value, suspect)
        if self._pair is not None and not suspect:
            self._pairs[tick_ns] = self._pair
        if sub and not suspect:
            self._subs[tick_ns] = tuple(sub)
        if not low:
            run.pending.append(tick)
            if tick_ns - run.ticks[-1][0] > self.params.max_gap_ns:
                self._end_run()
        else:
            run.add_low(tick)
            ev = self._confirm(base, tick_ns, value)
            if ev is not None:
                return [*out, ev]
        if run and tick_ns + self.grid_ns - run.ticks[0][0] > self.params.run_limit_ns:
            self._end_run()
        return out

    def _confirm(self, base: float, tick_ns: int, value: float) -> DriftEvent | None:
        """The firing event if the open run, whose last low tick is the current one, is confirmed."""
        sigma = self.noise
        if sigma is None:
            return None
        c = self._run.judge(self.params, self.grid_ns, base, sigma, len(self._base), tick_ns, value, self._river_ns)
        if c is None:
            return None
        threshold = base * (1 - self.params.drop)
        for v in c.head:  # the cut head was noise: it teaches the baseline (which thaws after the alert)
            self._base.accept(v)
        for t, pair in self._pairs.items():
            if t < c.onset_ns:
                self._curve.accept(*pair)
        self._pairs.clear()
        at = self._confirmed_at(c.onset_ns, tick_ns, base, float(c.evidence["depth"]))
        self._subs.clear()
        self._alert = OpenAlert(c.onset_ns, base, threshold, value, c.level_ns, deque(c.level, maxlen=self._base.cap))
        self._run.clear()
        k = self._scale
        evidence = c.evidence
        if self._pair is not None:
            lo, hi = self._curve.bracket(self._pair[0]) or (self._pair[0], self._pair[0])
            evidence = {**evidence, "load_w": self._pair[0], "norm": k, "band_lo_w": lo, "band_hi_w": hi}
        return DriftEvent("firing", c.onset_ns, tick_ns, value * k, base * k, threshold * k, evidence, at)

    def _confirmed_at(self, onset_ns: int, tick_ns: int, base: float, depth: float) -> int | None:
        """When the hold completed, to the end of a sub-tick bucket: the drop's onset is in the bucket of
        the first tick from which the sum of (midpoint - value) over the rest of the tick is largest (a
        change point, robust to one noisy bucket), as far into it as its value says; the hold completes
        ``hold_ns`` later, if that lies in the current tick and its buckets up to there are, on average,
        below the midpoint. None without profiles, or when the hold completed before this tick (the rule
        needed this tick's depth: its end is the time)."""
        first, cur = self._subs.get(onset_ns), self._subs.get(tick_ns)
        if not first or not cur or len(first) != len(cur) or self.grid_ns % len(cur):
            return None
        n, step = len(cur), self.grid_ns // len(cur)
        # From the first judged tick only: an onset found in the tick before (which the rule cut as noise)
        # would put the hold's end before the tick that confirmed it, which the rule did not judge enough.
        mid = base * (1 - depth / 2)
        best, j, acc = 0.0, n, 0.0
        for i in range(n - 1, -1, -1):
            x = first[i]
            acc += 0.0 if x is None else mid - x
            if acc >= best and x is not None:
                best, j = acc, i
        if j == n:
            return None
        # The onset bucket is partly dropped as much as its value says (as the rule reads a partial tick).
        x, level = first[j], base * (1 - depth)
        f = 1.0 if x is None or base <= level else min(max((base - x) / (base - level), 0.0), 1.0)
        at = onset_ns + j * step + round(step * (1 - f)) + self.params.hold_ns
        if not tick_ns <= at <= tick_ns + self.grid_ns:
            return None
        k = min((at - tick_ns) // step + 1, n)  # the end of the bucket the estimate falls in: never early
        seen = [x for x in cur[:k] if x is not None]
        if k and (not seen or sum(seen) / len(seen) >= mid):
            return None
        return tick_ns + k * step

    def _while_open(self, tick_ns: int, value: float, suspect: bool, river: bool) -> list[DriftEvent]:
        a = self._alert
        assert a is not None
        evidence = a.observe(tick_ns, value, suspect, river, self.params, self.grid_ns, self._base.need)
        if evidence is None:
            return []
        if evidence["reason"] == "new_baseline":  # a permanent shift: the new level becomes the baseline
            self._base.reset(a.level)
            evidence["new_baseline"] = self._base.median()
        # River is reset either way: after a recovery its history holds the drop (the old baseline thaws
        # instead); after a new baseline it measured ratios to the old one.
        ev = self._resolve(tick_ns, value, evidence)
        self._det.reset()
        return [ev]

    def _resolve(self, tick_ns: int, value: float, evidence: dict[str, float | int | str]) -> DriftEvent:
        a = self._alert
        assert a is not None
        self._alert = None
        k = self._scale
        return DriftEvent("resolved", a.onset_ns, tick_ns, value * k, a.baseline * k, a.threshold * k, evidence)

    def _end_run(self) -> None:
        """An unconfirmed run ends: its values were noise, a dip or a shallow shift, and teach the baseline."""
        for t, v, s in self._run.drain():
            self._accept(v, self._pairs.get(t), s)
        self._pairs.clear()
        self._subs.clear()

    def _seed_baseline(self) -> None:
        for power, value in self._unjudged:
            norm = self._curve.expected(power)
            if norm is not None and norm > 0:
                self._base.accept(value / norm)
        self._unjudged.clear()

    def _steady_power(self, tick_ns: int, power: float) -> float | None:
        """The tick's power as the least-squares line through log power over the last ``load_move_ns`` (at
        least 3 ticks) puts it, or None while the load moves fast enough for the power's lag to matter
        (the line's slope times ``load_lag_ns`` exceeds ``load_move``).

        A line over several ticks rather than the change from the last one: a noisy reading then
        seldom looks like a transition, a load that moves all the time still does, and the curve is
        learnt and read at a power with a fraction of the reading's noise (noise in the power would
        otherwise shape the curve: a tick that reads low shows a high FLOPS/W)."""
        w = self._powers
        w.append((tick_ns, math.log(power)))
        while len(w) > 3 and w[0][0] < tick_ns - self.params.load_move_ns:
            w.popleft()
        n = len(w)
        if n < 3:
            return power
        mt = sum(t for t, _ in w) / n
        my = sum(y for _, y in w) / n
        sxx = sum((t - mt) ** 2 for t, _ in w)
        slope = sum((t - mt) * (y - my) for t, y in w) / sxx  # per ns
        if abs(slope) * self.params.load_lag_ns > self.params.load_move:
            return None
        return math.exp(my + slope * (tick_ns - mt))

    def _drop_run(self) -> None:
        """An unconfirmed run ends at a load transition: its ticks were judged at a load that was moving."""
        self._run.clear()
        self._pairs.clear()
        self._subs.clear()

    def _accept(self, value: float, pair: tuple[float, float] | None, suspect: bool) -> None:
        """A healthy tick teaches the baseline, and its (power, FLOPS/W) the load curve."""
        if suspect:
            return
        self._base.accept(value)
        if pair is not None:
            self._curve.accept(*pair)

    def _learn_from_scratch(self, context: str) -> None:
        self._context = context
        self._base.reset([])
        self._run.clear()
        self._prev, self._river_ns, self._alert = None, None, None
        self._det.reset()
        self._curve.reset()
        self._pairs.clear()
        self._subs.clear()
        self._powers.clear()
        self._unjudged.clear()
        self._loaded, self._scale = False, 1.0

    def buffer_lengths(self) -> dict[str, int]:
        """How many values each buffer holds (for checking that memory stays bounded)."""
        base, sorted_ = self._base.lengths()
        return {"baseline": base, "sorted": sorted_, "run": len(self._run),
                "level": 0 if self._alert is None else len(self._alert.level), "powers": len(self._powers),
                "pairs": len(self._pairs), "unjudged": len(self._unjudged), "subs": len(self._subs),
                "curve": sum(len(p) for _, p, _ in self._curve.snapshot())}

    def snapshot(self) -> dict[str, Any]:
        a = self._alert
        return {
            "context": self._context, "last_ns": self._last_ns, "valued_ns": self._valued_ns,
            "prev": None if self._prev is None else list(self._prev),
            "base": self._base.values(), **self._run.snapshot(), "river_ns": self._river_ns,
            "alert": None if a is None else a.snapshot(), "detector": self._det.snapshot(), "ignored": self.ignored,
            "curve": self._curve.snapshot(), "loaded": self._loaded, "scale": self._scale,
            "pairs": [[t, p, v] for t, (p, v) in self._pairs.items()], "powers": [list(x) for x in self._powers],
            "unjudged": [list(x) for x in self._unjudged],
            "subs": [[t, list(v)] for t, v in self._subs.items()],
        }

    @classmethod
    def restore(cls, params: DriftParams, grid_ns: int, snap: Mapping[str, Any]) -> EfficiencyDrift:
        d = cls(params, grid_ns)
        d._context, d._last_ns, d._valued_ns = snap["context"], snap["last_ns"], snap["valued_ns"]
        prev = snap["prev"]
        d._prev = None if prev is None else (int(prev[0]), float(prev[1]))
        d._base.reset(float(v) for v in snap["base"])
        d._run, d._river_ns = Run.restore(snap), snap["river_ns"]
        a = snap["alert"]
        d._alert = None if a is None else OpenAlert.restore(a, d._base.cap)
        d._det.load(snap["detector"])
        d.ignored = int(snap["ignored"])
        d._curve.load(snap.get("curve", []))
        d._loaded, d._scale = bool(snap.get("loaded", False)), float(snap.get("scale", 1.0))
        d._pairs = {int(t): (float(p), float(v)) for t, p, v in snap.get("pairs", [])}
        d._powers.extend((int(t), float(p)) for t, p in snap.get("powers", []))
        d._unjudged.extend((float(p), float(v)) for p, v in snap.get("unjudged", []))
        d._subs = {int(t): tuple(None if x is None else float(x) for x in v) for t, v in snap.get("subs", [])}
        return d
