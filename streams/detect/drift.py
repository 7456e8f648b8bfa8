"""Efficiency drift per GPU: FLOPS/Watt below a robust baseline for a hold, in event time.

One ``EfficiencyDrift`` follows one GPU's ticks (increasing ``tick_ns``; a tick not newer
than the last is ignored and counted, so a replay that overlaps what was seen is
harmless). ``DriftBank`` holds many, bounded.

The bar: a drop of at least ``drop`` (12%) lasting at least ``hold_ns`` (3 s) must alert;
a dip shorter than the hold, or a drop shallower than ``floor`` (10%), must not; noise
alone must (practically) never. Between ``floor`` and ``drop`` either answer is allowed,
and the rule spends that band on noise.

- **Baseline** ``B``: the median of the last ``baseline_ns / grid_ns`` accepted values.
  A value is accepted when it is not ``suspect`` and no alert is open; the values of an
  open run wait, and are accepted (in order) only if the run ends without confirming,
  so a drop never teaches itself while noise and dips still do (leaving them out would
  bias the median upwards). Gaps and suspect spells do not age it out; a new workload
  ``context`` does. Nothing is detected until it holds ``min_baseline_ns / grid_ns``
  values (after the start, a workload change, a re-learn). The per-tick noise ``sigma``
  (relative) is the baseline's interquartile range / 1.349 / ``B``: O(1) from the sorted
  buffer, robust to outliers, and it includes whatever the workload itself wobbles.
- **Run**: a tick is *low* when ``value < B * (1 - floor / 2)``, halfway to the floor: a
  tick of a 12% drop is low unless its noise exceeds 3.5 sigma at 2% per tick, and a
  partly covered first tick is caught early. A run starts at a low tick and goes on
  through high ticks spanning at most ``max_gap_ns`` (250 ms: one or two ticks bridge a
  noise spike at 100 ms, none at 1 s); it ends at a longer high spell, after more than
  ``hold_ns`` without any value, or unconfirmed after ``run_limit_ns`` (``max_run_ns``,
  by default 10 holds: 30 s).
- **Level**: the median of the run's inner ticks (all but the first and the current one,
  which are usually partly covered; all of them while there is no inner one), ``depth =
  1 - level / B``. A median because a run can hold a short deep dip next to a long
  shallow stretch, and the level must be where most of it sits (a mean would let one 50%
  second before 10 s at 9% look like 12.7%); for gaussian noise it costs sqrt(pi/2) in spread,
  which the depth test counts.
- **Depth test**: ``depth >= max((drop + floor) / 2, floor + confidence_z * se)``, ``se =
  sigma * sqrt(k / n + pi / (2 N))`` for ``n`` level ticks and ``N`` baseline values (k =
  pi/2 for a median of 3 or more, 1 below). The midpoint (11%) splits the band; the
  second term is "deeper than the floor with confidence": with few ticks and much noise
  (1-2 inner ticks at a 1 s grid, 2%) a 12% drop cannot be told from a 10% one, and the
  rule waits for more ticks (a longer drop) rather than alert on a shallow one. It is
  tested again on every low tick, so a long drop's level gets ever more precise.
- **Head cut**: a run can open on noise (or a dip) just before a drop and bridge into
  it. It is judged from the CUSUM change point: the tick from which the sum of
  ``(B + level) / 2 - value`` to the current tick is largest (the earliest on a tie);
  the ticks before it become noise (they teach the baseline). ``onset_ns`` is the start
  of that first judged tick, a plain tick time (it is part of the alert id, so it must
  not move with the sub-tick estimate below); the first judged tick is always at least
  halfway to the level, so a first tick less than half covered is cut and becomes the
  "previous tick" below.
- **Duration**, in event time with sub-tick edges: a tick's dropped fraction is ``f(v) =
  (B - v) / (B - level)`` clipped to [0, 1], and taken as 0 within ``edge_z`` errors
  (``sigma / depth``) of 0, so noise next to a run does not lengthen it. Estimated onset
  = ``first + grid * (1 - f(first))``, minus ``grid * f(previous tick)`` when the first
  tick looks fully dropped (f within ``edge_z`` errors of 1) and the tick before it has a
  value: that tick may hold the onset without being low. Estimated end = ``current +
  grid * f(current)``. Inner ticks count as fully dropped unless clearly not (a bridged
  high tick, the partial end of a dip that a noisy tick extended): then only ``f``
  counts. The run is **confirmed** (one ``firing`` event) at the first low tick where
  the depth test passes and ``end - onset - undropped inner time >= hold_ns -
  tolerance``; ``evidence`` has ``onset_estimate_ns`` and ``held_estimate_ns``.
  ``tolerance`` = ``edge_z * grid * sigma / depth * sqrt(2)`` (the duration's error)
  while that is at most ``max_tolerance_ns`` (100 ms), tapering to 0 at twice that. The
  clip at 1 errs short, so without it a drop with edges on tick boundaries (exactly 3 s
  at its third tick) would fire only about half the time; with blurred edges (1 s grid,
  2% noise, 20% drop: +-0.14 s) there is none, preferring no alert for a 2.9 s dip to a
  prompt one for a 3 s drop.
- What the grid allows: alerts come at tick ends with ~3 s of evidence, so at a 1 s grid
  the delay from the true onset is in [3 - tolerance, 4) s (p95 3.9-4.2 s measured): the 3.5 s
  p95 would need alerts on 2.5 s of evidence, i.e. on 2.5-3 s dips. A dip within about
  two edge errors of 3 s (at 1 s: 0.05-0.3 s, at 100 ms: 5-30 ms) cannot be told from a
  3 s drop either way. At 100 ms the delay is 3.0-3.1 s.
- **River** (``streams.detect.change``) is fed ``value / baseline`` (scale-free, so one set of
  detector parameters fits every GPU model) once the baseline is ready. It never makes
  an alert: it fires on 1-2 s dips. When it fires inside the judged run its tick is the
  ``river_onset_ns`` evidence (its latest firing within ``baseline_ns`` before the
  onset is ``river_last_ns``); when it fires while an alert is open, the new level is
  taken to start there.
- **Resolution** (one ``resolved`` per ``firing``, same ``onset_ns``):
  ``recovered``: values at or above ``B * (1 - floor / 2)`` for ``hold_ns`` (bridging
  ``max_gap_ns`` like a run; the old baseline thaws); ``new_baseline``: the alert has
  been open ``baseline_ns`` and the new level (values since the later of onset and
  River's last firing) spans ``min_baseline_ns``: its values become the baseline, so a
  permanent shift (also a partial recovery to less than ``floor / 2`` below) does not
  alert forever; ``workload_change``: the context changed (then everything is learnt
  again from scratch and an open run is dropped, so a new job is never drift).

Deterministic (float arithmetic in a fixed order, no clock, no randomness): the same
sequence of ``update`` calls gives the same events, and ``restore(snapshot())``
continues exactly as the original would have. Bounded: the baseline holds ``baseline_ns
/ grid_ns`` values, a run at most ``(run_limit_ns + max_gap_ns) / grid_ns``; a tick costs
O(log N), O(run) while a run is deep enough to be judged.

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
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from streams.detect.change import ChangeDetector, make_detector
from streams.detect.drift_alert import OpenAlert
from streams.detect.drift_baseline import Baseline
from streams.detect.drift_run import Run

Evidence = Mapping[str, float | int | str]

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
        # The detectors validate their own parameters; build one now so a bad one fails here.
        _detector(self)

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


def _detector(p: DriftParams) -> ChangeDetector:
    if p.detector == "adwin":
        return make_detector("adwin", delta=p.adwin_delta)
    return make_detector("page_hinkley", delta=p.ph_delta, threshold=p.ph_threshold, min_instances=p.ph_min_instances)


@dataclass(frozen=True, slots=True)
class DriftEvent:
    state: Literal["firing", "resolved"]
    onset_ns: int  # start of the first low tick of the confirmed run; the same in firing and resolved
    tick_ns: int  # tick at which it was confirmed / resolved
    value: float  # flops_per_watt at tick_ns (the last known one when that tick has none)
    baseline: float  # the baseline the drop was measured against
    threshold: float  # baseline * (1 - drop)
    evidence: Evidence = field(default_factory=dict)


class EfficiencyDrift:
    """Drift state of one GPU (see the module docstring for the rules)."""

    def __init__(self, params: DriftParams, grid_ns: int) -> None:
        self.params, self.grid_ns = params, grid_ns
        self._base = Baseline(*params.sizes(grid_ns))
        self._context: str | None = None
        self._last_ns: int | None = None  # newest tick taken
        self._valued_ns: int | None = None  # newest tick with a value
        self._prev: tuple[int, float] | None = None  # newest valued tick before the current one, and its value
        self._det = _detector(params)
        self._run = Run()
        self._river_ns: int | None = None  # River's latest firing (any tick)
        self._alert: OpenAlert | None = None
        self.ignored = 0  # ticks not newer than the last one

    @property
    def baseline(self) -> float | None:
        """The current baseline, or None while fewer than ``min_baseline_ns`` of values are held."""
        return self._base.value

    @property
    def noise(self) -> float | None:
        """Per-tick noise relative to the baseline (interquartile range / 1.349 / median), or None."""
        return self._base.noise

    def update(self, tick_ns: int, value: float | None, context: str, suspect: bool = False) -> list[DriftEvent]:
        if self._last_ns is not None and tick_ns <= self._last_ns:
            self.ignored += 1
            return []
        self._last_ns = tick_ns
        out: list[DriftEvent] = []
        if context != self._context:
            if self._alert is not None:
                v = self._alert.value if value is None or not math.isfinite(value) else value
                out.append(self._resolve(tick_ns, v, {"reason": "workload_change"}))
            self._learn_from_scratch(context)
        if value is None or not math.isfinite(value):
            return out
        if self._valued_ns is not None and tick_ns - self._valued_ns > self.params.hold_ns:
            self._end_run()  # too long without data to call it one run
            if self._alert is not None:
                self._alert.up_ns = self._alert.up_last_ns = None
        self._valued_ns = tick_ns
        prev, self._prev = self._prev, (tick_ns, value)
        base = self._alert.baseline if self._alert is not None else self.baseline
        if base is None or base <= 0:  # learning (a zero baseline cannot drop further)
            if not suspect:
                self._base.accept(value)
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
                if not suspect:
                    self._base.accept(value)
                return out
            run.prev = prev[1] if prev is not None and prev[0] == tick_ns - self.grid_ns else None
        if river and run.river_ns is None:
            run.river_ns = tick_ns
        tick = (tick_ns, value, suspect)
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
        self._alert = OpenAlert(c.onset_ns, base, threshold, value, c.level_ns, deque(c.level, maxlen=self._base.cap))
        self._run.clear()
        return DriftEvent("firing", c.onset_ns, tick_ns, value, base, threshold, c.evidence)

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
        return DriftEvent("resolved", a.onset_ns, tick_ns, value, a.baseline, a.threshold, evidence)

    def _end_run(self) -> None:
        """An unconfirmed run ends: its values were noise, a dip or a shallow shift, and teach the baseline."""
        for _, v, s in self._run.drain():
            if not s:
                self._base.accept(v)

    def _learn_from_scratch(self, context: str) -> None:
        self._context = context
        self._base.reset([])
        self._run.clear()
        self._prev, self._river_ns, self._alert = None, None, None
        self._det.reset()

    def buffer_lengths(self) -> dict[str, int]:
        """How many values each buffer holds (for checking that memory stays bounded)."""
        base, sorted_ = self._base.lengths()
        return {"baseline": base, "sorted": sorted_, "run": len(self._run),
                "level": 0 if self._alert is None else len(self._alert.level)}

    def snapshot(self) -> dict[str, Any]:
        a = self._alert
        return {
            "context": self._context, "last_ns": self._last_ns, "valued_ns": self._valued_ns,
            "prev": None if self._prev is None else list(self._prev),
            "base": self._base.values(), **self._run.snapshot(), "river_ns": self._river_ns,
            "alert": None if a is None else a.snapshot(), "detector": self._det.snapshot(), "ignored": self.ignored,
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
        return d


class DriftBank:
    """``EfficiencyDrift`` per (node, gpu); beyond ``max_entities`` the least recently updated goes.

    An evicted GPU's open alert gets no ``resolved`` event from here; the caller, which
    bounds its own state the same way, drops it with the GPU.

    >>> bank = DriftBank(DriftParams(), grid_ns=1_000_000_000, max_entities=2)
    >>> for gpu in "abc":
    ...     _ = bank.update(("n", gpu), 0, 1.0, "job")
    >>> sorted(bank.keys())
    [('n', 'b'), ('n', 'c')]
    """

    def __init__(self, params: DriftParams, grid_ns: int, max_entities: int = 100_000) -> None:
        if max_entities < 1:
            raise ValueError("max_entities must be >= 1")
        params.sizes(grid_ns)  # fail now on a grid the parameters cannot use
        self.params, self.grid_ns, self.max_entities = params, grid_ns, max_entities
        self._gpus: OrderedDict[tuple[str, str], EfficiencyDrift] = OrderedDict()
        self.evicted = 0

    def update(self, key: tuple[str, str], tick_ns: int, value: float | None, context: str,
               suspect: bool = False) -> list[DriftEvent]:
        d = self._gpus.get(key)
        if d is None:
            d = self._gpus[key] = EfficiencyDrift(self.params, self.grid_ns)
            if len(self._gpus) > self.max_entities:
                self._gpus.popitem(last=False)
                self.evicted += 1
        else:
            self._gpus.move_to_end(key)
        return d.update(tick_ns, value, context, suspect)

    def get(self, key: tuple[str, str]) -> EfficiencyDrift | None:
        return self._gpus.get(key)

    def keys(self) -> list[tuple[str, str]]:
        return list(self._gpus)

    def __len__(self) -> int:
        return len(self._gpus)

    def snapshot(self) -> dict[str, Any]:
        # A list in least-recently-updated order, so eviction continues the same after restore.
        return {"entities": [[node, gpu, d.snapshot()] for (node, gpu), d in self._gpus.items()],
                "evicted": self.evicted}

    @classmethod
    def restore(cls, params: DriftParams, grid_ns: int, snap: Mapping[str, Any],
                max_entities: int = 100_000) -> DriftBank:
        bank = cls(params, grid_ns, max_entities)
        for node, gpu, s in snap["entities"][-max_entities:]:
            bank._gpus[(str(node), str(gpu))] = EfficiencyDrift.restore(params, grid_ns, s)
        bank.evicted = int(snap["evicted"])
        return bank
