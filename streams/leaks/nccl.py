"""NCCL's two traps (seed 000 §2.2), each against the workload's own history on this GPU.

``nccl_retransmit_storm``: the retransmits of the last ``window_s`` (the ``nccl_retries``
counter's increase per tick) against the rate of ``baseline_s`` of clean history: at least
``factor`` times as many, at least ``min_count``, and a Poisson tail (``scipy.stats.poisson``)
below ``max_p`` once the counts are scaled by the baseline's dispersion (retries come in clusters),
so a training job's usual bursts of retries do not fire.

``nccl_slow_allreduce``: the median over ``window_s`` of the ticks' mean AllReduce time at
least ``factor`` times its clean median and ``min_excess_ms`` above it, for ``hold_s``. A single
slow collective moves one tick, not the median.

>>> from schemas.frame_messages import GpuFrame
>>> d = RetransmitStorm(RetransmitParams(learn_s=60, window_s=20), grid_ns=S)
>>> def f(retries):
...     return GpuFrame("0", {}, {"nccl_retries": retries, "gpu_util": 80.0}, {}, "")
>>> [d.update(t * S, f(0.3), None) for t in range(100)].count(None)
100
>>> [(t, e.state) for t in range(100, 140) if (e := d.update(t * S, f(2.4), None))]
[(126, 'firing')]
"""

from __future__ import annotations

from collections import deque
from statistics import fmean

import numpy as np

from schemas.frame_messages import GpuFrame
from streams.leaks.episode import Episode, LeakEvent, S, burn, rounded, util_drop, value
from streams.leaks.params import RetransmitParams, SlowAllreduceParams
from streams.leaks.windows import Recent, Slots

STORM_RULE = "nccl_retransmit_storm"
SLOW_RULE = "nccl_slow_allreduce"
_SLOT_NS = 10 * S


