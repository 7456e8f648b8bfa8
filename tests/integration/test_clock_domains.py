"""Samples stamped by skewed, drifting GPU clocks land on the right UTC grid cells."""

from __future__ import annotations

import time

import pytest

from agents.collect.simulator import SimulatorPublisher
from agents.settings import Settings
from agents.sinks.clickhouse import open_backend
from schemas.catalog import CATALOG
from streams.sim.simulate import SimParams
from tests.integration.helpers import expected_frames, run_worker_until_idle, sample_total, stored_frames

pytestmark = pytest.mark.integration


def test_skewed_domains_are_corrected_onto_utc(base_settings: Settings) -> None:
    duration = 20.0
    params = SimParams(nodes=2, gpus=1, seed=21, start_ns=time.time_ns() - int(duration * 1e9))
    pub = SimulatorPublisher(base_settings, params, batch_size=10, clock_domains=True)
    offsets = [abs(c.offset_ns) for c in pub.clocks.values()]
    assert max(offsets) > 200_000_000  # skewed by far more than a cell: uncorrected, nothing would match
    sent = pub.backlog(duration)

    stats = run_worker_until_idle(base_settings)
    assert stats["rejects"] == {} and stats["samples"] == sent.samples and stats["beacons"] > 0

    want = expected_frames(params, duration)
    got, nrows = stored_frames(base_settings)
    assert nrows == len(got) and got.keys() == want.keys()
    cells = [(key, s.count_column) for key in want for s in CATALOG]
    same = sum(got[k][c] == want[k][c] for k, c in cells)
    # A corrected time is off by microseconds, but the simulator puts a tenth of its samples
    # within 2 ms of a cell edge: a handful may change cells. Every sample is still counted once.
    assert same >= 0.995 * len(cells), f"{len(cells) - same} of {len(cells)} cells differ"
    for s in CATALOG:
        assert sample_total(got, s.count_column) == sample_total(want, s.count_column)
    # Frames say how sure their alignment is: GPU rows used corrected times, host rows did not.
    backend = open_backend(base_settings)
    try:
        _, rows = backend.rows(f"SELECT gpu = 'host', min(clock_uncertainty_us), max(clock_uncertainty_us) "
                               f"FROM {base_settings.clickhouse_database}.gpu_frames GROUP BY gpu = 'host'")
    finally:
        backend.close()
    by_kind = {bool(h): (float(lo), float(hi)) for h, lo, hi in rows}
    assert by_kind[True] == (0.0, 0.0)
    assert 0.0 < by_kind[False][1] <= 1000.0  # a round trip is at most 2 ms: at most 1 ms either way


def test_sigkill_with_clock_domains_loses_and_duplicates_nothing(base_settings: Settings) -> None:
    """Held samples and the beacons behind their fits are replayed after a crash."""
    from tests.integration.helpers import Worker

    settings = base_settings.replace(flush_interval_ms=200)
    duration = 40.0
    # The first half ends on a tick boundary: the killed worker may have written its last
    # cells after the idle bound (its only frames can be those), and the second half must
    # not fall in them (a producer pausing mid-tick for longer than the bound gets late).
    start = time.time_ns() // 1_000_000_000 * 1_000_000_000 - int(duration * 1e9)
    params = SimParams(nodes=3, gpus=1, seed=5, start_ns=start)
    pub = SimulatorPublisher(settings, params, batch_size=5, clock_domains=True)
    pub.backlog(duration / 2)
    worker = Worker(settings)
    try:
        worker.wait_for(lambda st: st["frames_written"] > 0)
    finally:
        worker.kill()
    sent = pub.backlog(duration / 2)
    stats = run_worker_until_idle(settings)
    assert stats["rejects"] == {} and stats["samples"] > 0, stats

    want = expected_frames(params, duration)
    got, nrows = stored_frames(settings)
    assert nrows == len(got), f"{nrows - len(got)} duplicate rows"
    assert got.keys() == want.keys()
    for s in CATALOG:  # every sample exactly once, across the crash
        assert sample_total(got, s.count_column) == sample_total(want, s.count_column)
    assert sent.samples > 0


def test_a_clock_reboot_mid_run_places_both_epochs(base_settings: Settings) -> None:
    """Every node's GPU clock reboots (restarts from a few seconds) mid-run: samples from
    before and after, stragglers included, still land on their UTC cells."""
    duration = 30.0
    params = SimParams(nodes=2, gpus=1, seed=23, start_ns=time.time_ns() - int(duration * 1e9))
    pub = SimulatorPublisher(base_settings, params, batch_size=10, clock_domains=True, clock_reset_s=12.0)
    for clock in pub.clocks.values():
        (reset,) = clock.resets_ns
        assert clock.to_domain(reset + 1) < clock.to_domain(reset - 1) - 1_000_000 * 1_000_000_000  # a reboot
    sent = pub.backlog(duration)

    stats = run_worker_until_idle(base_settings)
    assert stats["rejects"] == {} and stats["samples"] == sent.samples

    want = expected_frames(params, duration)
    got, nrows = stored_frames(base_settings)
    assert nrows == len(got) and got.keys() == want.keys()
    for s in CATALOG:
        assert sample_total(got, s.count_column) == sample_total(want, s.count_column), s.name
    cells = [(key, s.count_column) for key in want for s in CATALOG]
    same = sum(got[k][c] == want[k][c] for k, c in cells)
    assert same >= 0.99 * len(cells), f"{len(cells) - same} of {len(cells)} cells differ"
