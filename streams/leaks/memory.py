"""``memory_fragmentation`` (seed 000 §2.1): memory the GPU holds that no tensor uses, growing over minutes.

Two gaps, from NVML's ``fb_used`` and the framework's ``torch_reserved`` / ``torch_allocated``:
the driver gap (``fb_used`` above ``torch_reserved``: contexts and blocks the caching allocator
cannot return) and the allocator gap (``torch_reserved`` above ``torch_allocated``: cached,
fragmented blocks). A gap is a leak when it is far above normal (``min_gap_mib`` and a ratio)
and growing: the Theil-Sen slope (``scipy.stats.theilslopes``) of its 10 s slot means over the
last ``window_s`` at least ``min_growth_mib_per_min``, with its whole 95% interval above zero, and
each half of the window growing at half that at least (a gap that stepped once is not growing),
and the outer series (``fb_used``, or ``torch_reserved`` for the allocator gap) growing with it: a
flat cache whose tensors shrink with the load is not fragmenting.
A warm-up grows the memory, not the gap; a cache that is large but flat is not growing.

>>> from schemas.frame_messages import GpuFrame
>>> d = Fragmentation(FragmentationParams(), grid_ns=S, memory_mib=81920.0)
>>> def f(t):  # the driver gap grows by 60 MiB a minute from 2 GiB
...     res = 40 * 2**30
...     return GpuFrame("0", {}, {"fb_used": 40 * 1024 + 2048 + t, "torch_reserved": res,
...                              "torch_allocated": 0.8 * res}, {}, "")
>>> [(t, e.state, e.evidence["gap"]) for t in range(900) if (e := d.update(t * S, f(t), None))]
[(300, 'firing', 'driver')]
"""

from __future__ import annotations

import numpy as np

from schemas.frame_messages import GpuFrame
from streams.leaks.episode import Episode, LeakEvent, S, burn, value
from streams.leaks.params import FragmentationParams
from streams.leaks.windows import Slots

RULE = "memory_fragmentation"
_MIB = 1024.0 * 1024.0


class Fragmentation:
    rule = RULE

    def __init__(self, params: FragmentationParams, grid_ns: int, memory_mib: float | None = None) -> None:
        self.p, self.grid_ns, self.memory_mib = params, grid_ns, memory_mib
        self.ep = Episode(0, int(params.clear_s * S))
        slot, span = int(params.slot_s * S), int(params.window_s * S)
        self._fb, self._res, self._alloc = Slots(slot, span), Slots(slot, span), Slots(slot, span)
        self._price: float | None = None
        self._last: dict[str, float | str | None] = {}

    def update(self, t_ns: int, g: GpuFrame, price: float | None) -> LeakEvent | None:
        fb, res, alloc = value(g, "fb_used"), value(g, "torch_reserved"), value(g, "torch_allocated")
        if fb is None or res is None or alloc is None:
            return None
        if price is not None:
            self._price = price
        closed = self._fb.add(t_ns, fb)
        self._res.add(t_ns, res / _MIB)
        self._alloc.add(t_ns, alloc / _MIB)
        if not closed:
            return None
        step = self.ep.step(t_ns, self._judge())
        if step is None:
            return None
        ev = self._last
        stranded = float(ev.get("gap_mib") or 0.0)
        share = stranded / (self.memory_mib or fb) if (self.memory_mib or fb) else 0.0
        return LeakEvent(RULE, "firing" if step == "fire" else "resolved", self.ep.last_onset_ns, t_ns,
                         value=round(float(ev.get("slope_mib_per_min") or 0.0), 3),
                         threshold=self.p.min_growth_mib_per_min,
                         evidence={**ev, "stranded_mib": round(stranded, 1), "memory_share": round(share, 4),
                                   "cost_usd_per_h": burn(self._price, share)})

    def _judge(self) -> bool | None:
        p = self.p
        fb, res, alloc = (np.asarray(s.means()) for s in (self._fb, self._res, self._alloc))
        n = min(len(fb), len(res), len(alloc))
        if n * p.slot_s < p.min_span_s:
            return None
        fb, res, alloc = fb[-n:], res[-n:], alloc[-n:]
        minutes = (np.asarray(self._fb.times()[-n:], dtype=np.float64) - self._fb.times()[-n]) / (60.0 * S)
        found = False
        # The allocator gap must grow by the cache growing: a flat cache whose tensors shrink with the load is not.
        for gap_kind, gap, far, grower in (("driver", fb - res, p.driver_ratio * res[-1], fb),
                                           ("allocator", res - alloc, p.allocator_ratio * alloc[-1], res)):
            now = float(gap[-3:].mean())
            if now < max(p.min_gap_mib, far) and not self.ep.firing:
                if gap_kind == "driver":
                    self._last = {"gap": gap_kind, "gap_mib": round(now, 1)}
                continue  # not far above normal: no slope to fit (the common case, and the dear part)
            from scipy.stats import theilslopes  # here: scipy.stats costs ~0.5 s to import, and most runs never fit

            slope, _, lo, _ = theilslopes(gap, minutes, alpha=0.95)
            # Growth, not a step: each half of the window grows too (a cache that jumped once is flat in both).
            half = len(gap) // 2
            halves = [theilslopes(g, m)[0] for g, m in ((gap[:half], minutes[:half]), (gap[half:], minutes[half:]))]
            growing = (slope >= p.min_growth_mib_per_min and lo > 0 and min(halves) >= p.min_growth_mib_per_min / 2
                       and theilslopes(grower, minutes)[0] >= p.min_growth_mib_per_min / 2)
            if now >= max(p.min_gap_mib, far) and growing:
                found = True
            if found or (gap_kind == "driver" and not self.ep.firing):
                self._last = {"gap": gap_kind, "gap_mib": round(now, 1), "slope_mib_per_min": round(float(slope), 3),
                              "fb_used_mib": round(float(fb[-1]), 1), "torch_reserved_mib": round(float(res[-1]), 1),
                              "torch_allocated_mib": round(float(alloc[-1]), 1)}
            if found:
                break
        return found
