"""SIGKILL the worker mid-run, restart it: gpu_frames holds every expected frame exactly once."""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from typing import Any

import pytest

from agents.settings import Settings
from agents.simulator import SimulatorPublisher
from streams.simulate import SimParams
from tests.integration.helpers import (
    assert_frames_equal,
    expected_frames,
    run_worker_until_idle,
    stored_frames,
    wait_for_stats,
    worker_cmd,
    worker_env,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("run", range(5))
def test_sigkill_mid_run_loses_and_duplicates_nothing(any_settings: Settings, run: int) -> None:
    rng = random.Random(run)
    settings = any_settings.replace(flush_interval_ms=200)
    duration = 60.0
    params = SimParams(nodes=3, gpus=2, seed=100 + run, start_ns=time.time_ns() - int(duration * 1e9))
    pub = SimulatorPublisher(settings, params, batch_size=rng.choice([5, 20]))
    pub.backlog(duration / 2)
    want = expected_frames(params, duration)

    def produce_rest() -> None:  # paced, so the worker is busy when the kill lands
        for _ in range(15):
            pub.backlog(duration / 30, 2.0)
            time.sleep(0.2)

    worker = subprocess.Popen(worker_cmd(), env=worker_env(settings), stderr=subprocess.PIPE, text=True)
    producing = threading.Thread(target=produce_rest)
    producing.start()
    flushes_with_frames = rng.randint(1, 4)

    def kill_point(stats: dict[str, Any]) -> bool:
        nonlocal flushes_with_frames
        flushes_with_frames -= stats["frames_written"] > 0
        return flushes_with_frames == 0

    try:
        written_before_kill = wait_for_stats(worker, kill_point)["frames_written"]
        time.sleep(rng.uniform(0, 0.3))  # land anywhere in the next poll/flush cycle
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
        producing.join()
    assert worker.returncode == -signal.SIGKILL
    assert 0 < written_before_kill < len(want), "the kill must land mid-run"

    after = run_worker_until_idle(settings)
    assert after["samples"] > 0 and after["rejects"] == {}, after  # it re-read the lost cells, dead-lettered nothing

    got, nrows = stored_frames(settings)
    assert nrows == len(got), f"{nrows - len(got)} duplicate rows in gpu_frames"
    assert_frames_equal(got, want)


def test_two_workers_one_sigkilled_frames_stay_exact(native_settings: Settings) -> None:
    """A rebalance hands the dead worker's partitions (and their open cells) to the survivor."""
    settings = native_settings.replace(flush_interval_ms=200)
    duration = 40.0
    params = SimParams(nodes=6, gpus=1, seed=77, start_ns=time.time_ns() - int(duration * 1e9))
    pub = SimulatorPublisher(settings, params, batch_size=10)
    pub.backlog(duration / 2)
    want = expected_frames(params, duration)
    env = worker_env(settings)
    first = subprocess.Popen(worker_cmd(), env=env, stderr=subprocess.PIPE, text=True)
    second = subprocess.Popen(worker_cmd(), env=env, stderr=subprocess.DEVNULL, text=True)
    try:
        wait_for_stats(first, lambda st: st["frames_written"] > 0)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        pub.backlog(duration / 2)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            got, nrows = stored_frames(settings)
            if len(got) >= len(want):
                break
            time.sleep(1.0)
    finally:
        for proc in (first, second):
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
    got, nrows = stored_frames(settings)
    assert nrows == len(got), f"{nrows - len(got)} duplicate rows in gpu_frames"
    assert_frames_equal(got, want)
