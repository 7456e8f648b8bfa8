"""Frames and the aggregation of closed grid cells into them, by the catalog's rules.

One frame is one GPU (or a node's ``host`` pseudo-GPU) x one grid tick, holding every
sensor's aggregate plus the per-sensor sample count. Pure: arrays in, columns out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from schemas.catalog import CATALOG
from schemas.frames import COUNT_COLUMNS, VALUE_COLUMNS, count_index, value_index
from schemas.records import Labels

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
_COUNTER: Final = np.array([s.kind == "counter" for s in CATALOG])


@dataclass(slots=True)
class Frame:
    """One aligned row of ``gpu_frames``; ``values`` follows ``VALUE_COLUMNS``, ``counts`` the catalog."""

    node: str
    gpu: str
    tick_ns: int
    values: list[float | None]
    counts: list[int]
    labels: Labels

    def value(self, column: str) -> float | None:
        """A value column by name (``"power"``, ``"gpu_util_max"``); None where the cell was empty."""
        return self.values[value_index(column)]

    def count(self, column: str) -> int:
        """A count column by name (``"n_power"``)."""
        return self.counts[count_index(column)]


@dataclass(slots=True)
class FrameBatch:
    """Frames as columns (NaN where a cell had no sample), sorted by node, gpu, tick."""

    tick_ns: I64
    node: list[str]
    gpu: list[str]
    labels: list[Labels]
    values: dict[str, F64]
    counts: dict[str, I64]
    clock_uncertainty_ns: I64  # per frame, the largest uncertainty of a clock correction it used
    # Filled after aggregation (streams.efficiency.derive): efficiency, cost and spike columns, and per
    # frame why any of them is NULL ("" when none is).
    derived: dict[str, F64] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Per frame, its FLOPS/W in sub-tick buckets (streams.efficiency.subticks); empty when not made.
    sub_fpw: list[tuple[float | None, ...]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.node)

    def column(self, name: str) -> F64 | I64:
        """A value or count column by name, one entry per frame (NaN where a cell was empty)."""
        if name in self.values:
            return self.values[name]
        if name in self.counts:
            return self.counts[name]
        if name in self.derived:
            return self.derived[name]
        raise KeyError(f"{name!r} is not a value, count or derived column of this batch")

    def frames(self) -> list[Frame]:
        vals = [self.values[c].tolist() for c in VALUE_COLUMNS]
        cnts = [self.counts[c].tolist() for c in COUNT_COLUMNS]
        out = []
        for i, tick in enumerate(self.tick_ns.tolist()):
            row: list[float | None] = [None if v[i] != v[i] else v[i] for v in vals]
            out.append(Frame(self.node[i], self.gpu[i], tick, row, [c[i] for c in cnts], self.labels[i]))
        return out


def aggregate(sid: I64, tick: I64, ts: I64, v: F64, unc: I64, *, s_sensor: I64, s_pair: I64,
              pair_names: Sequence[tuple[str, str]], labels: Mapping[int, Labels], counter_prev: dict[int, float],
              grid: int) -> FrameBatch:
    """Aggregate the samples of closed cells into frames.

    ``sid``/``tick``/``ts``/``v``/``unc`` are per sample (series id, tick, time, value, clock
    uncertainty); ``s_sensor`` and ``s_pair`` map a series id to its catalog index and its
    (node, gpu) pair id. ``counter_prev`` holds each counter series' last raw value and is
    updated, so increases continue across calls.
    """
    # Sort by series, then time, then value (ties on an instant: the largest value is last).
    # Each series usually arrives in time order, so a stable sort on the series id alone
    # (a radix sort for small ids) is enough; check, and sort fully only if not.
    key = sid.astype(np.uint16) if len(s_sensor) < 2**16 else sid
    corrected = bool(unc.any())  # else (every sample in UTC, the usual) no column of uncertainties to carry
    order = np.argsort(key, kind="stable")
    sid, tick, ts, v = sid[order], tick[order], ts[order], v[order]
    if corrected:
        unc = unc[order]
    same = sid[1:] == sid[:-1]
    if (same & (ts[1:] <= ts[:-1])).any():
        order = np.lexsort((v, ts, sid))
        sid, tick, ts, v = sid[order], tick[order], ts[order], v[order]
        if corrected:
            unc = unc[order]
        # An exact duplicate (same series, instant and value: a redelivery, a
        # collector retry) counts once.
        dup = np.zeros(len(sid), bool)
        dup[1:] = (sid[1:] == sid[:-1]) & (ts[1:] == ts[:-1]) & (v[1:] == v[:-1])
        if dup.any():
            keep = ~dup
            sid, tick, ts, v = sid[keep], tick[keep], ts[keep], v[keep]
            if corrected:
                unc = unc[keep]
    n = len(sid)
    new_series = np.empty(n, bool)
    new_series[0] = True
    new_series[1:] = sid[1:] != sid[:-1]
    new_cell = new_series.copy()
    new_cell[1:] |= tick[1:] != tick[:-1]
    starts = np.flatnonzero(new_cell)
    ends = np.append(starts[1:], n) - 1
    g_sid = sid[starts]
    g_sensor = s_sensor[g_sid]
    count = np.diff(np.append(starts, n))
    total = np.add.reduceat(v, starts)
    top = np.maximum.reduceat(v, starts)
    last = v[ends]
    # Counters: increase over consecutive samples; a drop means the counter restarted.
    prev = np.empty(n)
    prev[1:] = v[:-1]
    prev[0] = np.nan
    first_rows = np.flatnonzero(new_series)
    counter_row = _COUNTER[s_sensor[sid]]
    for r in first_rows[counter_row[first_rows]].tolist():
        prev[r] = counter_prev.get(int(sid[r]), np.nan)
    step = np.where(v >= prev, v - prev, v)
    step[np.isnan(prev)] = 0.0
    increase = np.add.reduceat(step, starts)
    series_ends = np.append(first_rows[1:], n) - 1
    for r in series_ends[counter_row[series_ends]].tolist():
        counter_prev[int(sid[r])] = float(v[r])
    # Events: the last non-zero code and how many fired.
    fired = v != 0
    fired_count = np.add.reduceat(fired.astype(np.int64), starts)
    last_fired_row = np.maximum.reduceat(np.where(fired, np.arange(n), -1), starts)
    last_code = np.where(last_fired_row >= 0, v[np.maximum(last_fired_row, 0)], 0.0)

    # Pivot cells into frames: one row per (node, gpu, tick).
    g_pair = s_pair[g_sid]
    g_tick = tick[starts]
    base = int(g_tick.min())
    span = int(g_tick.max()) - base + 1
    uniq, inverse = _cells(g_pair * span + (g_tick - base), (int(g_pair.max()) + 1) * span)
    f_pair, f_tick = uniq // span, uniq % span + base
    nf = len(f_pair)
    values: dict[str, F64] = {c: np.full(nf, np.nan) for c in VALUE_COLUMNS}
    counts: dict[str, I64] = {c: np.zeros(nf, np.int64) for c in COUNT_COLUMNS}
    by_agg = {"mean": total / count, "max": top, "last": last, "increase": increase,
              "last_nonzero": last_code, "count": fired_count.astype(np.float64)}
    for s in CATALOG:
        mask = g_sensor == s.index
        if not mask.any():
            continue
        rows = inverse[mask]
        counts[s.count_column][rows] = count[mask]
        for agg in s.aggs:
            src = last if (agg == "last" and s.kind == "counter") else by_agg[agg]
            values[s.column(agg)][rows] = src[mask]
    frame_unc = np.zeros(nf, np.int64)
    if corrected:
        np.maximum.at(frame_unc, inverse, np.maximum.reduceat(unc, starts))
    names = pair_names
    pairs = f_pair.tolist()
    return FrameBatch(
        tick_ns=f_tick * grid,
        node=[names[p][0] for p in pairs],
        gpu=[names[p][1] for p in pairs],
        labels=[labels.get(p, {}) for p in pairs],
        values=values,
        counts=counts,
        clock_uncertainty_ns=frame_unc,
    )


def _cells(keys: I64, size: int) -> tuple[I64, I64]:
    """``np.unique(keys, return_inverse=True)`` for keys in ``[0, size)``: by a table where that is not much larger
    than the keys (a close spans a few ticks of a few hundred GPUs), else by sorting.

    >>> u, inv = _cells(np.array([7, 2, 7, 4], np.int64), 8)
    >>> u.tolist(), inv.tolist()
    ([2, 4, 7], [2, 0, 2, 1])
    """
    if size > 4 * len(keys) + 4096:
        uniq, inverse = np.unique(keys, return_inverse=True)
        return uniq, inverse.reshape(-1)
    seen = np.zeros(size, np.bool_)
    seen[keys] = True
    uniq = np.flatnonzero(seen)
    slot = np.empty(size, np.int64)
    slot[uniq] = np.arange(len(uniq), dtype=np.int64)
    return uniq, slot[keys]
