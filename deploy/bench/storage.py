"""Storage: bytes per sensor value on disk by codec, insert rate with the rollups on and off, and the latency of
every view and cookbook query over 24 h of a 64-GPU cluster at a 1 s grid, on the raw table and on the rollups.

    python deploy/bench/storage.py [--nodes 8] [--gpus 8] [--seconds 600] [--hours 24] [--rounds 3]

The frames are real pipeline output: ``--seconds`` of the simulated cluster through the ingest's
core (decode, align, derive) into chDB. Bytes per value are measured on that block after merges
(``OPTIMIZE ... FINAL``), each codec choice in its own copy of ``gpu_frames``: the table's whole
compressed size over the sensor values it holds (labels, counts and derived columns included), each
value at its column's resolution (schemas.resolution) as the worker writes it.
For the latency part the block is repeated, shifted in time, up to ``--hours``; the rollups fill
through their materialized views as the worker's inserts fill them. No Kafka needed.
Prints one JSON object per part; docs/performance.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agents.ingest.simulated import ingest_simulation
from agents.sinks.clickhouse import ChdbBackend
from agents.sinks.schema import ensure_schema
from schemas import ddl, rollups, views
from streams.sim.simulate import SimParams

DB = "fwbench"
S = 1_000_000_000
COOKBOOK = Path(__file__).resolve().parents[2] / "docs" / "sql.md"
# Codec choices for the float columns (every value and derived column; values at their resolution).
CODECS = {
    "current: Gorilla+ZSTD(1)": None,
    "ZSTD(1)": "CODEC(ZSTD(1))",
    "Gorilla+ZSTD(3)": "CODEC(Gorilla, ZSTD(3))",
    "FPC+ZSTD(1)": "CODEC(FPC, ZSTD(1))",
    "ZSTD(3)": "CODEC(ZSTD(3))",
}
# Raw-table forms of what views answer from the rollup: what the rollups save.
RAW = {
    "cost_by_workload (raw)": "SELECT toDate(ts) AS day, namespace, workload, count() / 3600 AS gpu_hours, "
                              "sum(cost_usd) AS usd, sum(energy_j) / 3.6e6 AS kwh, avg(flops_per_watt) AS fpw "
                              f"FROM {DB}.gpu_frames WHERE gpu != 'host' GROUP BY day, namespace, workload",
    "cost_heatmap (raw)": "SELECT gpu_model, region, count() / 3600 AS gpu_hours, sum(cost_usd) AS usd, "
                          "sum(cost_usd) / (sum(tflops) / 3600) AS usd_per_tflops_h "
                          f"FROM {DB}.gpu_frames WHERE gpu != 'host' GROUP BY gpu_model, region",
    "energy_by_workload (raw)": "SELECT toDate(ts) AS day, namespace, workload, sum(energy_j) / 3.6e6 AS kwh, "
                                f"avg(power), max(power) FROM {DB}.gpu_frames WHERE gpu != 'host' "
                                "GROUP BY day, namespace, workload",
}


def one(b: ChdbBackend, sql: str) -> Any:
    return b.rows(sql)[1][0][0]


def bytes_per_value(b: ChdbBackend) -> dict[str, Any]:
    values = one(b, "SELECT " + " + ".join(f"countIf({c} IS NOT NULL)" for c in ddl.VALUE_COLS)
                 + f" FROM {DB}.gpu_frames")
    rows = one(b, f"SELECT count() FROM {DB}.gpu_frames")
    base = ddl.gpu_frames(DB)
    out: dict[str, Any] = {"part": "bytes per sensor value", "rows": rows, "sensor_values": values, "codecs": {}}
    for i, (name, codec) in enumerate(CODECS.items()):
        table = f"gpu_frames_c{i}"
        sql = base.replace(f"{DB}.gpu_frames (", f"{DB}.{table} (")
        if codec is not None:
            sql = sql.replace("CODEC(Gorilla, ZSTD(1))", codec)
            sql = re.sub(r"Nullable\(Float64\)(?=,|\n)", f"Nullable(Float64) {codec}", sql)
        b.execute(f"DROP TABLE IF EXISTS {DB}.{table}")
        b.execute(sql)
        b.execute(f"INSERT INTO {DB}.{table} SELECT * FROM {DB}.gpu_frames")
        b.execute(f"OPTIMIZE TABLE {DB}.{table} FINAL")
        size = one(b, f"SELECT sum(data_compressed_bytes) FROM system.parts WHERE database = '{DB}' "
                      f"AND table = '{table}' AND active")
        out["codecs"][name] = {"bytes": int(size), "bytes_per_value": round(size / values, 3),
                               "bytes_per_row": round(size / rows, 1)}
        if i == 0:
            _, cols = b.rows("SELECT column, sum(column_data_compressed_bytes) AS size FROM system.parts_columns "
                             f"WHERE database = '{DB}' AND table = '{table}' AND active GROUP BY column "
                             "ORDER BY size DESC LIMIT 8")
            out["current_largest_columns_bytes_per_row"] = {str(n): round(int(c) / rows, 2) for n, c in cols}
        b.execute(f"DROP TABLE {DB}.{table}")
    return out


def expand(b: ChdbBackend, block_s: int, copies: int) -> float:
    """Repeat the first ``block_s`` of frames ``copies`` times after it; seconds the inserts took."""
    cols = ", ".join(c for c in _columns(b) if c != "ts")
    t0 = time.perf_counter()
    for k in range(1, copies + 1):
        b.execute(f"INSERT INTO {DB}.gpu_frames (ts, {cols}) SELECT ts + toIntervalSecond({k * block_s}), {cols} "
                  f"FROM {DB}.gpu_frames WHERE ts < (SELECT min(ts) FROM {DB}.gpu_frames) + "
                  f"toIntervalSecond({block_s})")
    return time.perf_counter() - t0


def _columns(b: ChdbBackend) -> list[str]:
    _, rows = b.rows(f"SELECT name FROM system.columns WHERE database = '{DB}' AND table = 'gpu_frames' "
                     "ORDER BY position")
    return [str(r[0]) for r in rows]


def insert_rates(b: ChdbBackend, block_s: int, block_rows: int) -> dict[str, Any]:
    """Rows per second into gpu_frames with the rollups' views on, then off (the same amount each)."""
    on = expand(b, block_s, 6) / 6
    for r in rollups.ROLLUPS:
        b.execute(f"DROP VIEW {DB}.{r.table}_mv")
    b.execute(f"ALTER TABLE {DB}.gpu_frames DELETE WHERE ts >= (SELECT min(ts) FROM {DB}.gpu_frames) + "
              f"toIntervalSecond({block_s}) SETTINGS mutations_sync = 1")
    off = expand(b, block_s, 6) / 6
    b.execute(f"ALTER TABLE {DB}.gpu_frames DELETE WHERE ts >= (SELECT min(ts) FROM {DB}.gpu_frames) + "
              f"toIntervalSecond({block_s}) SETTINGS mutations_sync = 1")
    for r in rollups.ROLLUPS:
        b.execute(f"TRUNCATE TABLE {DB}.{r.table}")
        b.execute(rollups.rollup_backfill(DB, r))
        b.execute(rollups.rollup_view(DB, r))
    return {"part": "insert rate", "rows_per_insert": block_rows,
            "rows_per_s_rollups_on": round(block_rows / on), "rows_per_s_rollups_off": round(block_rows / off),
            "on_over_off": round(off / on, 3)}


