"""Cluster mode's DDL (``schemas.cluster``) for every table flopwatch makes, and its settings' checks; the real
two-node cluster runs it in ``tests/integration/test_cluster.py``."""

from __future__ import annotations

import re

import pytest

from agents.settings import SettingsError, load_settings
from schemas import cluster, ddl


@pytest.mark.parametrize("layout", ["current", "legacy"])
def test_every_table_becomes_a_replicated_local_table_and_a_distributed_one(layout: ddl.Layout) -> None:
    for name, sql in ddl.tables("fw", layout).items():
        local, dist = cluster.clustered(sql, "c1")
        assert local.startswith(f"CREATE TABLE IF NOT EXISTS fw.{name}_local ON CLUSTER c1 (")
        engine = re.search(r"ENGINE = (\w+)\('/clickhouse/tables/\{shard\}/fw/(\w+)', '\{replica\}'\)", local)
        assert engine and engine.group(1).startswith("Replicated") and engine.group(2) == name, local
        # Everything after the engine (partitioning, order, TTL) is the single server's.
        assert local.split("MergeTree", 1)[1].split(")", 1)[1] == sql.split("MergeTree", 1)[1].lstrip("()")
        assert dist == (f"CREATE TABLE IF NOT EXISTS fw.{name} ON CLUSTER c1 AS fw.{name}_local "
                        f"ENGINE = Distributed(c1, fw, {name}_local, {cluster.SHARD_KEYS[name]})")


def test_alters_reach_both_tables_and_a_ttl_only_the_replicated_one() -> None:
    add = ddl.detections_migrations("fw", set())[0]
    assert cluster.clustered_alter(add, "c1") == [
        "ALTER TABLE fw.detections_local ON CLUSTER c1 ADD COLUMN causes String DEFAULT '[]'",
        "ALTER TABLE fw.detections ON CLUSTER c1 ADD COLUMN causes String DEFAULT '[]'"]
    assert cluster.clustered_alter(ddl.frames_ttl("fw", 30), "c1") == [
        "ALTER TABLE fw.gpu_frames_local ON CLUSTER c1 MODIFY TTL toDateTime(ts) + INTERVAL 30 DAY"]


def test_what_is_not_a_table_statement_or_a_name_is_refused() -> None:
    with pytest.raises(ValueError, match="not a CREATE TABLE"):
        cluster.clustered("CREATE VIEW fw.v AS SELECT 1", "c1")
    with pytest.raises(ValueError):
        cluster.clustered(ddl.tables("fw")["gpu_frames"], "c1; DROP TABLE x")


@pytest.mark.parametrize(("env", "message"), [
    ({"FLOPWATCH_CLICKHOUSE_CLUSTER": "c1"}, "needs FLOPWATCH_CLICKHOUSE_BACKEND=native"),
    ({"FLOPWATCH_CLICKHOUSE_CLUSTER": "a-b", "FLOPWATCH_CLICKHOUSE_BACKEND": "native"}, "not a cluster name"),
    ({"FLOPWATCH_CLICKHOUSE_ALT_HOSTS": "127.0.0.1:9102,nohost"}, "'nohost' is not host:port"),
])
def test_cluster_settings_are_checked_at_start(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(env)


def test_alt_hosts_reach_the_driver() -> None:
    s = load_settings({"FLOPWATCH_CLICKHOUSE_BACKEND": "native", "FLOPWATCH_CLICKHOUSE_CLUSTER": "c1",
                       "FLOPWATCH_CLICKHOUSE_ALT_HOSTS": " 127.0.0.1:9102 , [::1]:9103"})
    from agents.sinks.clickhouse import NativeBackend

    b = NativeBackend(s)  # no connection is made until the first query
    try:
        assert b._kwargs["alt_hosts"] == "127.0.0.1:9102,[::1]:9103"
        assert b._kwargs["settings"] == {"insert_distributed_sync": 1}
    finally:
        b.close()
