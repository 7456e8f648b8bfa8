"""SIGKILL the worker mid-run, restart it: gpu_frames holds every expected frame exactly once."""

from __future__ import annotations

import queue
import random
import signal
import subprocess
import threading
import time

import orjson
import pytest

from agents.settings import Settings
from agents.simulator import SimulatorPublisher
from streams.simulate import SimParams
from tests.integration.helpers import (
    assert_frames_equal,
    expected_frames,
    run_worker_until_idle,
    stored_frames,
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
    lines: queue.Queue[str] = queue.Queue()
    assert worker.stderr is not None
    threading.Thread(target=lambda: [lines.put(ln) for ln in worker.stderr], daemon=True).start()  # type: ignore[union-attr]
    producing = threading.Thread(target=produce_rest)
    producing.start()
    kill_after = rng.randint(1, 4)
    written_before_kill = 0
    deadline = time.monotonic() + 120
    while kill_after and time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            continue
        if line.startswith("{"):
            stats = orjson.loads(line)
            if stats["frames_written"] > 0:
                kill_after -= 1
                written_before_kill = stats["frames_written"]
    assert kill_after == 0, "the worker never flushed"
    time.sleep(rng.uniform(0, 0.3))  # land anywhere in the next poll/flush cycle
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
