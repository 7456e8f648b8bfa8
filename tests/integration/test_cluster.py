"""Cluster mode on a real two-node ClickHouse cluster (``deploy/clickhouse-cluster.sh``: Debian's 18.16 twice,
one shard of two replicas, Debian's ZooKeeper 3.8): the worker writes through the Distributed tables while the
replica it is connected to is SIGKILLed mid-run and brought back. Both replicas converge to exactly the frames
the simulator's input gives (nothing lost, nothing doubled, without FINAL), and Distributed reads give what
the same input gives on a single server."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from clickhouse_driver import Client

from agents.collect.simulator import SimulatorPublisher
from agents.settings import Settings
from agents.sinks.clickhouse import NativeBackend
from streams.sim.simulate import SimParams
from tests.integration.conftest import ROOT
from tests.integration.helpers import (
    Worker,
    assert_frames_equal,
    expected_frames,
    run_worker_until_idle,
    stored_frames,
)

SCRIPT = ROOT / "deploy" / "clickhouse-cluster.sh"
CLUSTER = "flopwatch"


@pytest.fixture(scope="module")
def nodes() -> Iterator[list[str]]:
    """The two nodes' native addresses; the cluster is started for this module and stopped after it."""
    out = subprocess.run([str(SCRIPT), "start"], check=True, capture_output=True, text=True, timeout=300)
    addresses = out.stdout.strip().split(",")
    assert len(addresses) == 2, out
    try:
        yield addresses
    finally:
        subprocess.run([str(SCRIPT), "stop"], check=False, timeout=180)


@pytest.fixture
def cluster_settings(native_settings: Settings, nodes: list[str]) -> Iterator[Settings]:
    """The single-server settings' topics, written by another group into another database on the cluster."""
    host, port = nodes[0].split(":")
    settings = native_settings.replace(group_id=native_settings.group_id + "c", clickhouse_host=host,
                                       clickhouse_port=int(port), clickhouse_cluster=CLUSTER,
                                       clickhouse_alt_hosts=nodes[1],
                                       clickhouse_database=native_settings.clickhouse_database + "_c")
    yield settings
    backend = NativeBackend(settings)
    backend.execute(f"DROP DATABASE IF EXISTS {settings.clickhouse_database} ON CLUSTER {CLUSTER}")
    backend.close()


def node_client(address: str, settings: Settings) -> Client:
    host, port = address.split(":")
    return Client(host=host, port=int(port), user=settings.clickhouse_user,
                  password=settings.clickhouse_password.get(), connect_timeout=5)


def replica_counts(address: str, settings: Settings) -> tuple[int, int]:
    """Rows in one replica's own table, and distinct frames among them (no FINAL: doubles would show)."""
    c = node_client(address, settings)
    try:
        rows: Any = c.execute(f"SELECT count(), uniqExact(node, gpu, ts) FROM "
                              f"{settings.clickhouse_database}.gpu_frames_local")
        return int(rows[0][0]), int(rows[0][1])
    finally:
        c.disconnect()


def presence(address: str, settings: Settings, keys: list[tuple[str, str, int]]) -> list[int]:
    c = node_client(address, settings)
    try:
        return [int(c.execute(f"SELECT count() FROM {settings.clickhouse_database}.gpu_frames_local WHERE node = "
                              f"'{n}' AND gpu = '{g}' AND ts = {ts // 1_000_000}")[0][0]) for n, g, ts in keys]
    finally:
        c.disconnect()


def test_replica_killed_mid_run_both_converge_exactly(cluster_settings: Settings, native_settings: Settings,
                                                      nodes: list[str]) -> None:
    # The failover stalls the worker's loop for a moment; with the tests' 1 s quiet bound that alone would close
    # cells early (the default is 15 s).
    settings = cluster_settings.replace(flush_interval_ms=200, source_idle_s=5.0)
    duration = 120.0
    params = SimParams(nodes=3, gpus=2, seed=301, start_ns=time.time_ns() - int(duration * 1e9))
    pub = SimulatorPublisher(settings, params, batch_size=20)
    pub.backlog(duration / 2)  # the split test_crash uses: every batch of the slow host sensors ends by then
    want = expected_frames(params, duration)

    def produce_rest() -> None:  # paced over ~25 s, so the worker writes all along the kill and the restart
        for _ in range(60):
            pub.backlog(duration / 120, 2.0)
            time.sleep(0.3)

    worker = Worker(settings)
    producing = threading.Thread(target=produce_rest)
    producing.start()  # at once, as test_crash does: the backlog's last tick is completed before it is read
    try:
        worker.wait_for(lambda st: st["frames_written"] > 0)
        subprocess.run([str(SCRIPT), "kill", "1"], check=True, timeout=30)  # the replica the worker talks to
        killed_at = worker.drain().get("frames_written", 0)
        # It goes on writing to the other replica while the first is down.
        worker.wait_for(lambda st: st["frames_written"] > killed_at + 12, timeout_s=120)
        subprocess.run([str(SCRIPT), "start-node", "1"], check=True, timeout=120)
        assert producing.is_alive(), "the replica must come back while the input still flows"
        producing.join()
        total = pub.stats.samples
        worker.wait_for(lambda st: st["samples"] >= total and st["lag"] == 0 and st["open_cells"] == 0,
                        timeout_s=180)
        assert worker.last["rejects"] == {}, "".join(worker.tail)
    finally:
        if producing.is_alive():
            producing.join()
        assert worker.stop() == 0, "".join(worker.tail)
    # A stopped live worker leaves each node's newest tick to the next one (it rebuilds it from Kafka).
    run_worker_until_idle(settings)

    # Both replicas converge: the one that was down fetches what it missed.
    deadline = time.monotonic() + 120
    while (counts := [replica_counts(a, settings) for a in nodes]) != [(len(want), len(want))] * 2:
        if time.monotonic() > deadline:
            break
        time.sleep(1.0)
    got, nrows = stored_frames(settings)  # through the Distributed table
    missing = sorted(want.keys() - got.keys())
    assert not missing, f"{len(missing)} frames missing, e.g. {missing[:4]}; replicas (rows, distinct) {counts}; " \
                        f"on each replica: {[presence(a, settings, missing[:4]) for a in nodes]}; " \
                        f"worker log:\n{''.join(worker.tail)}"
    assert_frames_equal(got, want)
    assert nrows == len(got) == len(want)
    assert counts == [(len(want), len(want))] * 2, f"replicas (rows, distinct frames) {counts}, want {len(want)}"

    # The same input into one server: the Distributed reads give its answers.
    run_worker_until_idle(native_settings)
    single, _ = stored_frames(native_settings)
    assert_frames_equal(got, single)
    query = ("SELECT node, gpu, count(), sum(cost_usd), sum(energy_j), max(flops_per_watt) FROM {db}.gpu_frames "
             "WHERE gpu != 'host' GROUP BY node, gpu ORDER BY node, gpu")
    answers = []
    for s in (settings, native_settings):
        backend = NativeBackend(s)
        try:
            answers.append(backend.rows(query.format(db=s.clickhouse_database))[1])
        finally:
            backend.close()
    assert len(answers[0]) == 6 and [r[:3] for r in answers[0]] == [r[:3] for r in answers[1]]
    for a, b in zip(answers[0], answers[1], strict=True):
        assert a[3:] == pytest.approx(b[3:], rel=1e-9)
