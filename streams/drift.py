"""Efficiency drift per GPU: FLOPS/Watt below a robust baseline for a hold, in event time.

One ``EfficiencyDrift`` follows one GPU's ticks (increasing ``tick_ns``; a tick not newer
than the last is ignored and counted, so a replay that overlaps what was seen is
harmless). ``DriftBank`` holds many, bounded.

- **Baseline**: the median of the last ``baseline_ns / grid_ns`` accepted values. A value
  is accepted when it is not ``suspect`` and no drop run or alert is open (the baseline
  is frozen meanwhile, so a drop never teaches itself). Gaps and suspect spells do not
  age it out; a new workload ``context`` does. Nothing is detected until it holds
  ``min_baseline_ns / grid_ns`` values (after the start, a workload change, a re-learn).
- **Below**: ``value < baseline * (1 - drop)``. A run of consecutive below ticks is
  **confirmed** (one ``firing`` event) on the below tick where ``tick_ns + grid_ns -
  first_below_ns >= hold_ns``: 3 ticks at a 1 s grid, 30 at 100 ms. ``onset_ns`` is the
  first below tick. A missing frame (``None``, or not finite) changes nothing, but if
  more than ``hold_ns`` passes between two valued ticks the run starts again.
- **River** (``streams.change``) is fed ``value / baseline`` (scale-free, so one set of
  detector parameters fits every GPU model) once the baseline is ready. It never makes
  an alert: it fires on 1-2 s dips. When it fires inside a run its tick is the
  ``river_onset_ns`` evidence (its latest firing within ``baseline_ns`` before the
  onset is ``river_last_ns``: at 100 ms it often sees a change before the 30-tick run
  that confirms it begins); when it fires while an alert is open, the new level is
  taken to start there.
- **Resolution** (one ``resolved`` per ``firing``, same ``onset_ns``):
  ``recovered``: ``value >= threshold`` for ``hold_ns`` (same run rule; the old
  baseline thaws); ``new_baseline``: the alert has been open ``baseline_ns`` and the new
  level (values since the later of onset and River's last firing) spans
  ``min_baseline_ns``: its values become the baseline, so a permanent shift does not
  alert forever; ``workload_change``: the context changed (then everything is learnt
  again from scratch and an open run is dropped, so a new job is never drift).

Deterministic: the same sequence of ``update`` calls gives the same events, and
``restore(snapshot())`` continues exactly as the original would have.

>>> d = EfficiencyDrift(DriftParams(hold_ns=3, baseline_ns=10, min_baseline_ns=5), grid_ns=1)
>>> out = [d.update(t, 1.0, "job") for t in range(8)] + [d.update(t, 0.5, "job") for t in range(8, 12)]
>>> [(e.state, e.onset_ns, e.tick_ns) for evs in out for e in evs]
[('firing', 8, 10)]
>>> [(e.state, e.evidence["reason"]) for e in d.update(12, 1.0, "other-job")]
[('resolved', 'workload_change')]
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from streams.change import ChangeDetector, make_detector

Evidence = Mapping[str, float | int | str]


@dataclass(frozen=True, slots=True)
class DriftParams:
    drop: float = 0.12  # fraction below baseline that counts as a drop
    hold_ns: int = 3_000_000_000  # how long the drop must persist (event time)
    baseline_ns: int = 60_000_000_000  # baseline = median over this much accepted history
    min_baseline_ns: int = 20_000_000_000  # no detection before this much baseline history
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
        if self.hold_ns <= 0:
            raise ValueError(f"hold_ns must be > 0, got {self.hold_ns}")
        if not 0 < self.min_baseline_ns <= self.baseline_ns:
            raise ValueError("need 0 < min_baseline_ns <= baseline_ns")
        if self.detector not in ("page_hinkley", "adwin"):
            raise ValueError(f"detector must be 'page_hinkley' or 'adwin', got {self.detector!r}")
        # The detectors validate their own parameters; build one now so a bad one fails here.
        _detector(self)

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


def _median(s: list[float]) -> float:
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


@dataclass(frozen=True, slots=True)
class DriftEvent:
    state: Literal["firing", "resolved"]
    onset_ns: int  # first tick of the confirmed drop; the same in firing and resolved
    tick_ns: int  # tick at which it was confirmed / resolved
    value: float  # flops_per_watt at tick_ns (the last known one when that tick has none)
    baseline: float  # the baseline the drop was measured against
    threshold: float  # baseline * (1 - drop)
    evidence: Evidence = field(default_factory=dict)


@dataclass(slots=True)
class _Alert:
    onset_ns: int
    baseline: float
    threshold: float
    value: float  # last value seen while open
    level_ns: int  # where the new level starts (onset, or River's latest firing)
    level: deque[float]  # accepted-quality values since level_ns (bounded)
    up_ns: int | None = None  # first tick of a run at or above the threshold


class EfficiencyDrift:
    """Drift state of one GPU (see the module docstring for the rules)."""

    def __init__(self, params: DriftParams, grid_ns: int) -> None:
        self.params, self.grid_ns = params, grid_ns
        self._cap, self._need = params.sizes(grid_ns)
        self._context: str | None = None
        self._last_ns: int | None = None  # newest tick taken
        self._valued_ns: int | None = None  # newest tick with a value
        self._base: deque[float] = deque(maxlen=self._cap)
        self._sorted: list[float] = []  # the same values, sorted, for an O(1) median
        self._det = _detector(params)
        self._run: list[tuple[int, float, bool]] = []  # (tick, value, suspect) of the open below run
        self._run_river_ns: int | None = None
        self._river_ns: int | None = None  # River's latest firing (any tick)
        self._alert: _Alert | None = None
        self.ignored = 0  # ticks not newer than the last one

    @property
    def baseline(self) -> float | None:
        """The current baseline, or None while fewer than ``min_baseline_ns`` of values are held."""
        return None if len(self._sorted) < self._need else _median(self._sorted)

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
            self._run, self._run_river_ns = [], None  # too long without data to call it one run
            if self._alert is not None:
                self._alert.up_ns = None
        self._valued_ns = tick_ns
        base = self._alert.baseline if self._alert is not None else self.baseline
        if base is None or base <= 0:  # learning (a zero baseline cannot drop further)
            if not suspect:
                self._accept(value)
            return out
        river = self._det.update(value / base)
        if river:
            self._river_ns = tick_ns
        if self._alert is not None:
            return out + self._while_open(tick_ns, value, suspect, river)
        threshold = base * (1 - self.params.drop)
        if value >= threshold:
            self._run, self._run_river_ns = [], None
            if not suspect:
                self._accept(value)
            return out
        self._run.append((tick_ns, value, suspect))
        if river and self._run_river_ns is None:
            self._run_river_ns = tick_ns
        onset = self._run[0][0]
        held = tick_ns + self.grid_ns - onset
        if held < self.params.hold_ns:
            return out
        evidence: dict[str, float | int | str] = {"held_ns": held, "ticks_below": len(self._run),
                                                  "detector": self.params.detector}
        if self._run_river_ns is not None:
            evidence["river_onset_ns"] = self._run_river_ns
        if self._river_ns is not None and self._river_ns >= onset - self.params.baseline_ns:
            evidence["river_last_ns"] = self._river_ns  # it may have seen the change before the run began
        level_ns = onset if self._run_river_ns is None else self._run_river_ns
        level = deque((v for t, v, s in self._run if t >= level_ns and not s), maxlen=self._cap)
        self._alert = _Alert(onset, base, threshold, value, level_ns, level)
        self._run, self._run_river_ns = [], None
        out.append(DriftEvent("firing", onset, tick_ns, value, base, threshold, evidence))
        return out

    def _while_open(self, tick_ns: int, value: float, suspect: bool, river: bool) -> list[DriftEvent]:
        a = self._alert
        assert a is not None
        a.value = value
        if river:  # River saw the level move again: the new level starts here
            a.level_ns = tick_ns
            a.level.clear()
        if not suspect:
            a.level.append(value)
        end = tick_ns + self.grid_ns
        if value >= a.threshold:
            a.up_ns = tick_ns if a.up_ns is None else a.up_ns
            if end - a.up_ns >= self.params.hold_ns:
                ev = self._resolve(tick_ns, value, {"reason": "recovered", "held_ns": end - a.up_ns,
                                                    "open_ns": end - a.onset_ns})
                self._det.reset()  # its history holds the drop; the old baseline thaws instead
                return [ev]
        else:
            a.up_ns = None
        if end - a.onset_ns >= self.params.baseline_ns and len(a.level) >= self._need:
            self._set_base(list(a.level))
            ev = self._resolve(tick_ns, value, {"reason": "new_baseline", "open_ns": end - a.onset_ns,
                                                "level_ns": a.level_ns, "new_baseline": _median(self._sorted)})
            self._det.reset()  # it measured ratios to the old baseline
            return [ev]
        return []

    def _resolve(self, tick_ns: int, value: float, evidence: dict[str, float | int | str]) -> DriftEvent:
        a = self._alert
        assert a is not None
        self._alert = None
        return DriftEvent("resolved", a.onset_ns, tick_ns, value, a.baseline, a.threshold, evidence)

    def _learn_from_scratch(self, context: str) -> None:
        self._context = context
        self._set_base([])
        self._run, self._run_river_ns, self._river_ns, self._alert = [], None, None, None
        self._det.reset()

    def _accept(self, value: float) -> None:
        if len(self._base) == self._cap:
            old = self._base[0]
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._base.append(value)
        bisect.insort(self._sorted, value)

    def _set_base(self, values: list[float]) -> None:
        self._base = deque(values, maxlen=self._cap)
        self._sorted = sorted(self._base)

    def buffer_lengths(self) -> dict[str, int]:
        """How many values each buffer holds (for checking that memory stays bounded)."""
        return {"baseline": len(self._base), "sorted": len(self._sorted), "run": len(self._run),
                "level": 0 if self._alert is None else len(self._alert.level)}

    def snapshot(self) -> dict[str, Any]:
        a = self._alert
        return {
            "context": self._context, "last_ns": self._last_ns, "valued_ns": self._valued_ns,
            "base": list(self._base), "run": [list(r) for r in self._run], "run_river_ns": self._run_river_ns,
            "river_ns": self._river_ns,
            "alert": None if a is None else {"onset_ns": a.onset_ns, "baseline": a.baseline,
                                             "threshold": a.threshold, "value": a.value, "level_ns": a.level_ns,
                                             "level": list(a.level), "up_ns": a.up_ns},
            "detector": self._det.snapshot(), "ignored": self.ignored,
        }

    @classmethod
    def restore(cls, params: DriftParams, grid_ns: int, snap: Mapping[str, Any]) -> EfficiencyDrift:
        d = cls(params, grid_ns)
        d._context, d._last_ns, d._valued_ns = snap["context"], snap["last_ns"], snap["valued_ns"]
        d._set_base([float(v) for v in snap["base"]])
        d._run = [(int(t), float(v), bool(s)) for t, v, s in snap["run"]]
        d._run_river_ns, d._river_ns = snap["run_river_ns"], snap["river_ns"]
        a = snap["alert"]
        if a is not None:
            d._alert = _Alert(int(a["onset_ns"]), float(a["baseline"]), float(a["threshold"]), float(a["value"]),
                              int(a["level_ns"]), deque((float(v) for v in a["level"]), maxlen=d._cap), a["up_ns"])
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
