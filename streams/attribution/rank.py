"""Rank the likely causes of one alert.

Four kinds of witness, each a ``Cause`` with a confidence in [0, 1]:

- **series**: the alert's symptom (``SYMPTOM``: FLOPS/W for a drift, gpu_util for a stall ...)
  and every other aligned series of the GPU and its node over the window before the alert.
  A series that stepped (the single change point that best splits it, its Welch t-test by
  ``scipy.stats.ttest_ind`` below ``max_p``) and whose lagged values move with the symptom
  (``scipy.stats.pearsonr`` at lags 0..``max_lag_s``, the series leading) is a candidate; its
  confidence is the correlation, weighed by when it changed: before the symptom (a root
  cause leads) in full and 2% more per second of lead (up to 10 s), at the same tick 0.8,
  after it 0.5; capped at 1. Series that are the symptom
  seen another way (``MIRRORS``: power, SM and tensor activity mirror utilisation) are not causes.
- **Kubernetes events** of the node within ``event_window_s`` before the onset (and up to the
  alert) that concern the alert's pod or GPU or the whole node: OOMKilled, Evicted, BackOff,
  node pressure ...; the confidence of the reason (``EVENT_WEIGHT``), fading with distance from
  the onset.
- **other detections** of the node in that window: another rule on the same GPU (0.75) or on a
  neighbour (0.5), fading alike.
- **label changes** of the GPU in that window (``workload_changed``, ``pod_changed``: 0.7).

The same cause from two witnesses keeps the higher confidence; the list is sorted by confidence
(ties: the earlier change first) and cut at ``max_causes``.

>>> import numpy as np
>>> from streams.attribution.window import SERIES
>>> t = np.arange(120) * 1_000_000_000
>>> block = np.full((len(SERIES), 120), np.nan)
>>> rng = np.random.default_rng(0)
>>> disk = np.where(np.arange(120) >= 60, 2e9, 1e7) * (1 + 0.05 * rng.standard_normal(120))
>>> wait = np.where(np.arange(120) >= 63, 600.0, 3.0) + rng.standard_normal(120)
>>> util = np.where(np.arange(120) >= 64, 5.0, 80.0) + rng.standard_normal(120)
>>> for name, x in (("disk_write", disk), ("dataloader_wait_ms", wait), ("gpu_util", util)):
...     block[SERIES.index(name)] = x
>>> causes = series_causes("pipeline_stall", t, block, onset_ns=t[64], params=AttributionParams())
>>> [c.cause for c in causes]
['disk_write', 'dataloader_wait_ms']
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np
from scipy.stats import pearsonr, ttest_ind

from schemas.alerts import Cause, EvidenceValue
from streams.attribution.context import Happening
from streams.attribution.window import SERIES

S: Final = 1_000_000_000

SYMPTOM: Final[Mapping[str, str]] = {
    "efficiency_drift": "flops_per_watt", "util_spike": "gpu_util", "sm_spike": "sm_active",
    "pipeline_stall": "gpu_util", "batching_collapse": "gpu_util", "checkpoint_io_storm": "gpu_util",
    "idle_allocated": "gpu_util", "nccl_retransmit_storm": "nccl_retries", "nccl_slow_allreduce": "nccl_allreduce_ms",
    "memory_fragmentation": "fb_used",
}
_ACTIVITY: Final = frozenset({"gpu_util", "sm_active", "tensor_active", "power", "flops_per_watt"})
MIRRORS: Final[Mapping[str, frozenset[str]]] = {
    "gpu_util": _ACTIVITY, "sm_active": _ACTIVITY, "flops_per_watt": _ACTIVITY,
    "fb_used": frozenset({"fb_used"}), "nccl_retries": frozenset({"nccl_retries"}),
    "nccl_allreduce_ms": frozenset({"nccl_allreduce_ms"}),
}
EVENT_WEIGHT: Final[Mapping[str, float]] = {
    "OOMKilled": 0.95, "OOMKilling": 0.95, "Evicted": 0.9, "Preempting": 0.85, "Preempted": 0.85,
    "BackOff": 0.85, "CrashLoopBackOff": 0.85, "Failed": 0.7, "Unhealthy": 0.7, "Killing": 0.75,
    "NodeNotReady": 0.85, "NodeHasDiskPressure": 0.8, "NodeHasInsufficientMemory": 0.8, "NodeHasMemoryPressure": 0.8,
    "EvictionThresholdMet": 0.8, "NodeHasInsufficientPID": 0.75, "SystemOOM": 0.9, "Rebooted": 0.85,
    "FailedScheduling": 0.6, "Scheduled": 0.55, "Rescheduled": 0.65, "TaintManagerEviction": 0.85,
    "FailedMount": 0.6, "FailedAttachVolume": 0.6, "XidError": 0.85,
}
_QUIET_EVENTS: Final = frozenset({"PodLabels", "Pulling", "Pulled", "Created", "Started", "SuccessfulCreate",
                                  "ScalingReplicaSet", "SuccessfulDelete"})


@dataclass(frozen=True, slots=True)
class AttributionParams:
    enabled: bool = True
    window_s: float = 300.0  # aligned history kept per GPU (at most max_ticks ticks)
    max_ticks: int = 600
    event_window_s: float = 600.0  # events, detections and label changes this long before the onset count
    fade_s: float = 300.0  # ... fading by e^(-distance / fade_s)
    max_lag_s: float = 10.0
    max_p: float = 1e-3
    min_r: float = 0.3
    min_points: int = 12
    max_causes: int = 8
    delay_ticks: int = 1  # the attribution follows its firing this many ticks later (never with it)

    def ticks(self, grid_ns: int) -> int:
        """How many ticks of history a GPU's window holds."""
        return max(16, min(self.max_ticks, int(self.window_s * S // grid_ns)))


def rank(causes: Iterable[tuple[Cause, float]], max_causes: int) -> tuple[Cause, ...]:
    """The best witness of each cause, most confident first; ties: the earlier change (the second element)."""
    best: dict[str, tuple[Cause, float]] = {}
    for c, when in causes:
        have = best.get(c.cause)
        if have is None or c.confidence > have[0].confidence:
            best[c.cause] = (c, when)
    ordered = sorted(best.values(), key=lambda cw: (-round(cw[0].confidence, 3), cw[1], cw[0].cause))
    return tuple(c for c, _ in ordered[:max_causes])


def series_causes(rule: str, times: np.ndarray, block: np.ndarray, onset_ns: int,
                  params: AttributionParams) -> list[Cause]:
    """Causes from the aligned series alone (see the module's doc)."""
    return list(rank(series_witnesses(rule, times, block, onset_ns, params), params.max_causes))


def series_witnesses(rule: str, times: np.ndarray, block: np.ndarray, onset_ns: int,
                     params: AttributionParams) -> list[tuple[Cause, float]]:
    """Each candidate series as (cause, when it changed)."""
    symptom = SYMPTOM.get(rule)
    if symptom is None or times.size < params.min_points:
        return []
    si = SERIES.index(symptom)
    y = block[si]
    y_change = _change(times, y, params)
    if y_change is None:
        return []
    tick_ns = int(np.median(np.diff(times))) if times.size > 1 else S
    max_lag = max(1, int(params.max_lag_s * S // max(tick_ns, 1)))
    mirrors = MIRRORS.get(symptom, frozenset({symptom}))
    out = []
    for i, name in enumerate(SERIES):
        if name == symptom or name in mirrors:
            continue
        x = block[i]
        ch = _change(times, x, params)
        if ch is None:
            continue
        r, lag = _best_lag(x, y, max_lag, params)
        if r is None or abs(r) < params.min_r:
            continue
        lead_s = (y_change[0] - ch[0]) / S
        tick_s = tick_ns / S
        # A root cause leads: the longer before the symptom it changed, the more it counts (up to +20% at 10 s).
        weight = (1.0 + 0.02 * min(lead_s, 10.0)) if lead_s > tick_s else 0.8 if lead_s >= -tick_s else 0.5
        conf = round(min(1.0, abs(r) * weight), 4)
        ev: dict[str, EvidenceValue] = {"source": "series", "r": round(r, 4), "lag_s": round(lag * tick_s, 3),
                                        "lead_s": round(lead_s, 3), "change_p": float(f"{ch[1]:.3g}"),
                                        "symptom": symptom}
        out.append((Cause(name, conf, ev), float(ch[0])))
    return out


def _change(times: np.ndarray, x: np.ndarray, params: AttributionParams) -> tuple[int, float] | None:
    """(time, p) of the single change point that best splits ``x``, or None when none is significant."""
    ok = ~np.isnan(x)
    if ok.sum() < params.min_points:
        return None
    t, v = times[ok], x[ok]
    n = v.size
    if np.ptp(v) == 0:
        return None
    # The split that maximises the between-segment difference of means, scaled by segment sizes (a CUSUM
    # argmax); its significance by Welch's t-test.
    k = np.arange(1, n)
    csum = np.cumsum(v)[:-1]
    left = csum / k
    right = (v.sum() - csum) / (n - k)
    score = np.abs(left - right) * np.sqrt(k * (n - k) / n)
    lo = max(3, n // 20)
    if n - 2 * lo < 1:
        return None
    j = lo - 1 + int(np.argmax(score[lo - 1:n - lo]))
    a, b = v[:j + 1], v[j + 1:]
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        return (int(t[j + 1]), 0.0) if a[0] != b[0] else None
    res = ttest_ind(a, b, equal_var=False)
    p = float(res.pvalue)
    if not math.isfinite(p) or p >= params.max_p:
        return None
    return int(t[j + 1]), p


def _best_lag(x: np.ndarray, y: np.ndarray, max_lag: int, params: AttributionParams) -> tuple[float | None, int]:
    best: tuple[float | None, int] = (None, 0)
    for lag in range(0, max_lag + 1):
        xs, ys = (x[:-lag], y[lag:]) if lag else (x, y)
        ok = ~(np.isnan(xs) | np.isnan(ys))
        if ok.sum() < params.min_points or np.ptp(xs[ok]) == 0 or np.ptp(ys[ok]) == 0:
            continue
        res = pearsonr(xs[ok], ys[ok])
        r, p = float(res.statistic), float(res.pvalue)
        if p < params.max_p and (best[0] is None or abs(r) > abs(best[0]) + 1e-9):
            best = (r, lag)
    return best


def context_causes(happenings: Iterable[Happening], gpu: str, pod: str, onset_ns: int,
                   params: AttributionParams) -> list[tuple[Cause, float]]:
    """Causes from the node's Kubernetes events, other detections and label changes."""
    out = []
    for h in happenings:
        distance_s = abs(onset_ns - h.ts_ns) / S
        fade = math.exp(-distance_s / params.fade_s) * (0.8 if h.ts_ns > onset_ns else 1.0)
        mine = (h.pod and h.pod == pod) or gpu in h.gpus
        if h.type == "detection":
            base = 0.75 if gpu in h.gpus else 0.5
            ev: dict[str, EvidenceValue] = {"source": "detection", "gpu": h.gpus[0] if h.gpus else None,
                                            "lead_s": round((onset_ns - h.ts_ns) / S, 3), "id": h.detail}
        elif h.type == "labels":
            if gpu not in h.gpus:
                continue
            base = 0.7
            ev = {"source": "labels", "lead_s": round((onset_ns - h.ts_ns) / S, 3), "change": h.detail}
        else:
            if h.reason in _QUIET_EVENTS or not (mine or (not h.pod and not h.gpus)):
                continue
            base = EVENT_WEIGHT.get(h.reason, 0.6 if h.type == "Warning" else 0.3)
            ev = {"source": "k8s", "type": h.type, "pod": h.pod or None,
                  "lead_s": round((onset_ns - h.ts_ns) / S, 3), "message": h.detail[:200] or None}
        out.append((Cause(h.reason, round(base * fade, 4), ev), float(h.ts_ns)))
    return out
