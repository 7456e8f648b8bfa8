"""``pipeline_stall`` (seed 000 §2.5): the GPU idles while its steps wait on the input pipeline.

A tick is stalled when the latest step's ``dataloader_wait_ms`` (carried over the ticks a
blocked step leaves without a sample, up to ``carry_s``) is at least ``wait_ms`` and the
GPU's utilisation at most ``max_util_pct``. The rule fires when stalled ticks fill
``min_share`` of the last ``window_s``, for ``hold_s``: a training loop's short stalls between
phases never do.

>>> from schemas.frame_messages import GpuFrame
>>> d = PipelineStall(StallParams(window_s=10, hold_s=2), grid_ns=S)
>>> stall = GpuFrame("0", {}, {"dataloader_wait_ms": 400.0, "gpu_util": 3.0}, {"cost_usd": 0.001}, "")
>>> [(t, e.state) for t in range(12) if (e := d.update(t * S, stall, None))]
[(7, 'firing')]
"""

from __future__ import annotations

from schemas.frame_messages import GpuFrame
from streams.leaks.episode import Episode, LeakEvent, S, burn, rounded, value
from streams.leaks.params import StallParams
from streams.leaks.windows import Recent

RULE = "pipeline_stall"


class PipelineStall:
    rule = RULE

    def __init__(self, params: StallParams, grid_ns: int) -> None:
        self.p, self.grid_ns = params, grid_ns
        self.ep = Episode(int(params.hold_s * S), int(params.clear_s * S))
        self._stalled = Recent(int(params.window_s * S))  # 1.0 / 0.0 per tick
        self._waits = Recent(int(params.window_s * S))  # the waits and utilisations of stalled ticks
        self._utils = Recent(int(params.window_s * S))
        self._wait: tuple[int, float] | None = None
        self._price: float | None = None
        self._share = 0.0

    def update(self, t_ns: int, g: GpuFrame, price: float | None) -> LeakEvent | None:
        p = self.p
        w = value(g, "dataloader_wait_ms")
        if w is not None:
            self._wait = (t_ns, w)
        elif self._wait is not None and t_ns - self._wait[0] > p.carry_s * S:
            self._wait = None
        util = value(g, "gpu_util")
        if util is None or self._wait is None:
            bad: bool | None = None
        else:
            stalled = self._wait[1] >= p.wait_ms and util <= p.max_util_pct
            self._stalled.add(t_ns, float(stalled))
            if stalled:
                self._waits.add(t_ns, self._wait[1])
                self._utils.add(t_ns, util)
            enough = self._stalled.covered_ns >= p.window_s * S / 2
            self._share = self._stalled.mean() or 0.0
            bad = enough and self._share >= p.min_share
        if price is not None:
            self._price = price
        step = self.ep.step(t_ns, bad)
        if step is None:
            return None
        return self._event(step, t_ns)

    def _event(self, step: str, t_ns: int) -> LeakEvent:
        util = self._utils.mean()
        waste = self._share * (1.0 - (util or 0.0) / 100.0)
        return LeakEvent(RULE, "firing" if step == "fire" else "resolved", self.ep.last_onset_ns, t_ns,
                         value=round(self._share, 4), threshold=self.p.min_share, evidence={
                             "stall_share": round(self._share, 4), "window_s": self.p.window_s,
                             "dataloader_wait_ms": rounded(self._waits.mean()), "gpu_util": rounded(util),
                             "wait_threshold_ms": self.p.wait_ms, "cost_usd_per_h": burn(self._price, waste)})

