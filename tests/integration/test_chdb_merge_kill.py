"""Issue 22 §3: the embedded chDB SIGKILLed while parts merge. A worker's process dies mid-``OPTIMIZE ... FINAL``
(its merged part seen half written on disk): the database opens again with every row once, and a
worker then runs on it to exact frames."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from agents.collect.simulator import SimulatorPublisher
from agents.settings import Settings
from streams.sim.simulate import SimParams
from tests.integration.conftest import ROOT
from tests.integration.helpers import assert_frames_equal, expected_frames, run_worker_until_idle, stored_frames

pytestmark = pytest.mark.integration
CHILD = [sys.executable, "-m", "tests.integration.chdb_merge_child"]


def test_sigkill_while_parts_merge_loses_nothing_and_the_worker_goes_on(base_settings: Settings) -> None:
    path, other = base_settings.chdb_path, "fw_merged"
    child = subprocess.Popen([*CHILD, "fill", path, other, "96"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=ROOT)
    try:
        assert child.stdout is not None
        filled = json.loads(child.stdout.readline() or "{}")
        assert filled.get("rows", 0) > 2_000_000, (filled, child.poll(), child.stderr)
        assert child.stdout.readline().strip() == "MERGING"  # killed at once, the merged part half written
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    assert child.returncode == -signal.SIGKILL

    checked = subprocess.run([*CHILD, "check", path, other], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert checked.returncode == 0, checked.stderr[-3000:]
    held = json.loads(checked.stdout.strip().splitlines()[-1])
    assert held["rows"] == held["distinct"] == filled["rows"], (held, filled)
    # The merge did not finish: a finished OPTIMIZE FINAL leaves one part per partition.
    assert held["parts"] > filled["partitions"], (held, filled)
    print(f"killed mid-merge; reopened: {held}")

    # The same chDB directory serves a worker next: its frames exact.
    duration = 20.0
    params = SimParams(nodes=2, gpus=2, seed=12, start_ns=(time.time_ns() // 1_000_000_000 - 25) * 1_000_000_000)
    SimulatorPublisher(base_settings, params, batch_size=20).backlog(duration)
    after = run_worker_until_idle(base_settings)
    assert after["rejects"] == {}, after
    got, nrows = stored_frames(base_settings)
    assert nrows == len(got)
    assert_frames_equal(got, expected_frames(params, duration))
