"""The simulator's publisher in real time: steps keep their cadence whatever a step's own work costs."""

from __future__ import annotations

import time

import pytest

from agents.collect.simulator import SimulatorPublisher
from agents.runtime.timebase import ManualClock
from agents.settings import load_settings
from streams.sim.simulate import SimParams

MS = 1_000_000
T0 = 1_796_200_000 * 1_000_000_000


class _Flushed:
    def flush(self) -> None:
        pass


def test_live_steps_keep_their_cadence_when_each_step_takes_a_third_of_one(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock(wall_ns=T0, mono_ns=0)
    pub = SimulatorPublisher(load_settings({}, kafka_bootstrap="127.0.0.1:1"), SimParams(nodes=1, gpus=1, start_ns=T0),
                             clock=clock)
    pub.producer = _Flushed()  # type: ignore[assignment]
    published: list[int] = []

    def publish(until_ns: int) -> None:
        published.append((until_ns - T0) // MS)
        clock.advance(35 * MS)  # what a step costs at 512 simulated GPUs

    monkeypatch.setattr(pub, "_publish", publish)
    monkeypatch.setattr(time, "sleep", lambda s: clock.advance(round(s * 1e9)))
    pub.live(1.0, step_s=0.1)
    # One step every 100 ms, as a collector's timer; sleeping a full step after each one's work drifted to 135 ms.
    assert published == list(range(0, 1001, 100))
