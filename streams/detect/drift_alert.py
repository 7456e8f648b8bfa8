"""The open alert of ``streams.detect.drift``: its new level, its run back up, and when it resolves.

The rules (``recovered``, ``new_baseline``; ``workload_change`` is decided by the caller)
are in docs/drift.md. ``OpenAlert.observe`` only says which one
applies; ``streams.detect.drift.EfficiencyDrift`` then re-learns the baseline, resets River and
emits the event, so everything that changes the baseline happens in one place.

>>> from collections import deque
>>> from streams.detect.drift_params import DriftParams
>>> p = DriftParams(hold_ns=3, baseline_ns=10, min_baseline_ns=5, max_gap_ns=0, max_tolerance_ns=0, max_run_ns=10)
>>> a = OpenAlert(8, 1.0, 0.88, 0.5, 8, deque([0.5, 0.5, 0.5], maxlen=10))
>>> [a.observe(t, 1.0, False, False, p, 1, need=5) for t in range(11, 14)]
[None, None, {'reason': 'recovered', 'held_ns': 3, 'open_ns': 6}]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streams.detect.drift_params import DriftParams


@dataclass(slots=True)
class OpenAlert:
    onset_ns: int
    baseline: float
    threshold: float
    value: float  # last value seen while open
    level_ns: int  # where the new level starts (onset, or River's latest firing)
    level: deque[float]  # accepted-quality values since level_ns (bounded)
    up_ns: int | None = None  # first tick of a run back up
    up_last_ns: int | None = None  # last tick of that run that was up

    def observe(self, tick_ns: int, value: float, suspect: bool, river: bool, p: DriftParams, grid_ns: int,
                need: int) -> dict[str, float | int | str] | None:
        """Take a tick; the resolution's evidence (with its ``reason``) if the alert resolves, else None.

        ``need`` is how many level values make a baseline. On ``new_baseline`` the caller
        makes ``level`` the baseline and adds it to the evidence as ``new_baseline``.
        """
        self.value = value
        if river:  # River saw the level move again: the new level starts here
            self.level_ns = tick_ns
            self.level.clear()
        if not suspect:
            self.level.append(value)
        end = tick_ns + grid_ns
        if value >= self.baseline * (1 - p.low):
            self.up_ns = tick_ns if self.up_ns is None else self.up_ns
            self.up_last_ns = tick_ns
            if end - self.up_ns >= p.hold_ns:
                return {"reason": "recovered", "held_ns": end - self.up_ns, "open_ns": end - self.onset_ns}
        elif self.up_last_ns is not None and tick_ns - self.up_last_ns > p.max_gap_ns:
            self.up_ns = self.up_last_ns = None
        if end - self.onset_ns >= p.baseline_ns and len(self.level) >= need:
            return {"reason": "new_baseline", "open_ns": end - self.onset_ns, "level_ns": self.level_ns}
        return None

    def snapshot(self) -> dict[str, Any]:
        return {"onset_ns": self.onset_ns, "baseline": self.baseline, "threshold": self.threshold,
                "value": self.value, "level_ns": self.level_ns, "level": list(self.level), "up_ns": self.up_ns,
                "up_last_ns": self.up_last_ns}

    @classmethod
    def restore(cls, a: Mapping[str, Any], cap: int) -> OpenAlert:
        """From ``snapshot()``; ``cap`` bounds the level as the baseline is bounded."""
        return cls(int(a["onset_ns"]), float(a["baseline"]), float(a["threshold"]), float(a["value"]),
                   int(a["level_ns"]), deque((float(v) for v in a["level"]), maxlen=cap), a["up_ns"], a["up_last_ns"])
