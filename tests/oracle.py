"""Reference frames by plain batch grouping: what every streaming order must reproduce."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from schemas.catalog import BY_NAME, CATALOG
from schemas.records import SampleBatch

GRID = 1_000_000_000
Series = tuple[str, str, int]  # node, gpu, sensor index
Rows = dict[tuple[str, str, int], dict[str, object]]


def series_of(batches: Iterable[SampleBatch]) -> dict[Series, list[tuple[int, float]]]:
    out: dict[Series, list[tuple[int, float]]] = defaultdict(list)
    for b in batches:
        out[(b.node, b.gpu, BY_NAME[b.sensor].index)].extend(zip(b.ts_ns, b.value, strict=True))
    return dict(out)


def oracle(samples: dict[Series, list[tuple[int, float]]], grid: int = GRID) -> Rows:
    cells: dict[tuple[str, str, int], dict[int, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for (node, gpu, si), pts in samples.items():
        for t, v in pts:
            cells[(node, gpu, t // grid * grid)][si].append((t, v))
    prev: dict[tuple[str, str, int], float] = {}
    out: dict[tuple[str, str, int], dict[str, object]] = {}
    for key in sorted(cells):
        node, gpu, _ = key
        row: dict[str, object] = {}
        for s in CATALOG:
            pts = sorted(cells[key].get(s.index, []))
            row[s.count_column] = len(pts)
            vals = [v for _, v in pts]
            for agg in s.aggs:
                col = s.column(agg)
                if not pts:
                    row[col] = None
                elif agg == "mean":
                    row[col] = sum(vals) / len(vals)
                elif agg == "max":
                    row[col] = max(vals)
                elif agg == "last":
                    row[col] = vals[-1]
                elif agg == "increase":
                    inc, p = 0.0, prev.get((node, gpu, s.index))
                    for v in vals:
                        if p is not None:
                            inc += v - p if v >= p else v
                        p = v
                    row[col] = inc
                elif agg == "last_nonzero":
                    nz = [v for v in vals if v]
                    row[col] = nz[-1] if nz else 0.0
                elif agg == "count":
                    row[col] = float(len([v for v in vals if v]))
            if pts and s.kind == "counter":
                prev[(node, gpu, s.index)] = vals[-1]
        out[key] = row
    return out
