"""SQL views for the questions people ask of flopwatch's tables (the current layout; ``docs/sql.md`` has examples).

Most read the hourly rollup (``schemas.rollups``), so they answer over months in milliseconds;
the utilisation histogram needs each frame's value and reads ``gpu_frames``; the alerts and
decisions views read ``detections`` and ``scale_decisions``. Ratios are ratios of sums: cost per
TFLOP/s-hour is the USD spent over the TFLOP/s-hours delivered, not an average of per-frame
ratios. GPU-time is frames times the grid, which each view states as its ``grid_s`` column (the
grid of the worker that made it).

>>> sorted(VIEWS)[:3]
['alerts_by_workload', 'cost_by_workload', 'cost_heatmap']
>>> "gpu_rollup_1h" in view_sql("fw", "cost_heatmap", 1000)
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from schemas.ddl import check_identifier


@dataclass(frozen=True, slots=True)
class Frontier:
    """The Pareto view's target corner (seed 000 §3.3): at most this cost, at least this speed."""

    max_usd_per_tflops_h: float = 0.05
    min_tflops: float = 80.0


def _grid(grid_ms: int) -> str:
    return f"{int(grid_ms)} / 1000 AS grid_s"


def _cost_heatmap(db: str, grid_ms: int) -> str:
    return (f"SELECT gpu_model, region, {_grid(grid_ms)}, sum(frames) * grid_s / 3600 AS gpu_hours,\n"
            "  sum(cost_usd_sum) AS usd, sum(tflops_sum) * grid_s / 3600 AS tflops_hours,\n"
            "  if(tflops_hours > 0, usd / tflops_hours, NULL) AS usd_per_tflops_h,\n"
            "  avgMerge(tflops_avg) AS tflops, avgMerge(flops_per_watt_avg) AS flops_per_watt\n"
            f"FROM {db}.gpu_rollup_1h WHERE gpu != 'host'\nGROUP BY gpu_model, region")


def _pareto(db: str, grid_ms: int, f: Frontier = Frontier()) -> str:
    # Each configuration against every other: few rows (models x regions x precisions), so a cross join is cheap.
    base = (f"SELECT gpu_model, region, precision, sum(cost_usd_sum) / nullIf(sum(tflops_sum) * grid_s / 3600, 0)"
            f" AS usd_per_tflops_h, avgMerge(tflops_avg) AS tflops, {_grid(grid_ms)}\n"
            f"  FROM {db}.gpu_rollup_1h WHERE gpu != 'host' AND tflops_sum > 0 GROUP BY gpu_model, region, precision")
    return (f"SELECT a.gpu_model AS gpu_model, a.region AS region, a.precision AS precision,\n"
            "  a.usd_per_tflops_h AS usd_per_tflops_h, a.tflops AS tflops,\n"
            f"  a.usd_per_tflops_h <= {f.max_usd_per_tflops_h} AND a.tflops >= {f.min_tflops} AS in_target,\n"
            "  countIf(b.usd_per_tflops_h <= a.usd_per_tflops_h AND b.tflops >= a.tflops\n"
            "          AND (b.usd_per_tflops_h < a.usd_per_tflops_h OR b.tflops > a.tflops)) = 0 AS on_frontier\n"
            f"FROM ({base}) AS a CROSS JOIN ({base}) AS b\n"
            "GROUP BY gpu_model, region, precision, usd_per_tflops_h, tflops")


def _daily(db: str, grid_ms: int, columns: str, keys: str = "namespace, workload", having: str = "") -> str:
    """Per day and workload from the hourly rollup, GPUs only."""
    tail = f" HAVING {having}" if having else ""
    return (f"SELECT toDate(ts) AS day, {keys}, {_grid(grid_ms)},\n  {columns}\n"
            f"FROM {db}.gpu_rollup_1h WHERE gpu != 'host'\nGROUP BY day, {keys}{tail}")


