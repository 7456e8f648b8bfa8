"""Each frame's FLOPS/W in 100 ms buckets: what lets the drift rule time a hold to the sub-second.

A frame's FLOPS/W is its tick's mean activity over its mean power. The drift rule confirms "12%
below for 3 s" (seed 000 §1), and on a 1 s grid a tick-level rule can only say so at the end of the
tick in which the 3 s complete: 3-4 s after the onset. The raw samples (10 Hz) say more: this
module keeps, per GPU, the sums of the tick's activity (tensor, else SM) and power samples in
buckets of ``bucket_ns``, and gives each closed frame its profile: the FLOPS/W of each bucket,
scaled from the frame's own FLOPS/W (so the profile's mean matches the frame, whatever the price
book says the GPU's peak is), None where a bucket has no activity or power sample.

Bounded: a GPU's buckets are released as its ticks close (``release``), buckets behind
``evict_before`` are dropped with GPUs that went away, and at most ``max_series`` GPUs are held.

>>> import numpy as np
>>> st = SubTicks(bucket_ns=100, grid_ns=1_000)
>>> ts = np.arange(0, 1_000, 100, dtype=np.int64)
>>> st.add("n", "0", TENSOR, ts, np.array([0.8] * 5 + [0.6] * 5))
>>> st.add("n", "0", POWER, ts, np.full(10, 400.0))
>>> [round(x, 3) for x in st.profile("n", "0", 0, fpw=1.4, activity=0.7, power=400.0)]
[1.6, 1.6, 1.6, 1.6, 1.6, 1.2, 1.2, 1.2, 1.2, 1.2]
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

import numpy as np
import numpy.typing as npt

TENSOR: Final = 0
SM: Final = 1
POWER: Final = 2
_SMALL: Final = 32  # calls with at most this many samples take the plain loop (numpy's per-call cost)


class SubTicks:
    """Activity and power sums per bucket, per (node, gpu)."""

    def __init__(self, bucket_ns: int, grid_ns: int, max_series: int = 200_000) -> None:
        if bucket_ns <= 0 or grid_ns % bucket_ns:
            raise ValueError("grid_ns must be a multiple of bucket_ns > 0")
        self.bucket_ns, self.grid_ns, self.max_series = bucket_ns, grid_ns, max_series
        # (node, gpu) -> bucket -> [tensor sum, n, sm sum, n, power sum, n]
        self._series: OrderedDict[tuple[str, str], dict[int, list[float]]] = OrderedDict()
        # (node, gpu) -> no bucket below this is held: ``release`` drops a range instead of scanning every bucket
        # (a batched message holds ~100 buckets ahead; a scan per closed tick was 16% of the worker's time)
        self._lo: dict[tuple[str, str], int] = {}
        self._floor = -(2**62)

    def add(self, node: str, gpu: str, kind: int, ts_ns: npt.NDArray[np.int64], values: npt.NDArray[np.float64]
            ) -> None:
        # This runs on the ingest's hot path, per message: small calls (~10 samples at 10 Hz) take a plain
        # loop, where numpy's per-call overhead would cost more; batched messages group with numpy.
        key = (node, gpu)
        s = self._series.get(key)
        if s is None:
            s = self._series[key] = {}
            if len(self._series) > self.max_series:
                gone, _ = self._series.popitem(last=False)
                self._lo.pop(gone, None)
        else:
            self._series.move_to_end(key)
        i, bns, floor, get = 2 * kind, self.bucket_ns, self._floor, s.get
        if ts_ns.size > _SMALL:  # a batched message: group by bucket with numpy, then one update per bucket
            b = ts_ns // bns
            ok = (values == values) & (b >= floor)
            buckets, inv = np.unique(b[ok], return_inverse=True)
            if not buckets.size:
                return
            sums, counts = np.bincount(inv, weights=values[ok]), np.bincount(inv)
            first = int(buckets[0])  # np.unique sorts
            if first < self._lo.get(key, first + 1):
                self._lo[key] = first
            for bucket, total, count in zip(buckets.tolist(), sums.tolist(), counts.tolist(), strict=True):
                acc = get(bucket)
                if acc is None:
                    acc = s[bucket] = [0.0, 0, 0.0, 0, 0.0, 0]
                acc[i] += total
                acc[i + 1] += count
            return
        for t, x in zip(ts_ns.tolist(), values.tolist(), strict=True):
            if x != x:  # NaN
                continue
            bucket = t // bns
            if bucket < floor:
                continue
            acc = get(bucket)
            if acc is None:
                acc = s[bucket] = [0.0, 0, 0.0, 0, 0.0, 0]
                if bucket < self._lo.get(key, bucket + 1):
                    self._lo[key] = bucket
            acc[i] += x
            acc[i + 1] += 1

    def profile(self, node: str, gpu: str, tick_ns: int, fpw: float, activity: float, power: float
                ) -> tuple[float | None, ...]:
        """The tick's FLOPS/W per bucket, from the frame's ``fpw`` and the means it was made of."""
        n = self.grid_ns // self.bucket_ns
        s = self._series.get((node, gpu))
        if s is None or not (fpw == fpw and activity > 0 and power > 0):
            return (None,) * n
        first = tick_ns // self.bucket_ns
        use = TENSOR if any(s.get(first + k, (0.0,) * 6)[1] for k in range(n)) else SM
        out: list[float | None] = []
        for k in range(n):
            acc = s.get(first + k)
            if acc is None or not acc[2 * use + 1] or not acc[5] or acc[4] <= 0:
                out.append(None)
                continue
            act_b, power_b = acc[2 * use] / acc[2 * use + 1], acc[4] / acc[5]
            out.append(fpw * (act_b / activity) * (power / power_b))
        return tuple(out)

    def release(self, node: str, gpu: str, tick_ns: int) -> None:
        """The GPU's ticks up to ``tick_ns`` are closed: drop their buckets."""
        key = (node, gpu)
        s = self._series.get(key)
        if s is None:
            return
        end = (tick_ns + self.grid_ns) // self.bucket_ns
        lo = self._lo.get(key)
        if lo is None or lo >= end:
            return  # nothing held below end
        if end - lo <= 4 * len(s):
            pop = s.pop
            for bucket in range(lo, end):
                pop(bucket, None)
        else:  # a long gap since the last release: fewer buckets held than the range spans
            for bucket in [b for b in s if b < end]:
                del s[bucket]
        self._lo[key] = end

    def evict_before(self, ts_ns: int) -> None:
        """Drop buckets before ``ts_ns``, and GPUs left with none."""
        floor = ts_ns // self.bucket_ns
        if floor <= self._floor:
            return
        self._floor = floor
        for key in list(self._series):
            s = self._series[key]
            for bucket in [b for b in s if b < floor]:
                del s[bucket]
            if not s:
                del self._series[key]
                self._lo.pop(key, None)
            elif self._lo.get(key, floor) < floor:
                self._lo[key] = floor

    def buckets_held(self) -> int:
        return sum(len(s) for s in self._series.values())
