"""The live page's heatmap: cost per TFLOP/s-hour by GPU model and region over a closed window of frames,
read from ``gpu_frames`` by the process that writes it (so it works with the embedded chDB).

The window is given in epoch milliseconds and shown on the page, so the same query with the same bounds
gives the same cells later (a closed tick's frames do not change).

>>> print(heatmap_sql("fw", "current", 1000, 0, 600_000))  # doctest: +NORMALIZE_WHITESPACE
SELECT gpu_model, region, count() AS frames, sum(cost_usd) AS usd, sum(tflops) * 1000 / 3600000 AS tflops_hours,
  if(tflops_hours > 0, usd / tflops_hours, NULL) AS usd_per_tflops_h, avg(flops_per_watt) AS flops_per_watt
FROM fw.gpu_frames WHERE gpu != 'host' AND toUnixTimestamp64Milli(ts) BETWEEN 0 AND 600000
GROUP BY gpu_model, region ORDER BY gpu_model, region
"""

from __future__ import annotations

from typing import Final

from schemas.ddl import Layout, check_identifier

__all__ = ["HEATMAP_COLUMNS", "heatmap_sql"]

HEATMAP_COLUMNS: Final = ("gpu_model", "region", "frames", "usd", "tflops_hours", "usd_per_tflops_h",
                          "flops_per_watt")


def heatmap_sql(db: str, layout: Layout, grid_ms: int, from_ms: int, to_ms: int) -> str:
    """The heatmap over frames with ``from_ms <= ts <= to_ms``; integers only are spliced in."""
    ts = "toUnixTimestamp64Milli(ts)" if layout == "current" else "ts"
    window = f"{ts} BETWEEN {int(from_ms)} AND {int(to_ms)}"
    return (f"SELECT gpu_model, region, count() AS frames, sum(cost_usd) AS usd,"
            f" sum(tflops) * {int(grid_ms)} / 3600000 AS tflops_hours,\n"
            "  if(tflops_hours > 0, usd / tflops_hours, NULL) AS usd_per_tflops_h,"
            " avg(flops_per_watt) AS flops_per_watt\n"
            f"FROM {check_identifier(db)}.gpu_frames WHERE gpu != 'host' AND {window}\n"
            "GROUP BY gpu_model, region ORDER BY gpu_model, region")