def _cost_by_workload(db: str, grid_ms: int) -> str:
    return _daily(db, grid_ms, "sum(frames) * grid_s / 3600 AS gpu_hours, sum(cost_usd_sum) AS usd,\n"
                  "  sum(energy_j_sum) / 3.6e6 AS kwh, sum(tflops_sum) * grid_s / 3600 AS tflops_hours,\n"
                  "  if(tflops_hours > 0, usd / tflops_hours, NULL) AS usd_per_tflops_h,\n"
                  "  avgMerge(flops_per_watt_avg) AS flops_per_watt, sum(idle_cost_usd) AS idle_usd",
                  keys="namespace, workload, workload_class")


def _cost_per_request(db: str, grid_ms: int) -> str:
    return _daily(db, grid_ms, "sum(requests_sum) * grid_s AS requests, sum(cost_usd_sum) AS usd,\n"
                  "  if(requests > 0, usd / requests * 1000, NULL) AS usd_per_1k_requests", having="requests > 0")


def _util_distribution(db: str, grid_ms: int) -> str:
    # 10-point bins of the frames' utilisation, as GPU-hours and a share: a bimodal cluster shows two humps.
    return (f"SELECT least(intDiv(toUInt32(gpu_util), 10) * 10, 90) AS util_from, {_grid(grid_ms)},\n"
            "  count() * grid_s / 3600 AS gpu_hours, count() / sum(count()) OVER () AS share\n"
            f"FROM {db}.gpu_frames WHERE gpu != 'host' AND gpu_util IS NOT NULL\nGROUP BY util_from")


def _idle_cost(db: str, grid_ms: int) -> str:
    return _daily(db, grid_ms, "sum(idle_frames) * grid_s / 3600 AS idle_gpu_hours, sum(idle_cost_usd) AS idle_usd",
                  having="idle_gpu_hours > 0")


def _energy_by_workload(db: str, grid_ms: int) -> str:
    return _daily(db, grid_ms, "sum(energy_j_sum) / 3.6e6 AS kwh, avgMerge(power_avg) AS watts, "
                  "max(power_max) AS watts_max,\n"
                  "  if(kwh > 0, sum(tflops_sum) * grid_s / 3600 / kwh, NULL) AS tflops_h_per_kwh")


def _alerts_by_workload(db: str, grid_ms: int) -> str:
    return ("SELECT toStartOfHour(toDateTime(onset_ts)) AS hour, namespace, workload, rule, severity,\n"
            "  uniqExactIf(id, state = 'firing') AS alerts, uniqExactIf(id, state = 'resolved') AS resolved\n"
            f"FROM {db}.detections\nGROUP BY hour, namespace, workload, rule, severity")


def _decisions_by_workload(db: str, grid_ms: int) -> str:
    return ("SELECT toStartOfHour(toDateTime(ts)) AS hour, namespace, workload, outcome, action,\n"
            "  uniqExact(id) AS decisions, argMax(desired, ts) AS last_desired\n"
            f"FROM {db}.scale_decisions\nGROUP BY hour, namespace, workload, outcome, action")


ON_ROLLUPS: Final = frozenset({"cost_heatmap", "pareto", "cost_by_workload", "cost_per_request", "idle_cost",
                               "energy_by_workload"})
VIEWS: Final[dict[str, Callable[[str, int], str]]] = {
    "cost_heatmap": _cost_heatmap, "pareto": _pareto, "cost_by_workload": _cost_by_workload,
    "cost_per_request": _cost_per_request, "util_distribution": _util_distribution, "idle_cost": _idle_cost,
    "energy_by_workload": _energy_by_workload, "alerts_by_workload": _alerts_by_workload,
    "decisions_by_workload": _decisions_by_workload,
}


def view_sql(db: str, name: str, grid_ms: int) -> str:
    return VIEWS[name](check_identifier(db), grid_ms)


def create_view(db: str, name: str, grid_ms: int) -> str:
    return f"CREATE OR REPLACE VIEW {check_identifier(db)}.{name} AS\n{view_sql(db, name, grid_ms)}"


def view_is_current(create_table_query: str, grid_ms: int) -> bool:
    """Whether a stored view was made for this grid (the views state it as ``<grid_ms> / 1000 AS grid_s``)."""
    return "grid_s" not in create_table_query or _grid(grid_ms) in create_table_query
