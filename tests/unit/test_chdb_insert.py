"""chDB inserts go in as an Arrow stream: every kind of column the ingest and the agents write arrives as it was
given (times exact to the ms or ns, NaN and None as NULL, arrays, the deduplication token honoured)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agents.sinks.clickhouse import ChdbBackend, ClickHouseError

DB = "fw_insert"


def test_columns_arrive_as_given(tmp_path: Path) -> None:
    b = ChdbBackend(tmp_path / "db", DB)
    try:
        b.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
        b.execute(f"CREATE TABLE {DB}.frames (ts DateTime64(3, 'UTC'), node LowCardinality(String), "
                  "power Nullable(Float64), n_power UInt64, rank Nullable(Int64), idle Nullable(UInt8), "
                  "written_at DateTime64(3, 'UTC'), gpus Array(String)) ENGINE = ReplacingMergeTree ORDER BY (node, ts) "
                  "SETTINGS non_replicated_deduplication_window = 100")
        b.execute(f"CREATE TABLE {DB}.k8s_events (ts DateTime64(9, 'UTC'), kind String) ENGINE = MergeTree ORDER BY ts")
        frames = {"ts": np.array([1_796_200_344_123, 1_796_200_345_999]), "node": ["node-1", "node-2"],
                  "power": np.array([512.25, np.nan]), "n_power": np.array([10, 0]), "rank": [3, None],
                  "idle": [None, 1], "written_at": [1_796_200_400_001, 1_796_200_400_002], "gpus": [["0", "1"], []]}
        b.insert("frames", frames, token="ab12")
        b.insert("frames", frames, token="ab12")  # a retried block: dropped by its token
        b.insert("k8s_events", {"ts": [1_796_200_344_123_456_789], "kind": ["pod_started"]})
        _, rows = b.rows(f"SELECT toUnixTimestamp64Milli(ts), node, power, n_power, rank, idle, "
                         f"toUnixTimestamp64Milli(written_at), gpus FROM {DB}.frames ORDER BY ts")
        assert rows == [(1_796_200_344_123, "node-1", 512.25, 10, 3, None, 1_796_200_400_001, ["0", "1"]),
                        (1_796_200_345_999, "node-2", None, 0, None, 1, 1_796_200_400_002, [])]
        _, events = b.rows(f"SELECT toUnixTimestamp64Nano(ts), kind FROM {DB}.k8s_events")
        assert events == [(1_796_200_344_123_456_789, "pod_started")]
        with pytest.raises(ClickHouseError, match="NO_SUCH_COLUMN"):
            b.insert("frames", {"nope": [1]})
        _, count = b.rows(f"SELECT count() FROM {DB}.frames")  # the session goes on after a failed insert
        assert count == [(2,)]
    finally:
        b.close()
