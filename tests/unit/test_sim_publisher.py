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


class _Sends:
    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.at: list[tuple[int, str, bytes]] = []  # wall time, topic, value

    def send(self, topic: str, value: bytes, key: object = None) -> None:
        self.at.append((self.clock.wall_ns(), topic, value))

    def poll(self) -> None:
        pass

    def flush(self) -> None:
        pass


def test_a_prepared_live_run_sends_what_live_sends_each_step_when_its_time_comes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    params = SimParams(nodes=2, gpus=2, seed=5, start_ns=T0)
    settings = load_settings({}, kafka_bootstrap="127.0.0.1:1")

    def run_on(clock: ManualClock) -> None:
        monkeypatch.setattr(time, "sleep", lambda s: clock.advance(round(s * 1e9)))

    live_clock = ManualClock(wall_ns=T0, mono_ns=0)
    live = SimulatorPublisher(settings, params, batch_size=100, clock=live_clock)
    live.producer = live_sent = _Sends(live_clock)  # type: ignore[assignment]
    run_on(live_clock)
    live.live(2.0, step_s=0.1)

    clock = ManualClock(wall_ns=T0 - 30 * MS, mono_ns=0)  # prepared 30 ms ahead of the start
    pub = SimulatorPublisher(settings, params, batch_size=100, clock=clock)
    steps = pub.prepare_live(2.0, step_s=0.1)
    assert pub.stats.samples == live.stats.samples > 0 and pub.stats.messages == live.stats.messages
    assert [t for t, _ in steps] == [T0 + k * 100 * MS for k in range(1, 21)]
    pub.producer = sent = _Sends(clock)  # type: ignore[assignment]
    run_on(clock)
    assert pub.play(steps) == 0
    # The same messages in the same order, each sent once the wall clock reached its step's end.
    assert [m[1:] for m in sent.at] == [m[1:] for m in live_sent.at]
    ends = [t for t, msgs in steps for _ in msgs]
    assert all(wall >= end for (wall, *_), end in zip(sent.at, ends, strict=True))
    clock.advance(10**9)
    assert pub.play(steps) == 19  # a second behind: every step after the first is more than a step late
