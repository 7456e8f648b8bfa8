"""``idle_allocated``: a pod holds a GPU that does no work, for longer than ``idle_s``.

A GPU no pod holds is free capacity, not a leak; a pod loading its weights (host-to-device
copies at warm-up) is busy. The episode's onset is its first idle tick, so the alert says how
long the GPU has been idle and what that cost so far.

>>> from schemas.frame_messages import GpuFrame
>>> d = IdleAllocated(IdleAllocatedParams(idle_s=3.0), grid_ns=S)
>>> held = GpuFrame("0", {"pod": "p"}, {"gpu_util": 0.0}, {"idle": 1.0, "cost_usd": 0.001}, "")
>>> [e and e.state for e in (d.update(t * S, held, 3.6) for t in range(5))]
[None, None, 'firing', None, None]
>>> busy = GpuFrame("0", {"pod": "p"}, {"gpu_util": 80.0}, {"idle": 0.0, "cost_usd": 0.001}, "")
>>> e = d.update(5 * S, busy, 3.6)
>>> e.state, e.evidence["idle_gpu_hours"], e.evidence["cost_usd"]
('resolved', 0.0014, 0.005)
"""

from __future__ import annotations

from schemas.frame_messages import GpuFrame
from streams.leaks.episode import LeakEvent, S, burn, value
from streams.leaks.params import IdleAllocatedParams

RULE = "idle_allocated"


class IdleAllocated:
    rule = RULE

    def __init__(self, params: IdleAllocatedParams, grid_ns: int) -> None:
        self.p, self.grid_ns = params, grid_ns
        self._since: int | None = None  # first idle tick of the current run
        self._pod = ""
        self._cost = 0.0
        self._price: float | None = None
        self._firing = False

    def update(self, t_ns: int, g: GpuFrame, price: float | None) -> LeakEvent | None:
        pod = str(g.labels.get("pod") or "")
        idle = self._idle(g) if pod else False
        if pod != self._pod:
            out = self._end(t_ns)
            self._pod = pod
            if idle:
                self._start(t_ns, price)
            return out
        if idle is None:
            return None
        if not idle:
            return self._end(t_ns)
        if self._since is None:
            self._start(t_ns, price)
            return None
        self._add(price)
        if not self._firing and t_ns + self.grid_ns - self._since >= self.p.idle_s * S:
            self._firing = True
            return self._event("firing", t_ns)
        return None

    def _idle(self, g: GpuFrame) -> bool | None:
        flag = g.derived.get("idle")
        if flag is None or flag != flag:  # derive had no utilisation nor activity: unknown
            util, sm = value(g, "gpu_util"), value(g, "sm_active")
            if util is None and sm is None:
                return None
            flag = float((util is None or util <= self.p.max_util_pct) and (sm is None or sm <= self.p.max_activity))
        if flag < 0.5:
            return False
        copies = sum(v for v in (value(g, "pcie_rx"), value(g, "pcie_tx")) if v is not None)
        return copies < self.p.busy_pcie_bytes_s

    def _start(self, t_ns: int, price: float | None) -> None:
        self._since, self._cost, self._price = t_ns, 0.0, None
        self._add(price)

    def _add(self, price: float | None) -> None:
        if price is not None:
            self._price = price
            self._cost += price * self.grid_ns / S / 3600.0

    def _end(self, t_ns: int) -> LeakEvent | None:
        out = self._event("resolved", t_ns) if self._firing else None
        self._since, self._firing = None, False
        return out

    def _event(self, state: str, t_ns: int) -> LeakEvent:
        assert self._since is not None
        idle_s = (t_ns + (self.grid_ns if state == "firing" else 0) - self._since) / S
        return LeakEvent(RULE, "firing" if state == "firing" else "resolved", self._since, t_ns, value=idle_s,
                         threshold=self.p.idle_s, evidence={
                             "pod": self._pod, "idle_s": round(idle_s, 3),
                             "idle_gpu_hours": round(idle_s / 3600.0, 4), "cost_usd": round(self._cost, 4),
                             "cost_usd_per_h": burn(self._price, 1.0)})
