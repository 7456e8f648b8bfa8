"""Shared fixtures of the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.detect.agent import detection_columns
from agents.ingest.simulated import ingest_simulation
from agents.sinks.clickhouse import ChdbBackend
from agents.sinks.schema import ensure_schema
from schemas.alerts import make_alert
from tests.unit.sim_db import A100, DB, H200, HOUR, S


@pytest.fixture(scope="session")
def sim_db_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two simulated clusters (H200 in us-east, A100 in eu-west) through the ingest core into chDB, a drift
    episode, a leak and two scale decisions: what the SQL views, the cookbook and the dashboards are checked on.
    Built once per session (it takes ~30 s) and closed at once: chDB serves one data path per process."""
    path = tmp_path_factory.mktemp("views") / "db"
    b = ChdbBackend(path, DB)
    try:
        _fill(b)
    finally:
        b.close()
    return path


# Per module, closed after it: other modules open their own data paths in between. The modules that use it
# only read it.
@pytest.fixture(scope="module")
def db(sim_db_path: Path) -> Iterator[ChdbBackend]:
    """The simulated clusters' database (``sim_db_path``), its database the default one."""
    b = ChdbBackend(sim_db_path, DB)
    b.use_database()  # the cookbook's names are unqualified, as under `flopwatch sql`
    yield b
    b.close()


def _fill(b: ChdbBackend) -> None:
    ensure_schema(b)
    ingest_simulation(b, H200, seconds=2_400)
    ingest_simulation(b, A100, seconds=1_200)
    # A drift on node-00/0 for ten minutes with a baseline 25% above what the GPU did: a fifth of its cost lost.
    _, fpw = b.rows(f"SELECT avg(flops_per_watt) FROM {DB}.gpu_frames WHERE node = 'node-00' AND gpu = '0' AND "
                    f"ts >= fromUnixTimestamp64Nano({HOUR}) AND ts < fromUnixTimestamp64Nano({HOUR + 600 * S})")
    drift = make_alert("efficiency_drift", "warning", "node-00", "0", value=0.8, threshold=0.85,
                       onset_ts_ns=HOUR, ts_ns=HOUR + 5 * S, workload="llm-pretrain", namespace="training",
                       baseline=float(fpw[0][0]) * 1.25)
    stall = make_alert("pipeline_stall", "warning", "node-01", "1", value=0.7, threshold=0.5, onset_ts_ns=HOUR,
                       ts_ns=HOUR + 40 * S, workload="llm-pretrain", namespace="training",
                       evidence={"cost_usd_per_h": 2.0})  # a leak of 20 minutes: 0.67 USD
    b.insert("detections", detection_columns([drift, drift.resolved(HOUR + 600 * S), stall,
                                              stall.resolved(HOUR + 1_200 * S)] * 2))  # written twice
    ms = HOUR // 1_000_000
    b.execute(f"INSERT INTO {DB}.scale_decisions (ts, id, outcome, action, namespace, workload, current, desired, "
              f"reasons) VALUES ({ms / 1000}, 'd1', 'taken', 'scale_up', 'serving', 'chat', 2, 3, ['load']), "
              f"({ms / 1000 + 60}, 'd2', 'withheld', 'scale_down', 'serving', 'chat', 3, 2, ['idle']), "
              f"({ms / 1000}, 'd1', 'taken', 'scale_up', 'serving', 'chat', 2, 3, ['load'])")
