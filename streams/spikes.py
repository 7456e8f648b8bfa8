"""L1 spike engine (seed 001 §3.1): sliding P99 over 100 ms buckets in a 1 s window, per series.

It runs on the raw sub-second samples (10 Hz), not on frames: a 200 ms burst to 99%
inside 60% load is two samples, which a 1 s mean already halves and a 60 s mean erases.

- A sample lands in bucket ``ts_ns // bucket_ns``. A window ends at every bucket
  boundary and covers the ``window_ns / bucket_ns`` buckets before it.
- ``tick_peak`` is the highest window quantile among the windows that end inside
  ``[tick_ns, tick_ns + grid_ns)``, so a tick's figure needs samples only up to 100 ms
  before its end. The quantile is numpy's default ("linear", Hyndman-Fan 7).
- Bounded buckets: each keeps at most ``max_per_bucket`` values, the largest ones, and
  a count of the rest. The top K values of every bucket contain the top K values of any
  union of buckets, so a high quantile stays exact while the rank it needs from the top
  is below K: at q=0.99 and K=64, up to ~6,400 samples per window (6.4 kHz; the feed is
  10 Hz). Past that it can only under-estimate.
- Bounded series: a bucket more than ``horizon_ns`` behind its series' newest sample,
  or older than the last ``evict_before`` horizon, is dropped (late samples for it are
  counted in ``late_samples``); beyond ``max_series`` the least recently fed series goes.
  So read a tick's peak before feeding a series more than ``horizon_ns`` past it (the
  pipeline reads each tick as it closes).
- ``add`` groups by bucket with numpy for large calls; calls of a few samples (one
  message, ~10 at 10 Hz) take a plain loop, cheaper than numpy's per-call overhead.

Arrival order does not matter: buckets hold multisets, and the top K of a multiset is
the same in any order.

>>> eng = SpikeEngine(SpikeParams(), grid_ns=1_000_000_000)
>>> ts = np.arange(0, 3_000_000_000, 100_000_000, dtype=np.int64)
>>> util = np.full(ts.size, 60.0); util[13:15] = 99.0   # 200 ms at 99% during second 1
>>> eng.add("n", "0", "gpu_util", ts, util)
>>> [round(eng.tick_peak("n", "0", "gpu_util", t * 1_000_000_000) or 0.0, 1) for t in range(3)]
[60.0, 99.0, 99.0]
>>> spike_flags(eng.tick_peak("n", "0", "gpu_util", 1_000_000_000), SPIKE_THRESHOLDS["gpu_util"])
True
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

import numpy as np
import numpy.typing as npt

SPIKE_THRESHOLDS: Final[Mapping[str, float]] = MappingProxyType({"gpu_util": 95.0, "sm_active": 0.95})

Key = tuple[str, str, str]  # node, gpu, sensor
_SMALL: Final = 32  # calls with at most this many samples take the plain-loop path


def spike_flags(peak: float | None, threshold: float) -> bool:
    """A tick is a spike when its peak is above the threshold (no samples: no spike).

    >>> spike_flags(None, 95.0), spike_flags(95.0, 95.0), spike_flags(95.5, 95.0)
    (False, False, True)
    """
    return peak is not None and peak > threshold


@dataclass(frozen=True, slots=True)
class SpikeParams:
    bucket_ns: int = 100_000_000
    window_ns: int = 1_000_000_000
    quantile: float = 0.99
    max_per_bucket: int = 64  # the largest values kept per bucket (see the module docstring)
    # How far behind its newest sample a series keeps buckets. Live, a tick stays open about
    # idle 15 s + lateness 2 s; replaying a backlog, the samples of minutes ahead arrive
    # before a tick closes. The pipeline releases each series as its ticks close
    # (``release``), so this is only the backstop for a series whose ticks never do.
    horizon_ns: int = 600_000_000_000
    max_series: int = 200_000

    def __post_init__(self) -> None:
        if self.bucket_ns <= 0 or self.window_ns <= 0 or self.window_ns % self.bucket_ns:
            raise ValueError("bucket_ns and window_ns must be > 0, window_ns a multiple of bucket_ns")
        if not 0.5 <= self.quantile <= 1.0:
            raise ValueError(f"quantile must be in [0.5, 1] (top values are kept), got {self.quantile}")
        if self.max_per_bucket < 1 or self.max_series < 1:
            raise ValueError("max_per_bucket and max_series must be >= 1")
        if self.horizon_ns < self.window_ns:
            raise ValueError("horizon_ns must cover at least one window")


class _Series:
    __slots__ = ("dropped", "lowest", "newest", "vals")

    def __init__(self) -> None:
        self.vals: dict[int, list[float]] = {}  # bucket -> kept values (the largest when truncated)
        self.dropped: dict[int, int] = {}  # bucket -> values not kept
        self.newest = -(2**62)  # newest bucket seen
        self.lowest = 2**62  # a lower bound of the oldest bucket held

    def purge(self, keep_from: int) -> None:
        if self.lowest >= keep_from:
            return
        if keep_from - self.lowest <= 64:
            # The usual case (a tick closing releases ~10 buckets): pop the few, don't rebuild.
            for b in range(self.lowest, keep_from):
                self.vals.pop(b, None)
                self.dropped.pop(b, None)
            self.lowest = keep_from if self.vals else 2**62
            return
        self.vals = {b: v for b, v in self.vals.items() if b >= keep_from}
        self.dropped = {b: n for b, n in self.dropped.items() if b >= keep_from}
        self.lowest = min(self.vals, default=2**62)


class SpikeEngine:
    """Sliding-window high quantile per (node, gpu, sensor) series over raw samples."""

    def __init__(self, params: SpikeParams, grid_ns: int) -> None:
        if grid_ns < params.bucket_ns:
            raise ValueError("grid_ns must be at least one bucket")
        self.params, self.grid_ns = params, grid_ns
        self._nb = params.window_ns // params.bucket_ns
        self._keep = params.horizon_ns // params.bucket_ns
        self._positions: dict[int, tuple[int, int, float]] = {}  # window size -> _positions(n, q)
        self._series: OrderedDict[Key, _Series] = OrderedDict()
        self._floor = -(2**62)  # buckets below this are closed (evict_before)
        self.late_samples = 0  # samples for buckets already dropped
        self.evicted_series = 0

    def add(self, node: str, gpu: str, sensor: str, ts_ns: npt.NDArray[np.int64],
            values: npt.NDArray[np.float64]) -> None:
        """Add one series' samples (any order; NaN values are skipped)."""
        ts, vs = np.asarray(ts_ns, dtype=np.int64), np.asarray(values, dtype=np.float64)
        if ts.shape != vs.shape or ts.ndim != 1:
            raise ValueError("ts_ns and values must be 1-d arrays of the same length")
        if ts.size == 0:
            return
        key = (node, gpu, sensor)
        s = self._series.get(key)
        if s is None:
            s = self._series[key] = _Series()
            if len(self._series) > self.params.max_series:
                self._series.popitem(last=False)
                self.evicted_series += 1
        else:
            self._series.move_to_end(key)
        if ts.size <= _SMALL:
            self._add_few(s, ts.tolist(), vs.tolist())
        else:
            self._add_many(s, ts, vs)
        if len(s.vals) > self._keep + self._keep // 4 + 1:  # amortised: purge once a quarter past the bound
            s.purge(s.newest - self._keep)

    def _add_many(self, s: _Series, ts: npt.NDArray[np.int64], vs: npt.NDArray[np.float64]) -> None:
        ok = ~np.isnan(vs)
        if not ok.all():
            ts, vs = ts[ok], vs[ok]
            if ts.size == 0:
                return
        b = ts // self.params.bucket_ns
        s.newest = max(s.newest, int(b.max()))
        low = max(self._floor, s.newest - self._keep)
        if int(b.min()) < low:
            fresh = b >= low
            self.late_samples += int(b.size - np.count_nonzero(fresh))
            b, vs = b[fresh], vs[fresh]
            if b.size == 0:
                return
        if bool((b[1:] < b[:-1]).any()):  # group by bucket: a stable sort only when out of order
            order = np.argsort(b, kind="stable")
            b, vs = b[order], vs[order]
        starts = [0, *(np.flatnonzero(b[1:] != b[:-1]) + 1).tolist()]
        bl, vl = b[starts].tolist(), vs.tolist()
        for bucket, i, j in zip(bl, starts, [*starts[1:], len(vl)], strict=True):
            self._put(s, bucket, vl[i:j])
        s.lowest = min(s.lowest, bl[0])

    def _add_few(self, s: _Series, tl: list[int], vl: list[float]) -> None:
        # Per-message calls carry ~10 samples (10 Hz, 1 s): numpy's per-call overhead
        # would cost more than a plain loop, so small calls take this path.
        bns = self.params.bucket_ns
        s.newest = max(s.newest, max(tl) // bns)
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

    def _put(self, s: _Series, bucket: int, new: list[float]) -> None:
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
        """The highest sliding-window P99 among the windows that END inside [tick_ns, tick_ns + grid_ns)
        (a window ends at each bucket boundary); None without samples."""
        s = self._series.get((node, gpu, sensor))
        if s is None:
            return None
        bns, nb, q, pos = self.params.bucket_ns, self._nb, self.params.quantile, self._positions
        first = -(-tick_ns // bns)  # boundaries j * bucket_ns inside the tick
        last = -(-(tick_ns + self.grid_ns) // bns) - 1
        vals, dropped = s.vals, s.dropped
        span = range(first - nb, last)
        got = [vals.get(k) for k in span]
        lost = [dropped.get(k, 0) for k in span] if dropped else [0] * len(span)
        # The window ending at bucket j covers buckets j - nb .. j - 1: slide one sorted
        # list along, taking the leaving bucket out and the entering one in.
        win = sorted(v for kept in got[:nb] if kept for v in kept)
        missing = sum(lost[:nb])
        best: float | None = None
        for i in range(last - first + 1):
            if i:
                out, into = got[i - 1], got[i - 1 + nb]
                if out:
                    for v in out:
                        del win[bisect.bisect_left(win, v)]
                if into:
                    for v in into:
                        bisect.insort(win, v)
                missing += lost[i - 1 + nb] - lost[i - 1]
            if win:
                n = len(win) + missing
                at = pos.get(n)
                if at is None:
                    at = _positions(n, q)
                    if len(pos) < 4_096:
                        pos[n] = at
                lo, hi, g = at
                a, b = win[max(lo - missing, 0)], win[max(hi - missing, 0)]
                # quantile_of_top, inlined (this loop is the hot path): numpy's _lerp to the bit
                x = b - (b - a) * (1 - g) if g >= 0.5 else a + (b - a) * g
                best = x if best is None or x > best else best
        return best

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
        return sum(len(s.vals) for s in self._series.values())

    def values_held(self) -> int:
        return sum(len(v) for s in self._series.values() for v in s.vals.values())

    def __len__(self) -> int:
        return len(self._series)

    def snapshot(self) -> dict[str, Any]:
        """JSON-able state, series in least-recently-fed order."""
        return {"floor": self._floor, "late_samples": self.late_samples, "evicted_series": self.evicted_series,
                "series": [[*k, s.newest, [[b, v, s.dropped.get(b, 0)] for b, v in s.vals.items()]]
                           for k, s in self._series.items()]}

    @classmethod
    def restore(cls, params: SpikeParams, grid_ns: int, snap: Mapping[str, Any]) -> SpikeEngine:
        eng = cls(params, grid_ns)
        eng._floor, eng.late_samples = int(snap["floor"]), int(snap["late_samples"])
        eng.evicted_series = int(snap["evicted_series"])
        for node, gpu, sensor, newest, buckets in snap["series"]:
            s = eng._series[(node, gpu, sensor)] = _Series()
            s.newest = int(newest)
            for b, v, n in buckets:
                s.vals[int(b)] = [float(x) for x in v]
                if n:
                    s.dropped[int(b)] = int(n)
            s.lowest = min(s.vals, default=2**62)
        return eng


def _positions(n: int, q: float) -> tuple[int, int, float]:
    """numpy's linear method: the two order statistics (ascending, 0-based) and the weight."""
    v = (n - 1) * q
    lo = math.floor(v)
    if v >= n - 1:
        return n - 1, n - 1, v - lo
    return lo, lo + 1, v - lo


def quantile_of_top(kept: list[float], n: int, q: float) -> float:
    """numpy's linear quantile of ``n`` values whose largest ``len(kept)`` are ``kept`` (ascending).

    >>> xs = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    >>> quantile_of_top(sorted(xs), len(xs), 0.99) == float(np.quantile(xs, 0.99))
    True
    """
    lo, hi, g = _positions(n, q)
    missing = n - len(kept)
    a, b = kept[max(lo - missing, 0)], kept[max(hi - missing, 0)]
    return b - (b - a) * (1 - g) if g >= 0.5 else a + (b - a) * g
