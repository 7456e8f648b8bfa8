"""The reply to an insert is lost after clickhouse-server wrote it (the connection cut between them), three
times under a live cluster: the worker's retry finds the rows stored and does not write them again. The
legacy layout of Debian's 18.16 server has no deduplication tokens, so only that check keeps the rows
single (agents.sinks.clickhouse.NativeBackend)."""

from __future__ import annotations

import time

import pytest

from agents.settings import Settings
from agents.sinks.clickhouse import open_backend
from streams.sim.simulate import SimParams
from tests.integration.helpers import live_run
from tests.integration.reply_cut import ReplyCutter
from tests.integration.test_bursts import wait_exact, whole_second

pytestmark = pytest.mark.integration


def stop_merges(settings: Settings) -> None:
    backend = open_backend(settings)
    try:
        backend.execute(f"SYSTEM STOP MERGES {settings.clickhouse_database}.gpu_frames")
    finally:
        backend.close()


def test_an_insert_whose_reply_was_lost_is_not_written_twice(native_settings: Settings) -> None:
    marker = f"INSERT INTO {native_settings.clickhouse_database}.gpu_frames".encode()
    with ReplyCutter(native_settings.clickhouse_port, marker, hold_s=1.5) as cutter:
        # Idle after 5 s, as the other fault tests: the suite's 1 s let one long loop turn around a cut insert,
        # counted as quiet, make a stream idle and its next records late (714 samples, one full CI run).
        settings = native_settings.replace(clickhouse_port=cutter.port, flush_rows=100, source_idle_s=5.0)
        with live_run(settings, SimParams(nodes=2, gpus=4, seed=67, start_ns=whole_second(0)), 25.0) as (
                pub, worker, producing):
            worker.wait_for(lambda st: st["frames_written"] > 0)
            # Merges would fold rows written twice into one and hide the fault: count() must equal uniqExact
            # at any time, not only once parts are merged.
            stop_merges(native_settings)
            for _ in range(3):
                cuts = cutter.cuts
                cutter.armed.set()
                deadline = time.monotonic() + 30
                while cutter.cuts == cuts and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert cutter.cuts == cuts + 1, "no insert into gpu_frames was cut"
                worker.wait_for_log("before its reply was lost", timeout_s=30)
                time.sleep(1.0)
            producing.join(120)
            assert not producing.is_alive()
            wait_exact(worker, native_settings, list(pub.sent), timeout_s=120)
    assert cutter.cuts == 3
