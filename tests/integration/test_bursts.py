"""Bursts through real Kafka: a backlog at start, bursts on a running worker, a broker restart.

Every case must give exactly the frames of a batch computation over what was published,
with no sample dead-lettered ``late`` and no duplicate row (``count()`` equals
``uniqExact(node, gpu, ts)`` without FINAL).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from agents.collect.simulator import SimulatorPublisher
from agents.kafka.admin import ensure_topics
from agents.settings import Settings
from agents.sinks.clickhouse import open_backend
from schemas.catalog import CATALOG
from schemas.records import SampleBatch
from streams.sim.simulate import SimParams
from tests.integration.helpers import Worker, assert_frames_equal, live_run, stored_frames
from tests.integration.own_services import OwnKafka
from tests.oracle import oracle, series_of

pytestmark = pytest.mark.integration

RESTART_PORT = 19292  # its controller on 19293; test_kafka_cluster has 19092-19097, the secure broker 9192
ISSUE_SENSORS = frozenset({"gpu_util", "sm_active", "tensor_active", "fb_used", "power", "temperature"})


def whole_second(offset_s: float) -> int:
    """A start time on a tick boundary ``offset_s`` before now (bursts then end on whole seconds)."""
    return (time.time_ns() // 1_000_000_000 - int(offset_s)) * 1_000_000_000


def row_identity(settings: Settings) -> tuple[int, int]:
    backend = open_backend(settings)
    try:
        _, [(count, uniq)] = backend.rows(f"SELECT count(), uniqExact(node, gpu, ts) FROM "
                                          f"{backend.database}.gpu_frames")
    finally:
        backend.close()
    return int(count), int(uniq)


def wait_exact(worker: Worker, settings: Settings, sent: list[SampleBatch], timeout_s: float = 120.0) -> dict[str, Any]:
    """Wait until the worker has written every expected frame and holds nothing open; check them."""
    want = oracle(series_of(sent))
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        last = worker.drain()
        if last.get("frames_written", 0) >= len(want) and last.get("open_cells", 1) == 0:
            break
        assert worker.proc.poll() is None, "".join(worker.tail)
        time.sleep(0.5)
    assert last.get("rejects") == {} and last.get("late") == {}, last
    got, nrows = stored_frames(settings)
    assert_frames_equal(got, want)
    count, uniq = row_identity(settings)
    assert count == uniq == nrows == len(want), (count, uniq, nrows, len(want))
    return last


@pytest.mark.parametrize("sensors", [None, ISSUE_SENSORS], ids=["all-23-topics", "six-topics"])
def test_a_worker_started_on_a_backlog_writes_it_and_the_next_burst_exactly(
        native_settings: Settings, sensors: frozenset[str] | None) -> None:
    settings = native_settings.replace(source_idle_s=5.0)
    rng = random.Random(6)
    params = SimParams(nodes=2, gpus=2, seed=61, start_ns=whole_second(120))
    pub = SimulatorPublisher(settings, params, batch_size=20)
    sent = pub.burst(20.0, rng, sensors=sensors)
    first = len(oracle(series_of(sent)))
    worker = Worker(settings)
    try:
        # The backlog is written without waiting for more input (at most the idle bound
        # for the topics this collector never uses).
        worker.wait_for(lambda st: st["frames_written"] >= first and st["open_cells"] == 0, timeout_s=60)
        sent += pub.burst(40.0, rng, spread_s=3.0, sensors=sensors)
        wait_exact(worker, settings, sent)
    finally:
        worker.stop()


@pytest.mark.parametrize(("sensors", "batch"), [(None, 100), (ISSUE_SENSORS, 20)], ids=["all-23-topics", "issue"])
def test_bursts_on_a_worker_started_before_any_data_give_exact_frames(
        native_settings: Settings, sensors: frozenset[str] | None, batch: int) -> None:
    """Four bursts, each topic of a burst landing up to 4 s after the first, quiet between."""
    settings = native_settings.replace(source_idle_s=6.0)
    rng = random.Random(batch)
    params = SimParams(nodes=3, gpus=2, seed=62, start_ns=whole_second(300))
    pub = SimulatorPublisher(settings, params, batch_size=batch)
    worker = Worker(settings)
    sent: list[SampleBatch] = []
    try:
        worker.wait_for_log("assigned partitions [")
        time.sleep(2.0)
        for seconds in (20.0, 40.0, 7.0, 30.0):
            sent += pub.burst(seconds, rng, spread_s=4.0, sensors=sensors)
            time.sleep(rng.uniform(0.0, 8.0))  # sometimes longer than the idle bound
        wait_exact(worker, settings, sent)
    finally:
        worker.stop()


def test_a_broker_restart_while_collectors_produce_loses_nothing_and_makes_nothing_late(
        native_settings: Settings, tmp_path: Path) -> None:
    """The broker stops for 30 s; the simulator keeps producing live (its client buffers). The broker is the
    test's own (the tests beside it use the session's)."""
    broker = OwnKafka(tmp_path / "kafka", RESTART_PORT)
    broker.start()
    try:
        assert broker.bootstrap == f"127.0.0.1:{RESTART_PORT}", broker.bootstrap  # not the session's broker
        settings = native_settings.replace(source_idle_s=15.0, kafka_bootstrap=broker.bootstrap)
        ensure_topics(settings)
        params = SimParams(nodes=2, gpus=2, seed=63, start_ns=whole_second(0))
        with live_run(settings, params, 70.0) as (pub, worker, producing):
            worker.wait_for(lambda st: st["frames_written"] > 0)
            time.sleep(5.0)
            broker.stop()
            time.sleep(30.0)
            broker.start()
            producing.join(120)
            assert not producing.is_alive()
            last = wait_exact(worker, settings, list(pub.sent), timeout_s=180)
            assert last["samples"] == pub.stats.samples
    finally:
        broker.close()


def test_a_backlog_past_the_open_cells_bound_is_read_in_step_and_loses_nothing(native_settings: Settings) -> None:
    """Ten minutes of the 15 clocked topics every node sends (10 Hz and 1 Hz; 314,400 samples) against a bound of
    40,000 open samples a partition, 200 samples a poll: read as it comes, the 1 Hz topics run ahead of the 10 Hz
    ones and the bound closes cells under their stragglers (116,368 samples late when tried); read in step
    (``streams.align.pacing``) every frame is exact and nothing is late."""
    settings = native_settings.replace(max_open_samples=40_000, max_poll_records=20)
    params = SimParams(nodes=2, gpus=2, seed=63, start_ns=whole_second(900))
    sensors = frozenset(c.name for c in CATALOG if c.cadence == "clock" and not c.name.startswith(("queue", "request")))
    sent = SimulatorPublisher(settings, params, batch_size=10).burst(600.0, random.Random(63), sensors=sensors)
    worker = Worker(settings)
    try:
        last = wait_exact(worker, settings, sent)
    finally:
        worker.stop()
    assert last["paces"] > 0, last