class RetransmitStorm:
    rule = STORM_RULE

    def __init__(self, params: RetransmitParams, grid_ns: int) -> None:
        self.p, self.grid_ns = params, grid_ns
        self.ep = Episode(int(params.hold_s * S), int(params.clear_s * S))
        self._now = Recent(int(params.window_s * S))
        self._base = Slots(_SLOT_NS, int(params.baseline_s * S))  # retries per tick, as slot means
        self._base_util = Slots(_SLOT_NS, int(params.baseline_s * S))
        # Evidence only (read when an episode changes state): the last window's worth of ticks, no time keeping.
        self._util: deque[float] = deque(maxlen=max(1, int(params.window_s * S) // grid_ns))
        self._pending: deque[tuple[int, float, float | None]] = deque()
        self._stats: tuple[float, float] | None = None  # the baseline's (mean per tick, dispersion), per slot
        self._price: float | None = None

    def _base_stats(self) -> tuple[float, float]:
        """Mean retries per tick, and their dispersion: retries come in clusters (a slow collective retries
        several times), so the test is quasi-Poisson, the counts scaled by the variance over the mean of
        the baseline's 10 s slot counts."""
        if self._stats is None:
            means = np.asarray(self._base.means())
            mean = float(means.mean())
            per_slot = _SLOT_NS / self.grid_ns
            self._stats = (mean, max(1.0, float(means.var()) * per_slot / mean) if mean > 0 else 1.0)
        return self._stats

    def update(self, t_ns: int, g: GpuFrame, price: float | None) -> LeakEvent | None:
        p = self.p
        r = value(g, "nccl_retries")
        if r is None:
            return None
        self._now.add(t_ns, r)
        util = value(g, "gpu_util")
        if util is not None:
            self._util.append(util)
        if price is not None:
            self._price = price
        grid_s = self.grid_ns / S
        base_rate = None
        bad = False
        k = self._now.total()
        seconds = len(self._now) * grid_s
        if self._base.covered_ns >= p.learn_s * S and self._now.covered_ns >= p.window_s * S / 2:
            from scipy.stats import poisson  # here: scipy.stats costs ~0.5 s to import, and a CLI never needs it

            mean, dispersion = self._base_stats()
            base_rate = max(mean / grid_s, p.min_base_per_s)
            expected = base_rate * seconds
            bad = (k >= p.factor * expected and k >= p.min_count
                   and float(poisson.sf(k / dispersion - 1, expected / dispersion)) < p.max_p)
        step = self.ep.step(t_ns, bad)
        # A tick teaches the baseline once it has left the window unjudged: the first ticks of a storm,
        # before the window's count crosses the bar, must not raise the baseline they are judged by.
        self._pending.append((t_ns, r, util))
        if bad or self.ep.firing or self.ep.pending_onset is not None:
            self._pending.clear()
        while self._pending and self._pending[0][0] <= t_ns - p.window_s * S:
            t0, r0, u0 = self._pending.popleft()
            if self._base.add(t0, r0):
                self._stats = None
            if u0 is not None:
                self._base_util.add(t0, u0)
        if step is None:
            return None
        rate = k / seconds if seconds else 0.0
        bu, nu = self._base_util.median(), (fmean(self._util) if self._util else None)
        return LeakEvent(STORM_RULE, "firing" if step == "fire" else "resolved", self.ep.last_onset_ns, t_ns,
                         value=round(rate, 4), threshold=round(p.factor * (base_rate or p.min_base_per_s), 4),
                         baseline=None if base_rate is None else round(base_rate, 4),
                         evidence={"retries_per_s": round(rate, 4), "baseline_per_s": rounded(base_rate, 4),
                                   "ratio": None if not base_rate else round(rate / base_rate, 2),
                                   "retries_in_window": k, "window_s": p.window_s, "gpu_util": rounded(nu, 4),
                                   "gpu_util_baseline": rounded(bu, 4),
                                   "cost_usd_per_h": burn(self._price, util_drop(bu, nu))})


class SlowAllreduce:
    rule = SLOW_RULE

    def __init__(self, params: SlowAllreduceParams, grid_ns: int) -> None:
        self.p, self.grid_ns = params, grid_ns
        self.ep = Episode(int(params.hold_s * S), int(params.clear_s * S))
        self._now = Recent(int(params.window_s * S))
        self._base = Slots(_SLOT_NS, int(params.baseline_s * S))
        self._base_med: float | None = None
        # Evidence only (read when an episode changes state): the last window's worth of ticks, no time keeping.
        self._util: deque[float] = deque(maxlen=max(1, int(params.window_s * S) // grid_ns))
        self._base_util = Slots(_SLOT_NS, int(params.baseline_s * S))
        self._price: float | None = None

    def update(self, t_ns: int, g: GpuFrame, price: float | None) -> LeakEvent | None:
        p = self.p
        ms = value(g, "nccl_allreduce_ms")
        if ms is None:
            return None
        self._now.add(t_ns, ms)
        util = value(g, "gpu_util")
        if util is not None:
            self._util.append(util)
        if price is not None:
            self._price = price
        base = self._base_med
        now = None
        bad = False
        if base is not None and self._base.covered_ns >= p.learn_s * S and self._now.covered_ns >= p.window_s * S / 2:
            slow = ms >= p.factor * base and ms - base >= p.min_excess_ms
            if slow or self.ep.pending_onset is not None:  # a fast tick cannot start an episode: no median needed
                now = self._now.median()
                bad = now is not None and now >= p.factor * base and now - base >= p.min_excess_ms
        step = self.ep.step(t_ns, bad)
        if not bad and not self.ep.firing and self.ep.pending_onset is None:
            if self._base.add(t_ns, ms):
                self._base_med = self._base.median()
            if util is not None:
                self._base_util.add(t_ns, util)
        if step is None:
            return None
        now = now if now is not None else self._now.median() or 0.0
        bu, nu = self._base_util.median(), (fmean(self._util) if self._util else None)
        lost = util_drop(bu, nu)
        return LeakEvent(SLOW_RULE, "firing" if step == "fire" else "resolved", self.ep.last_onset_ns, t_ns,
                         value=round(now, 3), threshold=round(p.factor * (base or 0.0), 3),
                         baseline=rounded(base, 4),
                         evidence={"allreduce_ms": round(now, 3), "baseline_ms": rounded(base, 4),
                                   "ratio": None if not base else round(now / base, 2),
                                   "excess_ms": None if base is None else round(now - base, 3),
                                   "window_s": p.window_s, "gpu_util": rounded(nu, 4),
                                   "gpu_util_baseline": rounded(bu, 4),
                                   "gpu_s_lost_per_h": round(lost * 3600.0, 1),
                                   "cost_usd_per_h": burn(self._price, lost)})

