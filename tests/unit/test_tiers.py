"""Hot and cold tiers on a real storage policy (chDB with a configuration that gives it a second disk): the
frames and both rollups of a simulated cluster ten days old land on the cold volume, today's on the hot one;
an existing database is moved onto the policy by ``schema migrate``; settings that cannot work are refused."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.ingest.simulated import ingest_simulation
from agents.settings import SettingsError, load_settings
from agents.sinks.clickhouse import ChdbBackend, ClickHouseError
from agents.sinks.schema import ensure_schema, plan
from schemas import ddl, tiers
from schemas.tiers import Tiering
from streams.sim.simulate import SimParams

S = 1_000_000_000
DAY = 86_400 * S
TIERING = Tiering("tiered", hot_days=3, cold_volume="cold")
# The hot volume is the default policy's (volume "default", disk "default"): a table made before the policy can
# then be moved onto it.
CONFIG = """<clickhouse><storage_configuration>
  <disks><cold><type>local</type><path>{cold}/</path></cold></disks>
  <policies><tiered><volumes><default><disk>default</disk></default><cold><disk>cold</disk></cold></volumes></tiered></policies>
</storage_configuration></clickhouse>"""


@pytest.fixture(scope="module")
def chdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChdbBackend]:
    root = tmp_path_factory.mktemp("tiers")
    config = root / "config.xml"
    config.write_text(CONFIG.format(cold=root / "cold"))
    b = ChdbBackend(root / "db", "fwtiers", config)
    yield b
    b.close()


def parts_by_disk(b: ChdbBackend, db: str, table: str) -> dict[str, set[str]]:
    """Each disk's days (the newest row of each active part) of a table."""
    _, rows = b.rows(f"SELECT disk_name, toString(toDate(max_time)) FROM system.parts WHERE database = '{db}' "
                     f"AND table = '{table}' AND active")
    out: dict[str, set[str]] = {}
    for disk, day in rows:
        out.setdefault(str(disk), set()).add(str(day))
    return out


def test_old_parts_land_on_the_cold_volume_and_new_ones_stay_hot(chdb: ChdbBackend) -> None:
    now = time.time_ns() // S * S
    ensure_schema(chdb, 30, (60, 90), 1000, tiering=TIERING)
    old = SimParams(nodes=1, gpus=2, seed=1, start_ns=now - 10 * DAY)
    new = SimParams(nodes=1, gpus=2, seed=2, start_ns=now - 3_600 * S)
    ingest_simulation(chdb, old, seconds=120)
    ingest_simulation(chdb, new, seconds=120)
    old_day = time.strftime("%Y-%m-%d", time.gmtime(old.start_ns / S))
    for table in ("gpu_frames", "gpu_rollup_1m", "gpu_rollup_1h"):
        _, q = chdb.rows(f"SELECT create_table_query FROM system.tables WHERE database = 'fwtiers' AND name = '{table}'")
        assert tiers.policy_of(q[0][0]) == "tiered" and tiers.tier_of(q[0][0]) == (3, "cold"), q
        disks = parts_by_disk(chdb, "fwtiers", table)
        assert set(disks) == {"cold", "default"}, (table, disks)
        assert old_day in disks["cold"] and old_day not in disks["default"], (table, disks)
        assert all(day > old_day for day in disks["default"])
    # The retention is still the table's deleting rule.
    _, q = chdb.rows("SELECT create_table_query FROM system.tables WHERE database = 'fwtiers' AND name = 'gpu_frames'")
    assert ddl.ttl_days_of(q[0][0]) == 30
    _, n = chdb.rows("SELECT count(), uniqExact(node, gpu, ts), countIf(ts < now() - INTERVAL 9 DAY) "
                     "FROM fwtiers.gpu_frames")
    assert n[0][0] == n[0][1] == 2 * n[0][2] > 500  # both clusters' frames once each, wherever they lie


def test_an_existing_database_is_moved_onto_the_policy(chdb: ChdbBackend) -> None:
    b = ChdbBackend.__new__(ChdbBackend)  # the same session, another database
    b.layout, b.database, b._session = "current", "fwplain", chdb._session
    ensure_schema(b, 30, (60, 90), 1000)
    p = plan(b, 30, (60, 90), 1000, tiering=TIERING)
    moved = [s for s in p.statements if "storage_policy = 'tiered'" in s]
    ttls = [s for s in p.statements if "TO VOLUME 'cold'" in s]
    assert len(moved) == 3 and len(ttls) == 3, p.statements
    assert any("parts older than 3 days move to volume 'cold'" in n for n in p.notes)
    ensure_schema(b, 30, (60, 90), 1000, tiering=TIERING)
    again = plan(b, 30, (60, 90), 1000, tiering=TIERING)
    assert again.current, again.statements
    # Off again: the rules go, the policy stays (the server cannot take it off), and it says so.
    off = plan(b, 30, (60, 90), 1000)
    assert [s for s in off.statements if "MODIFY TTL" in s] and not [s for s in off.statements if "MODIFY SETTING" in s]
    assert any("stays on storage policy 'tiered'" in n for n in off.notes)


def test_a_missing_configuration_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ClickHouseError, match="not a readable file"):
        ChdbBackend(tmp_path / "db", "fw", tmp_path / "nope.xml")


@pytest.mark.parametrize(("env", "message"), [
    ({"FLOPWATCH_STORAGE_POLICY": "tiered", "FLOPWATCH_HOT_DAYS": "400"}, "not longer than the 400 hot days"),
    ({"FLOPWATCH_STORAGE_POLICY": "tiered", "FLOPWATCH_CLICKHOUSE_LAYOUT": "legacy"}, "no TTL moves"),
    ({"FLOPWATCH_STORAGE_POLICY": "tiered'; DROP"}, "letters, digits and _ only"),
    ({"FLOPWATCH_STORAGE_POLICY": "tiered", "FLOPWATCH_COLD_VOLUME": "a b"}, "letters, digits and _ only"),
])
def test_tier_settings_that_cannot_work_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(env)


def test_tiering_reaches_the_worker_from_the_environment() -> None:
    s = load_settings({"FLOPWATCH_STORAGE_POLICY": "tiered", "FLOPWATCH_HOT_DAYS": "14"})
    assert s.tiering() == Tiering("tiered", 14, "cold") and load_settings({}).tiering() is None
