"""The views and every query of docs/sql.md, on chDB over a simulator run: each answer checked against the raw
table computed another way."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from agents.sinks.clickhouse import ChdbBackend
from tests.unit.sim_db import HOUR, S

COOKBOOK = Path(__file__).resolve().parents[2] / "docs" / "sql.md"


def cookbook() -> dict[str, str]:
    """The named queries of docs/sql.md."""
    blocks = re.findall(r"```sql\n-- name: (\w+)\n(.*?)```", COOKBOOK.read_text(), flags=re.S)
    return {name: sql for name, sql in blocks}


def one(b: ChdbBackend, sql: str) -> Any:
    return b.rows(sql)[1][0][0]


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-12)


GPU = "gpu != 'host'"


def test_cost_heatmap_and_pareto(db: ChdbBackend) -> None:
    _, rows = db.rows("SELECT gpu_model, region, gpu_hours, usd, usd_per_tflops_h FROM cost_heatmap ORDER BY gpu_model")
    assert [(r[0], r[1]) for r in rows] == [("A100", "eu-west"), ("H200", "us-east")]
    for model, _, hours, usd, per in rows:
        raw = db.rows(f"SELECT count() / 3600, sum(cost_usd), sum(cost_usd) / (sum(tflops) / 3600) FROM gpu_frames "
                      f"WHERE {GPU} AND gpu_model = '{model}'")[1][0]
        assert close(hours, raw[0]) and close(usd, raw[1]) and close(per, raw[2], 1e-6), (rows, raw)
    _, front = db.rows("SELECT gpu_model, usd_per_tflops_h, tflops, in_target, on_frontier FROM pareto")
    for _, cost, speed, target, on in front:
        dominated = any(c <= cost and s >= speed and (c < cost or s > speed) for _, c, s, _, _ in front)
        assert bool(on) == (not dominated) and bool(target) == (cost <= 0.05 and speed >= 80.0), front
    assert any(on for *_, on in front)


def test_cost_energy_idle_and_request_views_sum_to_the_raw_table(db: ChdbBackend) -> None:
    assert close(one(db, "SELECT sum(usd) FROM cost_by_workload"), one(db, f"SELECT sum(cost_usd) FROM gpu_frames WHERE {GPU}"))
    assert close(one(db, "SELECT sum(kwh) FROM energy_by_workload"),
                 one(db, f"SELECT sum(energy_j) / 3.6e6 FROM gpu_frames WHERE {GPU}"))
    assert close(one(db, "SELECT sum(idle_usd) FROM cost_by_workload"),
                 one(db, f"SELECT sum(cost_usd * (idle = 1 AND pod != '')) FROM gpu_frames WHERE {GPU}"))
    _, req = db.rows("SELECT workload, requests, usd_per_1k_requests FROM cost_per_request")
    raw = db.rows(f"SELECT workload, sum(request_rate), sum(cost_usd) FROM gpu_frames WHERE {GPU} "
                  "AND request_rate IS NOT NULL GROUP BY workload")[1]
    assert {w for w, _, _ in req} == {w for w, _, _ in raw} == {"llm-serve"}
    assert close(sum(r for _, r, _ in req), raw[0][1])
    _, dist = db.rows("SELECT util_from, gpu_hours, share FROM util_distribution ORDER BY util_from")
    assert close(sum(s for *_, s in dist), 1.0) and all(0 <= u <= 90 for u, *_ in dist)
    assert close(sum(h for _, h, _ in dist), one(db, f"SELECT countIf(gpu_util IS NOT NULL) / 3600 FROM gpu_frames WHERE {GPU}"))


def test_every_cookbook_query_runs_and_answers_right(db: ChdbBackend) -> None:
    q = cookbook()
    assert set(q) == {"heatmap", "frontier", "top_cost_workloads", "idle_cost", "efficiency_by_model", "drift_cost",
                      "decisions_of_workload", "alerts_and_decisions"}
    got = {name: db.rows(sql) for name, sql in q.items()}
    names, heat = got["heatmap"]
    assert names[:2] == ["gpu_model", "region"] and len(heat) == 2 and heat[0][2] <= heat[1][2]
    assert got["frontier"][1] and all(r[4] > 0 for r in got["frontier"][1])
    top = got["top_cost_workloads"][1]
    by_wl = dict(db.rows(f"SELECT workload, round(sum(cost_usd), 4) FROM gpu_frames WHERE {GPU} GROUP BY workload")[1])
    assert [r[1] for r in top] == sorted(by_wl, key=lambda w: -by_wl[w]) and all(close(r[2], by_wl[r[1]], 1e-6) for r in top)
    assert got["idle_cost"][1]  # the simulated training GPUs idle now and then while their pods hold them
    for _, wl, idle_h, _ in got["idle_cost"][1]:
        assert close(idle_h, one(db, f"SELECT round(countIf(idle = 1 AND pod != '') / 3600, 4) FROM gpu_frames "
                                     f"WHERE {GPU} AND workload = '{wl}'"))
    eff = got["efficiency_by_model"][1]
    assert {r[0] for r in eff} == {"A100", "H200"} and all(len(r[3]) == 3 and r[3][0] <= r[3][2] for r in eff)
    (drift,) = got["drift_cost"][1]
    usd = one(db, f"SELECT sum(cost_usd) FROM gpu_frames WHERE node = 'node-00' AND gpu = '0' AND "
                  f"ts >= fromUnixTimestamp64Nano({HOUR}) AND ts < fromUnixTimestamp64Nano({HOUR + 600 * S})")
    assert drift[1:4] == ("node-00", "0", "llm-pretrain") and close(drift[4], round(usd, 4))
    assert drift[5] == pytest.approx(0.2, abs=0.001) and drift[6] == pytest.approx(usd * 0.2, abs=1e-3)
    decisions = got["decisions_of_workload"][1]
    assert [(r[1], r[2], r[4]) for r in decisions] == [("taken", "scale_up", 3), ("withheld", "scale_down", 2)]
    both = got["alerts_and_decisions"][1]
    assert sum(r[3] for r in both) == 2 and sum(r[4] for r in both) == 2  # drift and leak once, decisions once each
