"""Simulator samples to frames messages, for detector tests and benchmarks: a numpy stand-in for the ingest's aligner.

Each (node, gpu, sensor) series is cut at the grid and summarised by the catalog's
aggregations (mean, max, last, increase with counter resets, last_nonzero, count), the derived
``cost_usd`` and ``idle`` are computed as ``streams.efficiency.derive`` does (a fixed hourly
price), and one ``FrameMessage`` per node and tick comes out, in tick order. No lateness, no
clock correction: the benchmarks judge the detectors, the alignment has its own oracle tests.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Iterator

import numpy as np

from schemas.catalog import BY_NAME, HOST_GPU
from schemas.frame_messages import FrameMessage, GpuFrame
from schemas.records import SampleBatch

PRICE_H = 3.0  # USD per GPU-hour, the figure the costs in the benchmarks' reports are at


def _agg(kind: str, k: np.ndarray, v: np.ndarray, n: int, prev_last: float | None) -> np.ndarray:
    out = np.full(n, np.nan)
    if kind == "mean":
        cnt = np.bincount(k, minlength=n)
        s = np.bincount(k, weights=v, minlength=n)
        np.divide(s, cnt, out=out, where=cnt > 0)
    elif kind == "max":
        np.fmax.at(out, k, v)
    elif kind in ("last", "last_nonzero"):
        vv = v if kind == "last" else np.where(v != 0, v, np.nan)
        ok = ~np.isnan(vv)
        out[k[ok]] = vv[ok]  # later samples overwrite earlier ones
    elif kind == "count":
        cnt = np.bincount(k, weights=(v != 0).astype(float), minlength=n)
        out = np.where(np.bincount(k, minlength=n) > 0, cnt, np.nan)
    elif kind == "increase":
        steps = np.diff(v, prepend=v[0] if prev_last is None else prev_last)
        steps = np.where(steps < 0, v, steps)  # a reset: the counter started again from zero
        out = np.where(np.bincount(k, minlength=n) > 0, np.bincount(k, weights=steps, minlength=n), np.nan)
    return out


def frames(batches: Iterable[SampleBatch], start_ns: int, seconds: float, grid_ns: int) -> Iterator[FrameMessage]:
    """The frames of ``seconds`` of simulator output starting at ``start_ns``."""
    series: dict[tuple[str, str, str], tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    # Labels as the aligner keeps them: the latest a GPU's samples carried, from their time on.
    changes: dict[tuple[str, str], list[tuple[int, dict[str, str | int]]]] = defaultdict(list)
    for b in batches:
        ts, vs = series[(b.node, b.gpu, b.sensor)]
        ts.extend(b.ts_ns)
        vs.extend(b.value)
        if b.labels and b.ts_ns:
            changes[(b.node, b.gpu)].append((b.ts_ns[0], {k: v for k, v in b.labels.items() if v is not None}))
    label_times: dict[tuple[str, str], tuple[list[int], list[dict[str, str | int]]]] = {}
    for key, ch in changes.items():
        ch.sort(key=lambda x: x[0])
        merged: list[dict[str, str | int]] = []
        for _, lab in ch:
            merged.append({**(merged[-1] if merged else {}), **lab})
        label_times[key] = ([t for t, _ in ch], merged)
    n = int(seconds * 1e9) // grid_ns
    cols: dict[tuple[str, str], dict[str, np.ndarray]] = defaultdict(dict)
    for (node, gpu, sensor), (ts, vs) in series.items():
        k = (np.asarray(ts, dtype=np.int64) - start_ns) // grid_ns
        v = np.asarray(vs, dtype=np.float64)
        keep = (k >= 0) & (k < n)
        order = np.argsort(k[keep], kind="stable")
        kk, vv = k[keep][order], v[keep][order]
        s = BY_NAME[sensor]
        for agg in s.aggs:
            cols[(node, gpu)][s.column(agg)] = _agg(agg, kk, vv, n, None)
    price_tick = PRICE_H * grid_ns / 1e9 / 3600.0
    nodes = sorted({node for node, _ in cols})
    for i in range(n):
        tick = start_ns + i * grid_ns
        for node in nodes:
            gpus = []
            for (nd, gpu), c in sorted(cols.items()):
                if nd != node:
                    continue
                values = {name: float(col[i]) for name, col in c.items() if not np.isnan(col[i])}
                times, labs = label_times.get((nd, gpu), ([], []))
                at = bisect.bisect_right(times, tick + grid_ns - 1) - 1
                lab = labs[at] if at >= 0 else {}
                derived: dict[str, float | None] = {}
                if gpu != HOST_GPU:
                    util, sm = values.get("gpu_util"), values.get("tensor_active", values.get("sm_active"))
                    quiet = (util is None or util <= 5.0) and (sm is None or sm <= 0.05)
                    derived = {"cost_usd": price_tick,
                               "idle": None if util is None and sm is None else float(bool(lab.get("pod")) and quiet),
                               # The spike engine's peaks, roughly: the tick's highest sample.
                               "gpu_util_p99": values.get("gpu_util_max"), "sm_active_p99": sm}
                gpus.append(GpuFrame(gpu, lab, values, derived, ""))
            yield FrameMessage(node, tick, grid_ns, tuple(gpus))
