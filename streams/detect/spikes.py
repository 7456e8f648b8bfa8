"""L1 spike engine (seed 001 §3.1): sliding P99 over 100 ms buckets in a 1 s window, per series.

It runs on the raw sub-second samples (10 Hz), not on frames: a 200 ms burst to 99%
inside 60% load is two samples, which a 1 s mean already halves and a 60 s mean erases.

- A sample lands in bucket ``ts_ns // bucket_ns``. A window ends at every bucket
  boundary and covers the ``window_ns / bucket_ns`` buckets before it.
- ``tick_peak`` is the highest window quantile among the windows that end inside
  ``[tick_ns, tick_ns + grid_ns)``, so a tick's figure needs samples only up to 100 ms
  before its end. The quantile is the nearest rank (numpy ``method="inverted_cdf"``,
  Hyndman-Fan 1): the smallest value with at least q of the window's values at or below
  it; at q=0.99 and up to 100 samples per window, the window maximum. Not numpy's default
  linear method: a sample above the threshold in a sparse window is a spike that lasted at
  least one sampling interval, and the linear P99 of 10 values (position 8.91) gives
  0.91 * spike + 0.09 * background, hiding a 200 ms spike that jitter left one sample.
- Bounded buckets: each keeps at most ``max_per_bucket`` values (K), the largest ones, and
  a count of the rest. The top K values of every bucket contain the top K values of any
  union of buckets, and the nearest rank of n values needs only the top
  ``floor(n * (1 - q)) + 1`` (at most ``ceil(n * (1 - q)) + 1``) of them, so it is exact
  while that is <= K: at q=0.99 and K=64, up to 6,399 samples per window (~6.4 kHz; the
  feed is 10 Hz). Past that it can only under-estimate.
- Bounded series: a bucket more than ``horizon_ns`` behind its series' newest sample,
  or older than the last ``evict_before`` horizon, is dropped (late samples for it are
  counted in ``late_samples``); beyond ``max_series`` the least recently fed series goes.
  So read a tick's peak before feeding a series more than ``horizon_ns`` past it (the
  pipeline reads each tick as it closes).
- ``add`` groups by bucket with numpy for large calls; calls of a few samples (one
  message, ~10 at 10 Hz) take a plain loop, cheaper than numpy's per-call overhead. A
  large call of one sample per new bucket (10 Hz into 100 ms buckets, the batched feed) is
  held in the mirror alone, as numpy arrays: its buckets are read from there and purged,
  so a list and a dict entry per bucket would be built only to be dropped; a path that
  reads or changes the buckets' dict copies them in first (``BucketSeries.settle``).
- ``tick_peak`` evaluates, with numpy, the windows of the asked tick and of the following
  ticks whose windows end by the series' newest bucket (up to ``_AHEAD`` ticks: a 10 s
  message closes ~10 ticks at once), and caches those ticks' peaks. An ``add`` that reaches
  a bucket a cached window reads drops the cache, and a purge (``release``,
  ``evict_before``, the horizon) invalidates the ticks whose windows read a purged bucket,
  so a cached peak is always the one the state would give now. Only a lone tick (nothing
  to read ahead) takes the plain sliding loop. Both evaluations live in
  streams/detect/spike_windows.py, the storage, the mirror and the cache in
  streams/detect/spike_series.py; this module decides when each is fed, read and purged.

Arrival order does not matter: buckets hold multisets, and the top K of a multiset is
the same in any order.

>>> eng = SpikeEngine(SpikeParams(), grid_ns=1_000_000_000)
>>> ts = np.arange(0, 3_000_000_000, 100_000_000, dtype=np.int64)
>>> util = np.full(ts.size, 60.0); util[13:15] = 99.0   # 200 ms at 99% during second 1
>>> eng.add("n", "0", "gpu_util", ts, util)
>>> [round(eng.tick_peak("n", "0", "gpu_util", t * 1_000_000_000) or 0.0, 1) for t in range(3)]
[60.0, 99.0, 99.0]
>>> from streams.detect.spike_rule import SPIKE_THRESHOLDS, spike_flags
>>> spike_flags(eng.tick_peak("n", "0", "gpu_util", 1_000_000_000), SPIKE_THRESHOLDS["gpu_util"])
True
>>> util[13:15] = 60.0; util[14] = 99.0   # jitter left the spike one sample: still caught
>>> eng = SpikeEngine(SpikeParams(), grid_ns=1_000_000_000)
>>> eng.add("n", "0", "gpu_util", ts, util)
>>> eng.tick_peak("n", "0", "gpu_util", 1_000_000_000)
99.0
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from streams.detect.spike_rule import SpikeParams
from streams.detect.spike_series import BucketSeries

# quantile_of_top is re-exported: it lived here before the evaluation moved to spike_windows.
from streams.detect.spike_windows import WindowQuantiles, quantile_of_top

__all__ = ["SpikeEngine", "quantile_of_top"]

Key = tuple[str, str, str]  # node, gpu, sensor
_SMALL: Final = 32  # calls with at most this many samples take the plain-loop path
_AHEAD: Final = 64  # tick_peak evaluates at most this many ticks in one go (and caches them)
_BIG: Final = 1e300  # values beyond this (or inf) are not mirrored: numpy would warn where Python does not


class SpikeEngine:
    """Sliding-window high quantile per (node, gpu, sensor) series over raw samples."""

    def __init__(self, params: SpikeParams, grid_ns: int) -> None:
        if grid_ns < params.bucket_ns:
            raise ValueError("grid_ns must be at least one bucket")
        self.params, self.grid_ns = params, grid_ns
        self._nb = params.window_ns // params.bucket_ns
        self._keep = params.horizon_ns // params.bucket_ns
        self._series: OrderedDict[Key, BucketSeries] = OrderedDict()
        self._floor = -(2**62)  # buckets below this are closed (evict_before)
        self.late_samples = 0  # samples for buckets already dropped
        self.evicted_series = 0
        self._wq = WindowQuantiles(self._nb, params.max_per_bucket, params.quantile)

    def add(self, node: str, gpu: str, sensor: str, ts_ns: npt.NDArray[np.int64],
            values: npt.NDArray[np.float64]) -> None:
        """Add one series' samples (any order; NaN values are skipped)."""
        ts, vs = np.asarray(ts_ns, dtype=np.int64), np.asarray(values, dtype=np.float64)
        if ts.shape != vs.shape or ts.ndim != 1:
            raise ValueError("ts_ns and values must be 1-d arrays of the same length")
        if ts.size == 0:
            return
        s = self._series_of(node, gpu, sensor)
        if ts.size <= _SMALL:
            self._add_few(s, ts.tolist(), vs.tolist())
        else:
            self._add_many(s, ts, vs)
        self._bound(s)

    def add_block(self, nodes: Sequence[str], gpus: Sequence[str], sensor: str, lens: Sequence[int],
                  ts_ns: npt.NDArray[np.int64], values: npt.NDArray[np.float64]) -> None:
        """``add`` for several series of ``sensor`` at once: series i's ``lens[i]`` samples lie back to back."""
        tl, vl = ts_ns.tolist(), values.tolist()
        a = 0
        for node, gpu, n in zip(nodes, gpus, lens, strict=True):
            if n:
                s = self._series_of(node, gpu, sensor)
                if n <= _SMALL:
                    self._add_few(s, tl[a:a + n], vl[a:a + n])
                else:
                    self._add_many(s, ts_ns[a:a + n], values[a:a + n])
                self._bound(s)
            a += n

    def _series_of(self, node: str, gpu: str, sensor: str) -> BucketSeries:
        key = (node, gpu, sensor)
        s = self._series.get(key)
        if s is None:
            s = self._series[key] = BucketSeries()
            if len(self._series) > self.params.max_series:
                self._series.popitem(last=False)
                self.evicted_series += 1
        else:
            self._series.move_to_end(key)
        return s

    def _bound(self, s: BucketSeries) -> None:
        if s.held() > self._keep + self._keep // 4 + 1:  # amortised: purge once a quarter past the bound
            s.purge(s.newest - self._keep)

    def _add_many(self, s: BucketSeries, ts: npt.NDArray[np.int64], vs: npt.NDArray[np.float64]) -> None:
        v_min = float(vs.min())  # NaN when any value is
        if v_min != v_min:
            ok = ~np.isnan(vs)
            ts, vs = ts[ok], vs[ok]
            if ts.size == 0:
                return
            v_min = float(vs.min())
        b = ts // self.params.bucket_ns
        step = b[1:] - b[:-1]
        rising = bool((step > 0).all())
        b_min, b_max = (int(b[0]), int(b[-1])) if rising else (int(b.min()), int(b.max()))
        newest_before = s.newest
        s.newest = max(s.newest, b_max)
        low = max(self._floor, s.newest - self._keep)
        if b_min < low:
            fresh = b >= low
            self.late_samples += int(b.size - np.count_nonzero(fresh))
            b, vs = b[fresh], vs[fresh]
            if b.size == 0:
                return
            b_min = int(b.min())
            step = b[1:] - b[:-1]
            rising = bool((step > 0).all())
        s.touch(b_min)
        if rising and b_min > newest_before and b_min >= s.m_from and v_min > -_BIG and float(vs.max()) < _BIG:
            s.hold_mirrored(b, vs)  # new buckets of one sample each, in order: the batched feed
            s.lowest = min(s.lowest, b_min)
            return
        s.settle()
        if rising:  # one sample per bucket, in order (10 Hz into 100 ms buckets)
            bl, vl = b.tolist(), vs.tolist()
            if bl[0] > newest_before:  # all new buckets: store them in one go, and mirror them
                s.vals.update(zip(bl, [[v] for v in vl], strict=True))
                self._mirror(s, b, vs, v_min)
            else:
                if bl[-1] >= s.m_from:
                    s.unmirror()
                get, cap = s.vals.get, self.params.max_per_bucket
                for bucket, v in zip(bl, vl, strict=True):
                    kept = get(bucket)
                    if kept is None:
                        s.vals[bucket] = [v]
                    elif len(kept) < cap:
                        kept.append(v)
                    else:
                        self._put(s, bucket, [v])
            s.lowest = min(s.lowest, bl[0])
            return
        if bool((step < 0).any()):  # group by bucket: a stable sort only when out of order
            order = np.argsort(b, kind="stable")
            b, vs = b[order], vs[order]
        starts = [0, *(np.flatnonzero(b[1:] != b[:-1]) + 1).tolist()]
        bl, vl = b[starts].tolist(), vs.tolist()
        truncated = len(s.dropped)
        for bucket, i, j in zip(bl, starts, [*starts[1:], len(vl)], strict=True):
            self._put(s, bucket, vl[i:j])
        if bl[0] > newest_before and len(s.dropped) == truncated:  # new buckets, none truncated
            self._mirror(s, b, vs, v_min)
        elif bl[-1] >= s.m_from:
            s.unmirror()
        s.lowest = min(s.lowest, bl[0])

    def _mirror(self, s: BucketSeries, b: npt.NDArray[np.int64], vs: npt.NDArray[np.float64], v_min: float) -> None:
        """Append new buckets (all past every bucket held), in order, to the mirror (or reset it);
        ``v_min`` is at most the lowest value."""
        if v_min > -_BIG and float(vs.max()) < _BIG:
            s.add_chunk(b, vs)
        else:
            s.unmirror()

    def _add_few(self, s: BucketSeries, tl: list[int], vl: list[float]) -> None:
        # Per-message calls carry ~10 samples (10 Hz, 1 s): numpy's per-call overhead
        # would cost more than a plain loop, so small calls take this path.
        s.settle()
        bns = self.params.bucket_ns
        s.newest = max(s.newest, max(tl) // bns)
        s.touch(min(tl) // bns)
        low = max(self._floor, s.newest - self._keep)
        for t, v in zip(tl, vl, strict=True):
            if v != v:  # NaN
                continue
            b = t // bns
            if b < low:
                self.late_samples += 1
                continue
            kept = s.vals.get(b)
            if kept is None:
                s.vals[b] = [v]
                s.lowest = min(s.lowest, b)
            elif len(kept) < self.params.max_per_bucket:
                kept.append(v)
            else:
                self._put(s, b, [v])
                if b >= s.m_from:
                    s.unmirror()
                continue
            if b >= s.m_from:
                if b >= s.m_last and -_BIG < v < _BIG:  # in order: mirror it
                    s.m_pb.append(b)
                    s.m_pv.append(v)
                    s.m_last = b
                    if len(s.m_pb) > 4_096:
                        s.mirrored()
                else:
                    s.unmirror()

    def _put(self, s: BucketSeries, bucket: int, new: list[float]) -> None:
        kept = s.vals.get(bucket)
        if kept is None:
            kept = s.vals[bucket] = new
        else:
            kept += new
        cap = self.params.max_per_bucket
        if len(kept) > cap:
            kept.sort(reverse=True)
            s.dropped[bucket] = s.dropped.get(bucket, 0) + len(kept) - cap
            del kept[cap:]

    def tick_peak(self, node: str, gpu: str, sensor: str, tick_ns: int) -> float | None:
        """The highest sliding-window nearest-rank P99 among the windows that END inside [tick_ns, tick_ns + grid_ns)
        (a window ends at each bucket boundary); None without samples."""
        s = self._series.get((node, gpu, sensor))
        return None if s is None else self._peak(s, tick_ns)

    def close_ticks(self, nodes: Sequence[str], gpus: Sequence[str], sensor: str, ticks: Sequence[int]
                    ) -> npt.NDArray[np.float64]:
        """``tick_peak`` of each closed frame (NaN for None), then each series ``release``d up to its newest of
        these ticks that had a peak: what a frame at a time gives, since a series' ticks close in order and no
        window of a later tick reads a bucket an earlier tick's release drops; one purge per series, not per tick.

        >>> eng = SpikeEngine(SpikeParams(), grid_ns=1_000_000_000)
        >>> ts = np.arange(0, 3_000_000_000, 100_000_000, dtype=np.int64)
        >>> util = np.full(ts.size, 60.0); util[13:15] = 99.0
        >>> eng.add("n", "0", "gpu_util", ts, util)
        >>> eng.close_ticks(["n", "n", "m"], ["0", "0", "0"], "gpu_util", [0, 1_000_000_000, 0]).tolist()
        [60.0, 99.0, nan]
        """
        out = np.full(len(ticks), np.nan)
        newest: dict[tuple[str, str], int] = {}
        series = self._series
        for i, (node, gpu, tick) in enumerate(zip(nodes, gpus, ticks, strict=True)):
            s = series.get((node, gpu, sensor))
            if s is None:
                continue
            got = self._peak(s, tick)
            if got is not None:
                out[i] = got
                if tick > newest.get((node, gpu), tick - 1):
                    newest[(node, gpu)] = tick
        for (node, gpu), tick in newest.items():
            self.release(node, gpu, sensor, tick)
        return out

    def _peak(self, s: BucketSeries, tick_ns: int) -> float | None:
        got = s.cache.get(tick_ns)
        if got is not None and got[1] >= s.cut:
            return got[0]
        bns, grid = self.params.bucket_ns, self.grid_ns
        # The ticks from this one whose windows end by the newest bucket (their peaks will not
        # change unless older samples come): evaluate them together, from the mirror.
        ahead = min(((s.newest + 2) * bns - tick_ns) // grid, _AHEAD)
        first = -(-tick_ns // bns)  # boundaries j * bucket_ns inside the tick
        if ahead >= 2 and first - self._nb >= s.m_from:
            ends = [-(-(tick_ns + k * grid) // bns) for k in range(ahead + 1)]  # tick k: ends[k] .. ends[k+1]-1
            mb, mv = s.mirrored()
            peaks = self._wq.peaks_ahead(mb, mv, ends)
            if peaks is not None:  # cache them, each valid while the first bucket its windows read is held
                s.cache = {tick_ns + k * grid: (peak, ends[k] - self._nb) for k, peak in enumerate(peaks)}
                s.cache_hi = ends[len(peaks)] - 2  # the last bucket a cached window reads
                return peaks[0]
        s.settle()
        return self._wq.peak_one(s.vals, s.dropped, first, -(-(tick_ns + grid) // bns) - 1)

    def release(self, node: str, gpu: str, sensor: str, tick_ns: int) -> None:
        """The series' ticks up to ``tick_ns`` are closed: drop the buckets no later window reads."""
        s = self._series.get((node, gpu, sensor))
        if s is not None:
            s.purge((tick_ns + self.grid_ns - self.params.window_ns) // self.params.bucket_ns)

    def evict_before(self, ts_ns: int) -> None:
        """Close windows ending before ``ts_ns``: drop buckets wholly older than ``ts_ns - window_ns``."""
        floor = (ts_ns - self.params.window_ns) // self.params.bucket_ns
        if floor <= self._floor:
            return
        self._floor = floor
        for key in [k for k, s in self._series.items() if s.newest < floor]:
            del self._series[key]
        for s in self._series.values():
            s.purge(floor)

    def buckets_held(self) -> int:
        self._settle_all()
        return sum(len(s.vals) for s in self._series.values())

    def values_held(self) -> int:
        self._settle_all()
        return sum(len(v) for s in self._series.values() for v in s.vals.values())

    def _settle_all(self) -> None:
        for s in self._series.values():
            s.settle()

    def __len__(self) -> int:
        return len(self._series)

    def snapshot(self) -> dict[str, Any]:
        """JSON-able state, series in least-recently-fed order."""
        self._settle_all()
        return {"floor": self._floor, "late_samples": self.late_samples, "evicted_series": self.evicted_series,
                "series": [[*k, s.newest, [[b, v, s.dropped.get(b, 0)] for b, v in s.vals.items()]]
                           for k, s in self._series.items()]}

    @classmethod
    def restore(cls, params: SpikeParams, grid_ns: int, snap: Mapping[str, Any]) -> SpikeEngine:
        eng = cls(params, grid_ns)
        eng._floor, eng.late_samples = int(snap["floor"]), int(snap["late_samples"])
        eng.evicted_series = int(snap["evicted_series"])
        for node, gpu, sensor, newest, buckets in snap["series"]:
            s = eng._series[(node, gpu, sensor)] = BucketSeries()
            s.newest = int(newest)
            s.unmirror()  # nothing mirrored: the mirror starts past the buckets restored
            for b, v, n in buckets:
                s.vals[int(b)] = [float(x) for x in v]
                if n:
                    s.dropped[int(b)] = int(n)
            s.lowest = min(s.vals, default=2**62)
        return eng

