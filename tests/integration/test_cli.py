"""The ``flopwatch`` command line as a user runs it: ``sql`` in three formats and ``simulate``, on real services."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time

import pytest

from agents.collect.simulator import SimulatorPublisher
from agents.settings import Settings
from agents.sinks.clickhouse import open_backend
from streams.sim.simulate import SimParams
from tests.integration.helpers import run_worker_until_idle, stored_frames, worker_cmd, worker_env

pytestmark = pytest.mark.integration


def flopwatch(settings: Settings, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agents.cli.main", *args], env=worker_env(settings),
                          capture_output=True, text=True, timeout=timeout_s)


def test_sql_uses_the_configured_database_on_the_server(native_settings: Settings) -> None:
    params = SimParams(nodes=1, gpus=1, seed=4, start_ns=time.time_ns() - 5 * 10**9)
    SimulatorPublisher(native_settings, params, batch_size=10).backlog(5)
    run_worker_until_idle(native_settings)
    _, nrows = stored_frames(native_settings)
    out = flopwatch(native_settings, "sql", "SELECT count() FROM gpu_frames", "--format", "csv")
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.splitlines() == ["count()", str(nrows)] and nrows > 0
    elsewhere = native_settings.replace(clickhouse_database="fw_no_such_db")
    assert flopwatch(elsewhere, "sql", "SELECT 1", "--format", "csv").stdout.splitlines() == ["1", "1"]
    missing = flopwatch(elsewhere, "sql", "SELECT count() FROM gpu_frames")
    assert missing.returncode != 0 and "'fw_no_such_db' does not exist yet" in missing.stderr, missing.stderr[-2000:]
    # The schema commands on the legacy server too: the worker migrated it, nothing is pending, rows counted.
    show = flopwatch(native_settings, "schema", "show")
    assert show.returncode == 0 and "up to date" in show.stdout, (show.stdout, show.stderr[-2000:])
    assert f"{nrows:,}" in show.stdout and "schema_version" in show.stdout
    dry = flopwatch(native_settings, "schema", "migrate", "--dry-run")
    assert dry.returncode == 0 and "0 statement(s)" in dry.stdout, (dry.stdout, dry.stderr[-2000:])


def test_sql_prints_table_json_and_csv_and_reports_errors_cleanly(base_settings: Settings) -> None:
    params = SimParams(nodes=1, gpus=1, seed=3, start_ns=time.time_ns() - 10 * 10**9)
    sent = SimulatorPublisher(base_settings, params, batch_size=10).backlog(10)
    assert sent.samples > 0
    run_worker_until_idle(base_settings)
    _, nrows = stored_frames(base_settings)
    assert nrows > 0
    query = f"SELECT node, count() AS frames FROM {base_settings.clickhouse_database}.gpu_frames GROUP BY node"

    table = flopwatch(base_settings, "sql", query)
    assert table.returncode == 0, table.stderr[-4000:]
    assert "node" in table.stdout and "frames" in table.stdout
    rows = [ln for ln in table.stdout.splitlines() if "node-00" in ln]
    assert len(rows) == 1, table.stdout
    cells = [c for c in rows[0].replace("│", "|").split("|") if c.strip()]
    assert [c.strip() for c in cells] == ["node-00", str(nrows)], table.stdout

    as_json = flopwatch(base_settings, "sql", query, "--format", "json")
    assert as_json.returncode == 0, as_json.stderr[-4000:]
    doc = json.loads(as_json.stdout)
    assert isinstance(doc, list) and len(doc) == 1
    assert set(doc[0]) == {"node", "frames"}
    assert doc[0]["node"] == "node-00"
    assert int(doc[0]["frames"]) == nrows

    as_csv = flopwatch(base_settings, "sql", query, "--format", "csv")
    assert as_csv.returncode == 0, as_csv.stderr[-4000:]
    assert as_csv.stdout.splitlines()[0] == "node,frames"
    assert list(csv.reader(io.StringIO(as_csv.stdout))) == [["node", "frames"], ["node-00", str(nrows)]]

    # Unqualified table names mean the configured database, on the embedded and the server backend.
    short = flopwatch(base_settings, "sql", "SELECT count() FROM gpu_frames", "--format", "csv")
    assert short.returncode == 0, short.stderr[-4000:]
    assert short.stdout.splitlines() == ["count()", str(nrows)]

    bad = flopwatch(base_settings, "sql", f"SELECT (node FROM {base_settings.clickhouse_database}.gpu_frames")
    assert bad.returncode != 0
    assert bad.stdout == ""
    assert "Error" in bad.stderr and "syntax error" in bad.stderr.lower(), bad.stderr[-4000:]
    assert "Traceback" not in bad.stderr, bad.stderr[-4000:]


def test_sql_json_keeps_counts_as_numbers(base_settings: Settings) -> None:
    # A JSON consumer must not get numbers as strings (whatever the backend's 64-bit quoting default is).
    out = flopwatch(base_settings, "sql", "SELECT toUInt64(7) AS n, 'x' AS s", "--format", "json")
    assert out.returncode == 0, out.stderr[-4000:]
    assert json.loads(out.stdout) == [{"n": 7, "s": "x"}]


def test_simulate_backlog_prints_one_json_summary(base_settings: Settings) -> None:
    out = flopwatch(base_settings, "simulate", "--mode", "backlog", "--duration", "3", "--nodes", "1", "--gpus", "1",
                    "--batch-size", "10")
    assert out.returncode == 0, out.stderr[-4000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout
    summary = json.loads(lines[0])
    assert summary["messages"] > 0 and summary["samples"] > 0
    assert summary["bad"] == 0
    assert summary["samples"] >= summary["messages"]  # up to 10 samples per message


def test_simulate_with_rebooting_clock_domains_feeds_the_worker(base_settings: Settings) -> None:
    out = flopwatch(base_settings, "simulate", "--mode", "backlog", "--duration", "8", "--nodes", "1", "--gpus", "1",
                    "--batch-size", "10", "--clock-domains", "--clock-reset", "4")
    assert out.returncode == 0, out.stderr[-4000:]
    sent = json.loads(out.stdout)
    stats = run_worker_until_idle(base_settings)
    assert stats["beacons"] > 0 and stats["rejects"] == {} and stats["samples"] == sent["samples"]

    misuse = flopwatch(base_settings, "simulate", "--clock-reset", "4")
    assert misuse.returncode == 2 and "--clock-reset needs --clock-domains" in misuse.stderr


def test_a_worker_refuses_a_database_of_a_newer_flopwatch(base_settings: Settings) -> None:
    from agents.sinks.schema import SCHEMA_VERSION, ensure_schema

    backend = open_backend(base_settings)
    try:
        ensure_schema(backend)
        backend.execute(f"INSERT INTO {backend.database}.schema_version (version, applied_at, by) "
                        f"VALUES ({SCHEMA_VERSION + 1}, now64(), 'a later flopwatch')")
    finally:
        backend.close()
    proc = subprocess.run(worker_cmd("--exit-when-idle", "2"), env=worker_env(base_settings), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert f"schema version {SCHEMA_VERSION + 1}" in proc.stderr and "Upgrade flopwatch" in proc.stderr, \
        proc.stderr[-3000:]
