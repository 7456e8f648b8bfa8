"""``batching_collapse`` (seed 000 §2.4): the queue grows while the GPU's utilisation collapses and latency climbs.

Each series is compared with the GPU's own steady state: the median of 10 s slot means over
``baseline_s`` of ticks that were not suspect. The window's medians must show all three at
once: queue depth up ``queue_factor`` times (and by ``min_queue_rise``), utilisation down to
``util_ratio`` of its baseline, latency up ``latency_factor`` times. A queue that grows with
the load while the GPU keeps up (utilisation holds) is not a collapse.

>>> from schemas.frame_messages import GpuFrame
>>> d = BatchingCollapse(BatchingParams(learn_s=60, window_s=10, hold_s=5), grid_ns=S)
>>> def f(q, u, lat):
...     return GpuFrame("0", {}, {"queue_depth": q, "gpu_util": u, "request_latency_ms": lat}, {}, "")
>>> [d.update(t * S, f(2, 78, 15), None) for t in range(90)].count(None)
90
>>> [(t, e.state) for t in range(90, 130) if (e := d.update(t * S, f(43, 4, 310), None))]
[(99, 'firing')]
"""

from __future__ import annotations

from schemas.frame_messages import GpuFrame
from streams.leaks.episode import Episode, LeakEvent, S, burn, rounded, util_drop, value
from streams.leaks.params import BatchingParams
from streams.leaks.windows import Recent, Slots

RULE = "batching_collapse"
_SERIES = ("queue_depth", "gpu_util", "request_latency_ms")
_SLOT_NS = 10 * S


class BatchingCollapse:
    rule = RULE

    def __init__(self, params: BatchingParams, grid_ns: int) -> None:
        self.p, self.grid_ns = params, grid_ns
        self.ep = Episode(int(params.hold_s * S), int(params.clear_s * S))
        window, span = int(params.window_s * S), int(params.baseline_s * S)
        self._now = tuple(Recent(window) for _ in _SERIES)  # queue, utilisation, latency
        self._base = tuple(Slots(_SLOT_NS, span) for _ in _SERIES)
        self._base_med: list[float | None] = [None, None, None]
        self._price: float | None = None

    def update(self, t_ns: int, g: GpuFrame, price: float | None) -> LeakEvent | None:
        p = self.p
        q, u, lat = value(g, "queue_depth"), value(g, "gpu_util"), value(g, "request_latency_ms")
        if q is None or u is None or lat is None:
            return None
        now_q, now_u, now_lat = self._now
        now_q.add(t_ns, q)
        now_u.add(t_ns, u)
        now_lat.add(t_ns, lat)
        if price is not None:
            self._price = price
        bq, bu, blat = self._base_med
        nq = nu = nlat = None
        bad = False
        if (bq is not None and bu is not None and blat is not None
                and self._base[1].covered_ns >= p.learn_s * S and bu >= p.min_base_util_pct):
            q_bar, u_bar, lat_bar = max(p.queue_factor * bq, bq + p.min_queue_rise), p.util_ratio * bu, \
                p.latency_factor * blat
            # The window's medians only when this tick itself looks collapsed or an episode is open: a healthy
            # tick cannot start one, and most ticks are healthy.
            if (q >= q_bar and u <= u_bar and lat >= lat_bar) or self.ep.pending_onset is not None:
                nq, nu, nlat = now_q.median(), now_u.median(), now_lat.median()
                assert nq is not None and nu is not None and nlat is not None
                bad = nq >= q_bar and nu <= u_bar and nlat >= lat_bar
        step = self.ep.step(t_ns, bad)
        if not bad and not self.ep.firing and self.ep.pending_onset is None:
            for i, v in enumerate((q, u, lat)):
                base = self._base[i]
                if base.add(t_ns, v):
                    self._base_med[i] = base.median()
        if step is None:
            return None
        if nq is None or nu is None or nlat is None:
            nq, nu, nlat = (w.median() or 0.0 for w in self._now)
        assert bu is not None
        return LeakEvent(RULE, "firing" if step == "fire" else "resolved", self.ep.last_onset_ns, t_ns,
                         value=round(nu, 3), threshold=round(p.util_ratio * bu, 3), baseline=round(bu, 3),
                         evidence={"queue_depth": round(nq, 3), "queue_baseline": rounded(bq),
                                   "gpu_util": round(nu, 3), "gpu_util_baseline": round(bu, 3),
                                   "request_latency_ms": round(nlat, 3), "latency_baseline_ms": rounded(blat),
                                   "window_s": p.window_s,
                                   "cost_usd_per_h": burn(self._price, util_drop(bu, nu))})