def latencies(b: ChdbBackend, rounds: int) -> dict[str, Any]:
    queries = {f"view {v}": f"SELECT * FROM {DB}.{v}" for v in views.VIEWS}
    queries |= {f"cookbook {n}": sql for n, sql in
                re.findall(r"```sql\n-- name: (\w+)\n(.*?)```", COOKBOOK.read_text(), flags=re.S)}
    queries |= RAW
    b.use_database()
    out: dict[str, Any] = {}
    for name, sql in queries.items():
        took = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            b.rows(sql)
            took.append(time.perf_counter() - t0)
        on = "rollup" if any(f" {v}" in sql or f".{v}" in sql for v in views.ON_ROLLUPS) or "gpu_rollup" in sql \
            else "raw"
        out[name] = {"ms": round(statistics.median(took) * 1000, 1), "reads": on}
    return {"part": "query latency", "rows": one(b, f"SELECT count() FROM {DB}.gpu_frames"),
            "rollup_1h_rows": one(b, f"SELECT count() FROM {DB}.gpu_rollup_1h"), "queries": out,
            "slowest_ms": max(v["ms"] for v in out.values()),
            "slowest_on_rollups_ms": max((v["ms"] for v in out.values() if v["reads"] == "rollup"), default=None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    start = (time.time_ns() // (3600 * S) - int(args.hours) - 2) * 3600 * S
    params = SimParams(nodes=args.nodes, gpus=args.gpus, seed=4, start_ns=start)
    with tempfile.TemporaryDirectory() as tmp:
        b = ChdbBackend(f"{tmp}/db", DB)
        try:
            ensure_schema(b)
            t0 = time.perf_counter()
            ingest_simulation(b, params, seconds=args.seconds)
            block_rows = one(b, f"SELECT count() FROM {DB}.gpu_frames")
            print(json.dumps({"part": "simulated block", "gpus": args.nodes * args.gpus, "seconds": args.seconds,
                              "rows": block_rows, "ingest_core_s": round(time.perf_counter() - t0, 1)}), flush=True)
            print(json.dumps(bytes_per_value(b), indent=1), flush=True)
            print(json.dumps(insert_rates(b, args.seconds, block_rows), indent=1), flush=True)
            copies = int(args.hours * 3600 / args.seconds) - 1
            secs = expand(b, args.seconds, copies)
            print(json.dumps({"part": "expanded", "hours": args.hours, "insert_s": round(secs, 1),
                              "rows_per_s": round(copies * block_rows / secs)}), flush=True)
            print(json.dumps(latencies(b, args.rounds), indent=1), flush=True)
        finally:
            b.close()


if __name__ == "__main__":
    main()
