"""``checkpoint_io_storm`` (seed 000 §2.3): periodic checkpoint writes that block the GPUs and do not
shrink though the state they save did not change.

Per node: a burst is a run of ticks whose ``disk_write`` (the host's) is at least
``burst_bytes_s``, ending ``gap_s`` after the last such tick. Over the latest ``bursts`` bursts
the rule wants all of: a period (the start-to-start intervals' coefficient of variation at most
``max_period_cv``), volumes of at least ``min_burst_bytes`` that do not shrink (their coefficient
of variation at most ``max_volume_cv``), the node's GPUs idle during each (mean ``gpu_util`` at
most ``idle_util_pct`` for ``min_idle_share`` of it), and the state unchanged: the node's
summed ``torch_allocated`` between bursts within ``max_state_change`` of the first gap's. A
large checkpoint after the state changed, or one-off writes, do not fire.

>>> d = CheckpointStorm(CheckpointParams(), grid_ns=S)
>>> def tick(t):  # 2.4 GB in 4 s every 60 s, the GPUs idle meanwhile; the state does not change
...     burst = t % 60 < 4
...     return d.update(t * S, 0.6e9 if burst else 1e6, 2.0 if burst else 80.0, 64e9, 0.01)
>>> [(t, e.state, e.evidence["burst_bytes"]) for t in range(400) if (e := tick(t))]
[(246, 'firing', 2400000000.0)]
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from streams.leaks.episode import LeakEvent, S, burn
from streams.leaks.params import CheckpointParams

RULE = "checkpoint_io_storm"


@dataclass(slots=True)
class Burst:
    start_ns: int
    end_ns: int = 0  # the last tick at or above the burst rate
    bytes: float = 0.0
    ticks: int = 0
    idle_ticks: int = 0
    state_before: float | None = None  # the median summed torch_allocated of the gap before it


class CheckpointStorm:
    rule = RULE

    def __init__(self, params: CheckpointParams, grid_ns: int) -> None:
        self.p, self.grid_ns = params, grid_ns
        self._bursts: deque[Burst] = deque(maxlen=params.bursts)
        self._open: Burst | None = None
        self._states: list[float] = []  # the gap's state samples (bounded: one per tick up to a cap)
        self._onset: int | None = None
        self._last_onset = 0
        self._price: float | None = None
        self._period = 0.0

    def update(self, t_ns: int, disk_bytes_s: float | None, gpu_util: float | None, state_bytes: float | None,
               price_per_h: float | None) -> LeakEvent | None:
        """One tick of the node: its disk write rate, its GPUs' mean utilisation, summed torch_allocated and
        summed hourly price (each None where not sampled)."""
        p = self.p
        if price_per_h is not None:
            self._price = price_per_h
        out = None
        grid_s = self.grid_ns / S
        if disk_bytes_s is not None and disk_bytes_s >= p.burst_bytes_s:
            b = self._open
            if b is None:
                b = self._open = Burst(t_ns, state_before=_median(self._states))
                self._states = []
            b.end_ns = t_ns
            b.bytes += disk_bytes_s * grid_s
            b.ticks += 1
            b.idle_ticks += gpu_util is not None and gpu_util <= p.idle_util_pct
        elif self._open is not None and t_ns - self._open.end_ns >= p.gap_s * S:
            out = self._closed(self._open, t_ns)
            self._open = None
        elif self._open is None:
            if state_bytes is not None and len(self._states) < 4096:
                self._states.append(state_bytes)
            if self._onset is not None and self._bursts and \
                    t_ns - self._bursts[-1].start_ns > max(3.0 * self._period, p.gap_s) * S:
                out = self._resolved(t_ns)  # the bursts stopped
        return out

    def _closed(self, b: Burst, t_ns: int) -> LeakEvent | None:
        p = self.p
        if b.bytes < p.min_burst_bytes:
            return None  # logs and metrics, not a checkpoint
        self._bursts.append(b)
        storm = self._storm()
        if storm and self._onset is None:
            self._onset = self._last_onset = self._bursts[0].start_ns
            return self._event("firing", t_ns)
        if not storm and self._onset is not None:
            return self._resolved(t_ns)
        return None

    def _storm(self) -> bool:
        p = self.p
        bs = list(self._bursts)
        if len(bs) < p.bursts:
            return False
        starts = np.array([b.start_ns for b in bs], dtype=np.float64) / S
        gaps = np.diff(starts)
        vols = np.array([b.bytes for b in bs])
        self._period = float(gaps.mean())
        periodic = self._period <= p.max_period_s and _cv(gaps) <= p.max_period_cv
        steady = _cv(vols) <= p.max_volume_cv
        idle = all(b.idle_ticks >= p.min_idle_share * b.ticks for b in bs)
        states = [b.state_before for b in bs[1:] if b.state_before is not None]
        same = not states or (max(states) - min(states)) <= p.max_state_change * max(abs(min(states)), 1.0)
        return periodic and steady and idle and same

    def _resolved(self, t_ns: int) -> LeakEvent:
        ev = self._event("resolved", t_ns)
        self._onset = None
        return ev

    def _event(self, state: str, t_ns: int) -> LeakEvent:
        bs = list(self._bursts)
        grid_s = self.grid_ns / S
        vol = float(np.median([b.bytes for b in bs]))
        idle_s = float(np.median([b.idle_ticks for b in bs])) * grid_s
        burst_s = float(np.median([b.end_ns - b.start_ns for b in bs])) / S + grid_s
        share = idle_s / self._period if self._period > 0 else 0.0
        return LeakEvent(RULE, "firing" if state == "firing" else "resolved", self._last_onset, t_ns,
                         value=vol, threshold=self.p.min_burst_bytes,
                         evidence={"period_s": round(self._period, 3), "burst_bytes": round(vol, 0),
                                   "burst_s": round(burst_s, 3), "gpu_idle_s_per_burst": round(idle_s, 3),
                                   "bursts": len(bs), "volume_cv": round(_cv(np.array([b.bytes for b in bs])), 4),
                                   "state_bytes": bs[-1].state_before, "idle_share": round(share, 4),
                                   "cost_usd_per_h": burn(self._price, share)})


def _cv(x: np.ndarray) -> float:
    m = float(np.mean(x))
    return float(np.std(x)) / m if m > 0 else float("inf")


def _median(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None
