"""Frames a crash left out of the rollups (the table's part committed, its views' not) are found when partitions
are assigned and rebuilt node by node, exactly; on chDB."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.ingest.simulated import ingest_simulation
from agents.sinks.clickhouse import ChdbBackend, ClickHouseError
from agents.sinks.schema import ensure_schema
from agents.sinks.store import FrameStore
from schemas.rollups import ROLLUPS
from streams.sim.simulate import SimParams

DB = "fwrepair"
S = 1_000_000_000
HOUR = 1_796_198_400 * S  # 2026-12-02 08:00 UTC
PARAMS = SimParams(nodes=2, gpus=2, seed=7, start_ns=HOUR - 90 * S)


def per_node(backend: ChdbBackend) -> dict[str, tuple[float, ...]]:
    """Frames per node: in gpu_frames FINAL, in each rollup, and the rollups' energy against the frames'."""
    q = [f"SELECT node, count(), round(sum(ifNull(energy_j, 0)), 3) FROM {DB}.gpu_frames FINAL GROUP BY node"]
    q += [f"SELECT node, sum(frames), round(sum(energy_j_sum), 3) FROM {DB}.{r.table} GROUP BY node" for r in ROLLUPS]
    out: dict[str, tuple[float, ...]] = {}
    for sql in q:
        for node, n, e in backend.rows(sql)[1]:
            out[node] = (*out.get(node, ()), int(n), float(e))
    return out


def exact(counts: tuple[float, ...]) -> bool:
    return counts[0] == counts[2] == counts[4] and counts[1] == pytest.approx(counts[3]) == pytest.approx(counts[5])


@pytest.fixture
def crashed(tmp_path: Path) -> ChdbBackend:
    """Two minutes written whole, then 40 s that reached gpu_frames and neither rollup, across an hour's edge."""
    b = ChdbBackend(tmp_path / "db", DB)
    ensure_schema(b)
    assert ingest_simulation(b, PARAMS, seconds=120) > 0
    b.execute(f"DETACH TABLE {DB}.{ROLLUPS[0].table}_mv")  # what a kill between the two commits leaves
    later = SimParams(nodes=2, gpus=2, seed=7, start_ns=PARAMS.start_ns + 120 * S)
    assert ingest_simulation(b, later, seconds=40) > 0
    b.execute(f"ATTACH TABLE {DB}.{ROLLUPS[0].table}_mv")
    return b


def test_a_crash_between_the_commits_is_rebuilt_for_the_nodes_this_worker_owns(crashed: ChdbBackend) -> None:
    before = per_node(crashed)
    assert set(before) == {"node-00", "node-01"} and not any(exact(c) for c in before.values()), before
    store = FrameStore(crashed)
    store.recover()
    assert set(store.rollups.suspect) == {"node-00", "node-01"}
    assert all(len(hours) >= 1 for hours in store.rollups.suspect.values())
    store.rollups.repair(["node-00"])  # the only node of the partitions assigned
    after = per_node(crashed)
    assert exact(after["node-00"]), after
    assert after["node-01"] == before["node-01"]  # another worker's node: not touched
    assert set(store.rollups.suspect) == {"node-01"}
    store.rollups.repair(["node-00", "node-01"])
    assert all(exact(c) for c in per_node(crashed).values()), per_node(crashed)
    assert store.rollups.rebuilt >= 2
    # Rebuilt, the rollups agree with the frames: the next assignment finds nothing, and a rebuild of a sound
    # hour changes nothing (its blocks are not dropped as duplicates of the first rebuild's).
    again = FrameStore(crashed)
    again.recover()
    assert again.rollups.suspect == {}
    snapshot = per_node(crashed)
    again.rollups.suspect = {"node-00": {int(HOUR // S) - 3600, int(HOUR // S)}}
    again.rollups.repair(["node-00"])
    assert per_node(crashed) == snapshot


def test_a_worker_rebuilds_a_node_before_it_writes_that_nodes_next_frames(crashed: ChdbBackend) -> None:
    before = per_node(crashed)
    store = FrameStore(crashed)
    store.recover()
    assert store.rollups.suspect
    next_minute = SimParams(nodes=2, gpus=2, seed=7, start_ns=PARAMS.start_ns + 160 * S)
    assert ingest_simulation(crashed, next_minute, seconds=30, store=store) > 0
    assert store.rollups.suspect == {} and store.rollups.rebuilt >= 2
    counts = per_node(crashed)
    assert all(exact(c) for c in counts.values()), counts
    assert all(counts[n][0] > before[n][0] for n in counts), (before, counts)  # the new frames are in


def test_frames_written_twice_under_other_tokens_count_once_after_a_rebuild(crashed: ChdbBackend) -> None:
    # A range replayed with other tokens (another chunking): gpu_frames collapses it (FINAL), the rollups sum
    # it twice; the rebuild reads FINAL.
    again = SimParams(nodes=2, gpus=2, seed=7, start_ns=PARAMS.start_ns)
    assert ingest_simulation(crashed, again, seconds=120, chunk_s=7) > 0
    doubled = per_node(crashed)
    assert all(c[2] > c[0] for c in doubled.values()), doubled  # the minute rollup counts the replay again
    store = FrameStore(crashed)
    store.recover()
    assert set(store.rollups.suspect) == {"node-00", "node-01"}
    store.rollups.repair(["node-00", "node-01"])
    assert all(exact(c) for c in per_node(crashed).values()), per_node(crashed)


def test_no_rollups_nothing_to_scan(tmp_path: Path) -> None:
    b = ChdbBackend(tmp_path / "db", DB)
    ensure_schema(b, rollup_days=None)
    assert ingest_simulation(b, PARAMS, seconds=30) > 0
    store = FrameStore(b)
    store.recover()
    assert not store.rollups.fed() and store.rollups.suspect == {}


def test_a_server_that_refuses_the_check_or_the_rebuild_does_not_stop_the_writes(crashed: ChdbBackend,
                                                                                 caplog: pytest.LogCaptureFixture,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = FrameStore(crashed)
    store.recover()
    assert store.rollups.suspect
    real = crashed.execute

    def refuse(sql: str, params: dict[str, object] | None = None) -> None:
        if sql.startswith("ALTER TABLE"):
            raise ClickHouseError("chDB: Code: 164. DB::Exception: Cannot execute query in readonly mode")
        real(sql, params)

    monkeypatch.setattr(crashed, "execute", refuse)
    before = per_node(crashed)
    next_minute = SimParams(nodes=2, gpus=2, seed=7, start_ns=PARAMS.start_ns + 160 * S)
    assert ingest_simulation(crashed, next_minute, seconds=30, store=store) > 0  # the frames are written
    after = per_node(crashed)
    assert all(after[n][0] > before[n][0] for n in after) and store.rollups.rebuilt == 0
    assert store.rollups.suspect == {} and "could not rebuild the rollups of node node-00" in caplog.text
    real_rows = crashed.rows

    def no_join(sql: str, params: dict[str, object] | None = None) -> tuple[list[str], list[tuple[object, ...]]]:
        if "FULL OUTER JOIN" in sql:
            raise ClickHouseError("chDB: Code: 48. DB::Exception: not supported")
        return real_rows(sql, params)

    monkeypatch.setattr(crashed, "rows", no_join)
    store.rollups.scan(int(HOUR // S))
    assert store.rollups.suspect == {} and "could not compare the rollups" in caplog.text
