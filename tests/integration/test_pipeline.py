"""Simulated samples on all 23 topics -> real Kafka -> worker process -> ClickHouse: exactly the oracle's frames."""

from __future__ import annotations

import time

import pytest

from agents.collect.simulator import SimulatorPublisher
from agents.settings import Settings
from schemas.catalog import CATALOG
from streams.sim.simulate import SimParams
from tests.integration.helpers import assert_frames_equal, expected_frames, run_worker_until_idle, stored_frames

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("batch_size", [1, 100])
def test_all_streams_land_as_exact_frames(any_settings: Settings, batch_size: int) -> None:
    duration = 20.0
    params = SimParams(nodes=2, gpus=2, seed=11, start_ns=time.time_ns() - int(duration * 1e9))
    pub = SimulatorPublisher(any_settings, params, batch_size=batch_size)
    sent = pub.backlog(duration)
    assert sent.samples > 5000

    stats = run_worker_until_idle(any_settings)

    want = expected_frames(params, duration)
    got, nrows = stored_frames(any_settings)
    assert nrows == len(got), "duplicate rows in gpu_frames"
    assert_frames_equal(got, want)
    assert stats["samples"] == sent.samples and stats["rejects"] == {}
    # Every one of the 23 sensors was carried end to end.
    for s in CATALOG:
        assert sum(row[s.count_column] for row in got.values()) > 0, s.name  # type: ignore[misc]


def test_faust_worker_runtime_writes_the_same_frames(base_settings: Settings) -> None:
    from tests.integration.helpers import Worker

    duration = 10.0
    params = SimParams(nodes=2, gpus=1, seed=4, start_ns=time.time_ns() - int(duration * 1e9))
    sent = SimulatorPublisher(base_settings, params, batch_size=10).backlog(duration)
    want = expected_frames(params, duration)
    worker = Worker(base_settings, "--runtime", "faust")
    try:
        stats = worker.wait_for(lambda st: st["frames_written"] == len(want))
    finally:
        code = worker.stop()
    assert code == 0
    assert stats["samples"] == sent.samples
    got, nrows = stored_frames(base_settings)
    assert nrows == len(got)
    assert_frames_equal(got, want)
