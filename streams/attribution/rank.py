"""Rank the likely causes of one alert.

Four kinds of witness, each a ``Cause`` with a confidence in [0, 1]:

- **series**: the alert's symptom (``SYMPTOM``: FLOPS/W for a drift, gpu_util for a stall ...)
  and every other aligned series of the GPU and its node over the window before the alert.
  A series whose lagged values move with the symptom (Pearson's r with its t-test p-value by
  ``scipy.special.stdtr``, all series at once, at lags
  0..``max_lag_s``, the series leading) is a candidate. When both stepped (the single change
  point that best splits each, its Welch t-test, p by ``scipy.special.stdtr``, below ``max_p``),
  its confidence is half the step's strength (significance and effect size) and half the
  correlation (a step below ``strong_p`` counts even with no correlation: noise can hide it),
  weighed by when it stepped: up to ``max_lead_s`` before the symptom in full (a
  root cause leads), at the same tick 0.8, long before fading, after it 0.3. A series with no
  single step (periodic bursts) counts when it moves closely with the symptom (0.8 |r|, at
  least 0.6); one that steps at the symptom's very tick with no correlation is a co-consequence.
  Series that are the symptom seen another way (``MIRRORS``: power, SM and tensor activity
  mirror utilisation) are not causes.
- **Kubernetes events** of the node within ``event_window_s`` before the onset (and up to the
  alert) that concern the alert's pod or GPU or the whole node: OOMKilled, Evicted, BackOff,
  node pressure ...; the confidence of the reason (``EVENT_WEIGHT``), fading with distance from
  the onset.
- **other detections** of the node in that window: another rule on the same GPU (0.75) or on a
  neighbour (0.35), fading alike.
- **the rule itself**, where it knows its driver (``RULE_CAUSES``): a checkpoint storm's
  ``disk_write`` (0.9), a stall's ``dataloader_wait_ms`` (0.6, behind a root that leads it).
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

from schemas.alerts import Cause, EvidenceValue
from streams.attribution.context import Happening
from streams.attribution.window import SERIES

S: Final = 1_000_000_000

SYMPTOM: Final[Mapping[str, str]] = {
    "efficiency_drift": "flops_per_watt",
    "pipeline_stall": "gpu_util", "batching_collapse": "gpu_util", "checkpoint_io_storm": "gpu_util",
    "idle_allocated": "gpu_util", "nccl_retransmit_storm": "nccl_retries", "nccl_slow_allreduce": "nccl_allreduce_ms",
    "memory_fragmentation": "fb_used",
}
_ACTIVITY: Final = frozenset({"gpu_util", "sm_active", "tensor_active", "power", "flops_per_watt"})
# Utilisation heats the GPU (temperature follows power with a ~25 s lag): a consequence, unless the symptom
# is efficiency, which heat can cause (clocks held down).
MIRRORS: Final[Mapping[str, frozenset[str]]] = {
    "gpu_util": _ACTIVITY | {"temperature"}, "sm_active": _ACTIVITY | {"temperature"}, "flops_per_watt": _ACTIVITY,
    # The GPU waits on a slow or retrying collective: its activity falls because of it, not the other way.
    "fb_used": frozenset({"fb_used"}), "nccl_retries": _ACTIVITY | {"temperature", "nccl_retries"},
    "nccl_allreduce_ms": _ACTIVITY | {"temperature", "nccl_allreduce_ms"},
}
# What a rule itself sees beside its symptom: its evidence, not its cause.
RULE_SEES: Final[Mapping[str, frozenset[str]]] = {
    "batching_collapse": frozenset({"queue_depth", "request_latency_ms"}),
}
# What a rule itself knows drives it: a checkpoint storm is its writes; a stall's link to its root is the wait.
RULE_CAUSES: Final[Mapping[str, tuple[str, float]]] = {
    "checkpoint_io_storm": ("disk_write", 0.9), "pipeline_stall": ("dataloader_wait_ms", 0.6),
}
EVENT_WEIGHT: Final[Mapping[str, float]] = {
    "OOMKilled": 0.95, "OOMKilling": 0.95, "Evicted": 0.9, "Preempting": 0.85, "Preempted": 0.85,
    "BackOff": 0.85, "CrashLoopBackOff": 0.85, "Failed": 0.7, "Unhealthy": 0.7, "Killing": 0.75,
    "NodeNotReady": 0.85, "NodeHasDiskPressure": 0.8, "NodeHasInsufficientMemory": 0.8, "NodeHasMemoryPressure": 0.8,
    "EvictionThresholdMet": 0.8, "NodeHasInsufficientPID": 0.75, "SystemOOM": 0.9, "Rebooted": 0.85,
    "FailedScheduling": 0.6, "Scheduled": 0.3, "Rescheduled": 0.65, "TaintManagerEviction": 0.85,
    "FailedMount": 0.6, "FailedAttachVolume": 0.6, "XidError": 0.85,
}
# A 200 ms load spike is a symptom of load, seldom the cause of a lasting episode; and it is too short for the
# grid's series to say anything about it (it has no SYMPTOM: its causes come from events and detections).
_TRANSIENT_RULES: Final = frozenset({"util_spike", "sm_spike"})
_QUIET_EVENTS: Final = frozenset({"PodLabels", "Pulling", "Pulled", "Created", "Started", "SuccessfulCreate",
                                  "ScalingReplicaSet", "SuccessfulDelete"})


@dataclass(frozen=True, slots=True)
class AttributionParams:
    enabled: bool = True
    window_s: float = 300.0  # aligned history kept per GPU (at most max_ticks ticks)
    max_ticks: int = 600
    event_window_s: float = 600.0  # events, detections and label changes this long before the onset count
    fade_s: float = 900.0  # ... fading by e^(-distance / fade_s)
    max_lag_s: float = 10.0
    max_p: float = 1e-3
    min_r: float = 0.3
    strong_p: float = 1e-4  # a step this significant is a candidate whatever its correlation
    max_lead_s: float = 30.0  # a step up to this long before the symptom's fits a cause in full
    step_margin_s: float = 30.0  # a candidate's step is tested on this much data either side of where it may be
    min_periodic_r: float = 0.6  # a series with no single step is a cause only when it moves this closely with it
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
    """Each candidate series as (cause, when it changed); the rule's own driver (``RULE_CAUSES``) among them."""
    native = RULE_CAUSES.get(rule)
    out = [] if native is None else [(Cause(native[0], native[1], {"source": "rule", "rule": rule}), float(onset_ns))]
    return out + _series_witnesses(rule, times, block, onset_ns, params)


