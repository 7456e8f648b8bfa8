"""deploy/grafana: the dashboard has what Grafana needs of a provisioned dashboard, every panel's and annotation's
SQL runs on chDB over a simulator run (the ClickHouse plugin's macros expanded as the plugin does), and the
provisioning files name the datasource the panels use, with no credential written in them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from agents.sinks.clickhouse import ChdbBackend
from tests.unit.sim_db import HOUR, S

ROOT = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
DASHBOARD = orjson.loads((ROOT / "dashboards" / "flopwatch.json").read_bytes())
PANEL_TYPES = {"table", "timeseries", "xychart", "barchart", "heatmap", "stat", "state-timeline"}
FROM, TO = HOUR - 3_600 * S, HOUR + 3 * 3_600 * S  # the dashboard's time range in the test: the whole run


def expand(sql: str, variables: dict[str, str]) -> str:
    """What the ClickHouse datasource plugin sends for ``sql`` over [FROM, TO]."""
    lo, hi = f"toDateTime({FROM // S})", f"toDateTime({TO // S})"
    sql = re.sub(r"\$__timeFilter\((\w+)\)", lambda m: f"{m.group(1)} >= {lo} AND {m.group(1)} <= {hi}", sql)
    sql = sql.replace("$__fromTime", lo).replace("$__toTime", hi)
    for name, value in variables.items():
        sql = sql.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in sql, sql
    return sql


def variables() -> dict[str, str]:
    return {v["name"]: str(v["query"]) for v in DASHBOARD["templating"]["list"]}


def test_the_dashboard_has_what_grafana_needs() -> None:
    d = DASHBOARD
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int) and d["time"]["from"].startswith("now-")
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) >= 6
    titles = " / ".join(p["title"] for p in d["panels"]).lower()
    for want in ("model and region", "pareto", "flops per watt", "decisions", "idle"):
        assert want in titles, want
    grid = [(p["gridPos"]["x"], p["gridPos"]["y"], p["gridPos"]["w"], p["gridPos"]["h"]) for p in d["panels"]]
    assert all(x >= 0 and x + w <= 24 and w > 0 and h > 0 for x, _, w, h in grid)
    for i, a in enumerate(grid):  # no two panels overlap
        for b in grid[i + 1:]:
            assert a[0] + a[2] <= b[0] or b[0] + b[2] <= a[0] or a[1] + a[3] <= b[1] or b[1] + b[3] <= a[1], (a, b)
    for p in d["panels"]:
        assert p["type"] in PANEL_TYPES and p["targets"], p["title"]
        for t in p["targets"]:
            assert t["refId"] and t["rawSql"].strip() and t["datasource"] == p["datasource"], p["title"]
            assert (t["queryType"] == "timeseries") == (p["type"] == "timeseries"), p["title"]
    (ann,) = d["annotations"]["list"]
    assert ann["datasource"]["uid"] == "flopwatch-clickhouse" and "detections" in ann["target"]["rawSql"]


def test_provisioning_names_the_datasource_and_holds_no_secret() -> None:
    ds = yaml.safe_load((ROOT / "provisioning" / "datasources" / "flopwatch.yaml").read_text())["datasources"][0]
    uids = {p["datasource"]["uid"] for p in DASHBOARD["panels"]}
    assert uids == {ds["uid"]} and ds["type"] == "grafana-clickhouse-datasource"
    assert ds["secureJsonData"]["password"] == "${FLOPWATCH_CLICKHOUSE_PASSWORD}"  # from the environment only
    boards = yaml.safe_load((ROOT / "provisioning" / "dashboards" / "flopwatch.yaml").read_text())
    assert boards["providers"][0]["type"] == "file"


@pytest.mark.parametrize("panel", DASHBOARD["panels"], ids=lambda p: str(p["title"]))
def test_every_panel_query_runs_and_shows_the_run(db: ChdbBackend, panel: dict[str, Any]) -> None:
    for t in panel["targets"]:
        names, rows = db.rows(expand(t["rawSql"], variables()))
        if t["queryType"] == "timeseries":
            assert names[0] == "time", names
        assert rows, panel["title"]  # each panel has something to draw of the simulated run


def test_the_annotations_show_the_detections(db: ChdbBackend) -> None:
    (ann,) = DASHBOARD["annotations"]["list"]
    names, rows = db.rows(expand(ann["target"]["rawSql"], variables()))
    assert names[:3] == ["time", "timeEnd", "text"] and len(rows) == 2
    assert {r[2] for r in rows} == {"efficiency_drift on node-00/0: llm-pretrain", "pipeline_stall on node-01/1: llm-pretrain"}
