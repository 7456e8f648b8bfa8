"""The leak ledger: the leak_episodes view and `flopwatch leaks` over detections rows, on chDB."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
from click.testing import CliRunner

from agents.cli.main import cli
from agents.detect.agent import detection_columns
from agents.settings import load_settings
from agents.sinks.clickhouse import open_backend
from agents.sinks.schema import ensure_schema
from schemas.alerts import Cause, make_alert

S = 1_000_000_000
HOUR = 3600 * S


def test_the_ledger_prices_each_episode_and_names_its_cause(tmp_path: Path) -> None:
    # The CLI reads the process environment too (the test script points it at clickhouse-server): say chDB.
    env = {"FLOPWATCH_CHDB_PATH": str(tmp_path / "db"), "FLOPWATCH_CLICKHOUSE_DATABASE": "fwledger",
           "FLOPWATCH_CLICKHOUSE_BACKEND": "chdb", "FLOPWATCH_CLICKHOUSE_LAYOUT": "current"}
    settings = load_settings(env)
    now = time.time_ns()
    idle = make_alert("idle_allocated", "warning", "node-1", "0", value=600.0, threshold=600.0,
                      onset_ts_ns=now - 3 * HOUR, ts_ns=now - 3 * HOUR + 600 * S, workload="llm", namespace="ml",
                      evidence={"cost_usd_per_h": 4.0})
    idle_why = idle.attributed((Cause("OOMKilled", 0.9, {"source": "k8s"}),))
    idle_end = idle_why.resolved(now - HOUR)  # two hours idle at 4 USD/h: 8 USD
    stall = make_alert("pipeline_stall", "warning", "node-2", "1", value=0.8, threshold=0.5,
                       onset_ts_ns=now - HOUR // 2, ts_ns=now - HOUR // 2 + 40 * S, workload="etl", namespace="data",
                       evidence={"cost_usd_per_h": 1.0})  # still open: about half a dollar so far
    old = make_alert("pipeline_stall", "warning", "node-2", "1", value=0.8, threshold=0.5,
                     onset_ts_ns=now - 50 * HOUR, ts_ns=now - 50 * HOUR + 40 * S, namespace="data",
                     evidence={"cost_usd_per_h": 1.0})
    drift = make_alert("efficiency_drift", "warning", "node-1", "0", value=1.0, threshold=2.0,
                       onset_ts_ns=now - HOUR, ts_ns=now - HOUR + 3 * S)  # not a leak
    backend = open_backend(settings)
    try:
        ensure_schema(backend)
        # Each message twice (a replay), as the agent may write them: the ledger groups by id, no FINAL needed.
        rows = [idle, idle_why, idle_end, stall, old, old.resolved(now - 49 * HOUR), drift] * 2
        backend.insert("detections", detection_columns(rows))
        _, got = backend.rows("SELECT rule, namespace, round(usd, 1), cause, resolved FROM fwledger.leak_episodes "
                              "ORDER BY usd DESC")
    finally:
        backend.close()
    assert [tuple(r) for r in got] == [("idle_allocated", "ml", 8.0, "OOMKilled", 1), ("pipeline_stall", "data", 1.0, "", 1),
                                       ("pipeline_stall", "data", 0.5, "", 0)]
    runner = CliRunner()
    res = runner.invoke(cli, ["leaks", "--since", "24h", "--format", "json"], env=env)
    assert res.exit_code == 0, res.output
    top = orjson.loads(res.output)
    assert [(r["rule"], round(r["usd"], 1), r["cause"]) for r in top] == [("idle_allocated", 8.0, "OOMKilled"),
                                                                            ("pipeline_stall", 0.5, "")]
    res = runner.invoke(cli, ["leaks", "--namespace", "ml"], env=env)
    assert res.exit_code == 0 and "idle_allocated" in res.output and "pipeline_stall" not in res.output
    assert "8.00" in res.output and "OOMKilled" in res.output and "ml/llm" in res.output
    res = runner.invoke(cli, ["leaks", "--since", "a while"], env=env)
    assert res.exit_code != 0 and "write a number and a unit" in res.output