def _series_witnesses(rule: str, times: np.ndarray, block: np.ndarray, onset_ns: int,
                      params: AttributionParams) -> list[tuple[Cause, float]]:
    symptom = SYMPTOM.get(rule)
    if symptom is None or times.size < params.min_points:
        return []
    si = SERIES.index(symptom)
    y = block[si]
    y_change = _change(times, y, params)
    tick_ns = int(np.median(np.diff(times))) if times.size > 1 else S
    tick_s = tick_ns / S
    max_lag = max(1, int(params.max_lag_s * S // max(tick_ns, 1)))
    mirrors = MIRRORS.get(symptom, frozenset({symptom})) | RULE_SEES.get(rule, frozenset())
    best_r, best_lag = _lagged_correlations(block, y, max_lag, params)
    out = []
    for i, name in enumerate(SERIES):
        if name == symptom or name in mirrors:
            continue
        x = block[i]
        ch = None
        if y_change is not None:  # the candidate's own step, looked for around the symptom's
            lo, hi = y_change[0] - int(params.max_lead_s * S), y_change[0] + int(params.max_lag_s * S)
            margin = int(params.step_margin_s * S)  # the data either side of the splits looked at, no more
            near = (times >= lo - margin) & (times <= hi + margin)
            ch = _change(times[near], x[near], params, (lo, hi))
        r = 0.0 if math.isnan(best_r[i]) else float(best_r[i])
        lag = int(best_lag[i])
        # A series whose step lines up with the symptom's counts even when its noise hides the correlation (a
        # training job's phases make NVLink traffic bimodal): the timing of strong steps is evidence of its own.
        stepped = (ch is not None and y_change is not None and ch[1] <= params.strong_p
                   and (y_change[0] - ch[0]) > tick_ns)  # a step at the symptom's very tick is a co-consequence
        if abs(r) < params.min_r and not stepped:
            continue
        ev: dict[str, EvidenceValue] = {"source": "series", "r": round(r, 4), "lag_s": round(lag * tick_s, 3),
                                        "symptom": symptom}
        conf, when = 0.0, float(onset_ns)
        if ch is not None and y_change is not None:
            lead_s = (y_change[0] - ch[0]) / S
            conf = _timing(lead_s, tick_s, params) * (0.5 * _strength(ch[1], ch[2]) + 0.5 * abs(r))
            ev.update(lead_s=round(lead_s, 3), change_p=float(f"{ch[1]:.3g}"), effect=round(ch[2], 2))
            when = float(ch[0])
        if abs(r) >= params.min_periodic_r:  # periodic bursts have no single step: the co-movement counts alone
            conf = max(conf, 0.8 * abs(r))
        if conf <= 0.0:
            continue
        out.append((Cause(name, round(min(1.0, conf), 4), ev), when))
    return out


def _timing(lead_s: float, tick_s: float, params: AttributionParams) -> float:
    """How well a change ``lead_s`` before the symptom's fits a cause: leading by up to ``max_lead_s`` in full,
    at the same tick 0.8, long before fading (a coincidence, not a cause), after the symptom 0.3."""
    if lead_s > tick_s:
        return 1.0 if lead_s <= params.max_lead_s else math.exp(-2.0 * (lead_s - params.max_lead_s) / params.max_lead_s)
    return 0.8 if lead_s >= -tick_s else 0.3


def _strength(p: float, effect: float) -> float:
    """A change's weight: its significance (-log10 p, full at 1e-10) times its size (Cohen's d, full at 2)."""
    sig = 1.0 if p <= 0 else min(1.0, -math.log10(p) / 10.0)
    return sig * min(1.0, 0.5 + effect / 4.0)


def _change(times: np.ndarray, x: np.ndarray, params: AttributionParams,
            between: tuple[int, int] | None = None) -> tuple[int, float, float] | None:
    """(time, p, effect size) of the single change point that best splits ``x``, or None when none is
    significant (or, given ``between``, when it is not within it)."""
    ok = ~np.isnan(x)
    if ok.sum() < params.min_points:
        return None
    t, v = times[ok], x[ok]
    n = v.size
    if np.ptp(v) == 0:
        return None
    # The split that maximises the between-segment difference of means, scaled by segment sizes (a CUSUM
    # argmax); its significance by Welch's t-test, its size as Cohen's d.
    k = np.arange(1, n)
    csum = np.cumsum(v)[:-1]
    left = csum / k
    right = (v.sum() - csum) / (n - k)
    score = np.abs(left - right) * np.sqrt(k * (n - k) / n)
    lo = max(3, n // 20)
    if n - 2 * lo < 1:
        return None
    j = lo - 1 + int(np.argmax(score[lo - 1:n - lo]))
    # The series' own best split must fall where a cause's would (split j starts the second segment at t[j + 1]):
    # a step just outside, seen through the window's edge, is not moved in.
    if between is not None and not between[0] <= t[j + 1] <= between[1]:
        return None
    a, b = v[:j + 1], v[j + 1:]
    sd = math.sqrt((float(a.var()) + float(b.var())) / 2.0)
    if sd == 0:
        return (int(t[j + 1]), 0.0, 10.0) if a[0] != b[0] else None
    # Welch's t-test (as scipy.stats.ttest_ind with equal_var=False), its p-value from scipy.special.stdtr.
    va, vb = float(a.var(ddof=1)) / a.size if a.size > 1 else 0.0, float(b.var(ddof=1)) / b.size if b.size > 1 else 0.0
    se = math.sqrt(va + vb)
    if se == 0:
        return (int(t[j + 1]), 0.0, 10.0) if a.mean() != b.mean() else None
    df = (va + vb) ** 2 / ((va * va / (a.size - 1) if a.size > 1 else 0.0) + (vb * vb / (b.size - 1) if b.size > 1
                                                                                else 0.0) or 1e-300)
    from scipy.special import stdtr  # here: scipy.special costs ~0.25 s to import, and a CLI never needs it

    p = float(2.0 * stdtr(df, -abs(float(a.mean()) - float(b.mean())) / se))
    if not math.isfinite(p) or p >= params.max_p:
        return None
    return int(t[j + 1]), p, min(10.0, abs(float(a.mean()) - float(b.mean())) / sd)


def _lagged_correlations(block: np.ndarray, y: np.ndarray, max_lag: int,
                         params: AttributionParams) -> tuple[np.ndarray, np.ndarray]:
    """Per series, the Pearson correlation with ``y`` at the lag (0..``max_lag`` ticks, the series leading) where it
    is strongest among those significant at ``max_p`` (NaN where none is), and that lag. All series at once; the
    p-values from the t distribution (``scipy.special.stdtr``), as ``scipy.stats.pearsonr`` gives them."""
    from scipy.special import stdtr  # here, as in _change

    k, n = block.shape
    best_r = np.full(k, np.nan)
    best_lag = np.zeros(k, dtype=np.int64)
    with np.errstate(all="ignore"):
        for lag in range(0, min(max_lag, n - params.min_points) + 1):
            xs, ys = (block[:, :n - lag], y[lag:]) if lag else (block, y)
            valid = ~np.isnan(xs) & ~np.isnan(ys)[None, :]
            cnt = valid.sum(axis=1)
            denom = np.maximum(cnt, 1)
            mx = np.where(valid, xs, 0.0).sum(axis=1) / denom
            my = np.where(valid, ys[None, :], 0.0).sum(axis=1) / denom
            dx = np.where(valid, xs - mx[:, None], 0.0)
            dy = np.where(valid, ys[None, :] - my[:, None], 0.0)
            sxx, syy = (dx * dx).sum(axis=1), (dy * dy).sum(axis=1)
            r = np.clip((dx * dy).sum(axis=1) / np.sqrt(sxx * syy), -1.0, 1.0)
            df = np.maximum(cnt - 2, 1)
            t = r * np.sqrt(df / np.maximum(1.0 - r * r, 1e-300))
            p = 2.0 * stdtr(df, -np.abs(t))  # the t distribution's two-sided tail
            ok = (cnt >= params.min_points) & (sxx > 0) & (syy > 0) & np.isfinite(r) & (p < params.max_p)
            better = ok & (np.isnan(best_r) | (np.abs(r) > np.abs(best_r) + 1e-9))
            best_r[better] = r[better]
            best_lag[better] = lag
    return best_r, best_lag


def context_causes(happenings: Iterable[Happening], gpu: str, pod: str, onset_ns: int,
                   params: AttributionParams) -> list[tuple[Cause, float]]:
    """Causes from the node's Kubernetes events, other detections and label changes (the best witness of each)."""
    best: dict[str, tuple[float, Happening]] = {}
    for h in happenings:
        conf = _context_confidence(h, gpu, pod, onset_ns, params)
        if conf is not None and conf > best.get(h.reason, (-1.0, h))[0]:
            best[h.reason] = (conf, h)
    out = []
    for reason, (conf, h) in best.items():
        lead_s = round((onset_ns - h.ts_ns) / S, 3)
        if h.type == "detection":
            ev: dict[str, EvidenceValue] = {"source": "detection", "gpu": h.gpus[0] if h.gpus else None,
                                            "lead_s": lead_s, "id": h.detail}
        elif h.type == "labels":
            ev = {"source": "labels", "lead_s": lead_s, "change": h.detail}
        else:
            ev = {"source": "k8s", "type": h.type, "pod": h.pod or None, "lead_s": lead_s,
                  "message": h.detail[:200] or None}
        out.append((Cause(reason, round(conf, 4), ev), float(h.ts_ns)))
    return out


def _context_confidence(h: Happening, gpu: str, pod: str, onset_ns: int, params: AttributionParams) -> float | None:
    distance_s = abs(onset_ns - h.ts_ns) / S
    # What began after the episode did is more likely its consequence (a drift while a checkpoint storm blocks the
    # GPUs, an OOM kill after memory leaked): it counts less, a Kubernetes event least so.
    after = h.ts_ns > onset_ns
    fade = math.exp(-distance_s / params.fade_s) * ((0.5 if h.type not in ("detection", "labels") else 0.3)
                                                    if after else 1.0)
    if h.type == "detection":
        return (0.75 if gpu in h.gpus else 0.35) * (0.4 if h.reason in _TRANSIENT_RULES else 1.0) * fade
    if h.type == "labels":
        return 0.7 * fade if gpu in h.gpus else None
    mine = (h.pod and h.pod == pod) or gpu in h.gpus
    if h.reason in _QUIET_EVENTS or not (mine or (not h.pod and not h.gpus)):
        return None
    return EVENT_WEIGHT.get(h.reason, 0.6 if h.type == "Warning" else 0.3) * fade
