"""Versioned, idempotent schema migrations on chDB: `flopwatch schema migrate/show`, an old database brought up to
date (its frames rolled up once), a newer one refused by the CLI and by a worker's start."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from agents.cli.main import cli
from agents.sinks.clickhouse import ChdbBackend
from agents.sinks.schema import SCHEMA_VERSION, SchemaTooNewError, ensure_schema, plan
from schemas import ddl

DB = "fwmig"


def env(tmp: Path) -> dict[str, str]:
    # The CLI reads the process environment too (the test script points it at clickhouse-server): say chDB.
    return {"FLOPWATCH_CHDB_PATH": str(tmp / "db"), "FLOPWATCH_CLICKHOUSE_DATABASE": DB,
            "FLOPWATCH_CLICKHOUSE_BACKEND": "chdb", "FLOPWATCH_CLICKHOUSE_LAYOUT": "current"}


def test_dry_run_prints_the_ddl_and_changes_nothing_then_migrate_applies_it_once(tmp_path: Path) -> None:
    runner = CliRunner()
    dry = runner.invoke(cli, ["schema", "migrate", "--dry-run"], env=env(tmp_path))
    assert dry.exit_code == 0, dry.output
    assert "CREATE TABLE IF NOT EXISTS fwmig.gpu_frames" in dry.output and "gpu_rollup_1h_mv" in dry.output
    assert f"none (no tables) -> {SCHEMA_VERSION}" in dry.output and "dry run: nothing changed" in dry.output
    shown = runner.invoke(cli, ["schema", "show"], env=env(tmp_path))
    assert shown.exit_code == 0 and "statement(s) pending" in shown.output and "gpu_frames" not in shown.output
    done = runner.invoke(cli, ["schema", "migrate"], env=env(tmp_path))
    assert done.exit_code == 0 and f"-> {SCHEMA_VERSION}" in done.output, done.output
    again = runner.invoke(cli, ["schema", "migrate", "--dry-run"], env=env(tmp_path))
    assert again.exit_code == 0 and f"{SCHEMA_VERSION} -> {SCHEMA_VERSION}, 0 statement(s)" in again.output
    shown = runner.invoke(cli, ["schema", "show"], env=env(tmp_path))
    assert shown.exit_code == 0 and "up to date" in shown.output, shown.output
    assert "gpu_rollup_1m" in shown.output and "1825" in shown.output and "AggregatingMergeTree" in shown.output


def test_an_unversioned_database_is_brought_up_to_date_and_its_frames_rolled_up_once(tmp_path: Path) -> None:
    b = ChdbBackend(tmp_path / "db", DB)
    try:
        # What flopwatch wrote before versions and rollups: the base tables of then, no causes column, two frames.
        # (Before version 4 the derived columns had no codec.)
        old_frames = re.sub(rf"({'|'.join(ddl.DERIVED_COLS)}) Nullable\(Float64\) CODEC\(Gorilla, ZSTD\(1\)\)",
                            r"\1 Nullable(Float64)", ddl.gpu_frames(DB))
        assert old_frames.count("CODEC(Gorilla") == len(ddl.VALUE_COLS)
        for stmt in [f"CREATE DATABASE {DB}", old_frames, ddl.k8s_events(DB), ddl.ingest_progress(DB),
                     ddl.node_progress(DB), ddl.scale_decisions(DB),
                     ddl.detections(DB).replace(", causes String", "")]:
            b.execute(stmt)
        b.execute(f"INSERT INTO {DB}.gpu_frames (ts, node, gpu, workload, power, cost_usd) VALUES "
                  "('2026-12-01 10:00:00', 'n', '0', 'llm', 300, 0.001), ('2026-12-01 10:00:01', 'n', '0', 'llm', 500, 0.001)")
        p = plan(b)
        assert p.found == 0 and any("ADD COLUMN causes" in s for s in p.statements)
        assert sum("INSERT INTO fwmig.gpu_rollup" in s for s in p.statements) == 2  # one fill per rollup
        assert "ALTER TABLE fwmig.gpu_frames MODIFY COLUMN tflops Nullable(Float64) CODEC(Gorilla, ZSTD(1))" \
            in p.statements
        ensure_schema(b)
        assert plan(b).current
        ensure_schema(b)  # again: nothing to do, nothing filled twice
        _, rows = b.rows(f"SELECT sum(frames), avgMerge(power_avg), max(power_max) FROM {DB}.gpu_rollup_1h")
        assert rows == [(2, 400.0, 500.0)]
        _, cols = b.rows(f"SELECT count() FROM system.columns WHERE database = '{DB}' AND table = 'detections' "
                         "AND name = 'causes'")
        assert cols == [(1,)]
        _, codecs = b.rows(f"SELECT name, compression_codec FROM system.columns WHERE database = '{DB}' "
                           "AND table = 'gpu_frames' AND name IN ('tflops', 'cost_usd', 'power')")
        assert all("Gorilla" in str(c) for _, c in codecs) and len(codecs) == 3, codecs
    finally:
        b.close()


def test_a_database_of_a_newer_flopwatch_is_refused(tmp_path: Path) -> None:
    b = ChdbBackend(tmp_path / "db", DB)
    try:
        ensure_schema(b)
        b.execute(f"INSERT INTO {DB}.schema_version (version, applied_at, by) VALUES ({SCHEMA_VERSION + 1}, now64(), 'x')")
        with pytest.raises(SchemaTooNewError, match=f"schema version {SCHEMA_VERSION + 1}.*Upgrade flopwatch"):
            ensure_schema(b)
    finally:
        b.close()
    res = CliRunner().invoke(cli, ["schema", "migrate", "--dry-run"], env=env(tmp_path))
    assert res.exit_code != 0 and "written by a newer flopwatch" in res.output
    res = CliRunner().invoke(cli, ["schema", "show"], env=env(tmp_path))
    assert res.exit_code == 0 and "refuses to start" in res.output
