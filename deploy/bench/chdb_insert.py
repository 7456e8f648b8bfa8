"""The worker's frame inserts into chDB: the Arrow stream it sends (``ChdbBackend.insert``) against the JSONColumns
text it sent before, on the same rows in the same run, rounds alternating.

    python deploy/bench/chdb_insert.py [--nodes 8] [--gpus 8] [--seconds 300] [--rounds 5]

The rows are real pipeline output: ``--seconds`` of the simulated cluster through the ingest's core
(``agents.ingest.simulated``), each poll's ``gpu_frames`` columns as the store builds them. Each round inserts
all of them into a fresh database (rollups' views on) per method: one insert per poll as the ingest did them,
then all rows in one insert.
No Kafka needed. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agents.ingest.simulated import ingest_simulation
from agents.sinks.clickhouse import ChdbBackend, Columns
from agents.sinks.schema import ensure_schema
from schemas import ddl
from streams.sim.simulate import SimParams

S = 1_000_000_000


class _Recorder(ChdbBackend):
    """A chDB backend that keeps the columns of every ``gpu_frames`` insert it is given."""

    def __init__(self, path: str, database: str) -> None:
        super().__init__(path, database)
        self.frames: list[Columns] = []

    def insert(self, table: str, columns: Columns, token: str | None = None) -> None:
        if table == "gpu_frames":
            self.frames.append(columns)
        super().insert(table, columns, token)


def json_insert(b: ChdbBackend, table: str, columns: Columns) -> None:
    """The insert as it was before the Arrow stream: JSONColumns text, times as exact decimal seconds."""
    cols = dict(columns)
    cols["ts"] = cols["ts"] / 1000.0
    payload = orjson.dumps(cols, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    b.execute(f"INSERT INTO {b.database}.{ddl.check_identifier(table)} ({', '.join(cols)}) FORMAT JSONColumns "
              f"{payload}")


def joined(inserts: list[Columns]) -> Columns:
    """All the inserts' rows as one insert (the batched benchmark's final write)."""
    return {k: (np.concatenate([c[k] for c in inserts]) if isinstance(inserts[0][k], np.ndarray)
                else [v for c in inserts for v in c[k]]) for k in inserts[0]}


def timed(method: str, inserts: list[Columns], path: str) -> tuple[float, int]:
    b = ChdbBackend(path, "bench_insert")
    try:
        ensure_schema(b)
        t0 = time.perf_counter()
        for cols in inserts:
            if method == "arrow":
                b.insert("gpu_frames", cols)
            else:
                json_insert(b, "gpu_frames", cols)
        took = time.perf_counter() - t0
        _, rows = b.rows(f"SELECT count(), sum(cityHash64(node, gpu, ts, power, flops_per_watt)) FROM "
                         f"{b.database}.gpu_frames")
        return took, int(rows[0][1])
    finally:
        b.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rec = _Recorder(f"{tmp}/source", "bench_source")
        try:
            ensure_schema(rec)
            ingest_simulation(rec, SimParams(nodes=args.nodes, gpus=args.gpus, seed=1, start_ns=1_796_200_000 * S),
                              seconds=args.seconds)
        finally:
            rec.close()
        rows = sum(len(c["node"]) for c in rec.frames)
        out: list[dict[str, Any]] = []
        for case, inserts in (("one insert per poll (10 s of the cluster)", rec.frames),
                              ("all rows in one insert", [joined(rec.frames)])):
            took: dict[str, list[float]] = {"json": [], "arrow": []}
            digests: set[int] = set()
            for r in range(args.rounds):
                for method in ("json", "arrow") if r % 2 == 0 else ("arrow", "json"):
                    secs, digest = timed(method, inserts, f"{tmp}/{len(out)}{method}{r}")
                    took[method].append(secs)
                    digests.add(digest)
            ratios = [j / a for j, a in zip(took["json"], took["arrow"], strict=True)]
            out.append({"case": case, "rows": rows, "inserts": len(inserts), "rounds": args.rounds,
                        "arrow_rows_per_s": round(rows / statistics.median(took["arrow"])),
                        "json_rows_per_s": round(rows / statistics.median(took["json"])),
                        "arrow_speedup": round(statistics.median(ratios), 2),
                        "per_round": [round(x, 2) for x in ratios], "same_rows": len(digests) == 1})
    print(json.dumps({"bench": "chDB frame inserts, Arrow stream vs JSONColumns text", "results": out}, indent=1))


if __name__ == "__main__":
    main()
