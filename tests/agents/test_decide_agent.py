"""The decision agent under Faust's test_context(): the decisions of a scenario, a rebuild after a
restart that sends no trigger twice, and a bad message that goes to the dead-letter sink."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import faust

from agents.decide.agent import DecideRuntime, install
from agents.decide.scale_view import ScaleView
from agents.detect.agent import DetectRuntime
from agents.detect.agent import install as install_detect
from agents.runtime.timebase import ManualClock
from schemas.frame_messages import encode_frame_message
from schemas.triggers import encode_trigger
from schemas.workload_samples import WorkloadSample, encode_workload_sample
from streams.decide.engine import DecisionTally
from streams.decide.rules import Decision
from streams.decide.sim import SCENARIOS, run_scenario
from streams.detect.detectors import DetectParams
from streams.detect.workload_tap import WorkloadTap
from tests.agents.test_detect_agent import History, Letters

S = 1_000_000_000
SC = SCENARIOS["sla_breach"]


def summaries() -> tuple[list[WorkloadSample], list[Decision]]:
    run = run_scenario(SC)
    tap = WorkloadTap({"gpu_util": 95.0}, lambda _m: 32e9)
    return [s for m in run.frames for s in tap.summarise(m, ())], run.decisions


class Sink:
    def __init__(self) -> None:
        self.decisions: list[Decision] = []

    async def send(self, decisions: Sequence[Decision]) -> None:
        self.decisions.extend(decisions)


class KafkaLike(Sink):
    once_per_id = True  # as KafkaTriggerSink: leaves out what the topic already holds


def make(history: History) -> tuple[Any, DecideRuntime, Sink, Letters, ManualClock]:
    app = faust.App("flopwatch-decide-test", broker="kafka://127.0.0.1:1", store="memory://", value_serializer="raw",
                    key_serializer="raw", autodiscover=False, web_enabled=False)
    topic = app.topic("flopwatch.workloads", key_type=bytes, value_type=bytes)
    sink, letters = Sink(), Letters()
    clock = ManualClock()
    runtime = DecideRuntime(SC.params, history, [sink], letters, "flopwatch.workloads", view=ScaleView(), clock=clock)
    return install(app, runtime, topic), runtime, sink, letters, clock


async def put_all(agent: Any, samples: list[WorkloadSample], clock: ManualClock) -> None:
    for s in samples:
        # The worker reads each summary 2 s after its tick ends, as in the sim.
        clock.advance(s.tick_ns + s.grid_ns + 2 * S - clock.wall_ns())
        await agent.put(value=encode_workload_sample(s), key=s.key, partition=0, timestamp=s.tick_ns / 1e9)


def test_the_agent_decides_what_the_engine_decides_in_process() -> None:
    asyncio.run(_decides_as_in_process())


async def _decides_as_in_process() -> None:
    samples, expected = summaries()
    agent, runtime, sink, _, clock = make(History([]))
    async with agent.test_context() as tc:
        await put_all(tc, samples, clock)
    assert [d.trigger for d in sink.decisions] == [d.trigger for d in expected]
    assert [d.trigger.action for d in sink.decisions if d.outcome == "taken"] == ["scale_down", "rollback"]
    # The agent's tally is the engine's kind of count, of what it sent: the same as a tally of the sink.
    sent = DecisionTally()
    sent.count(sink.decisions)
    assert runtime.stats.decisions == sent and sent.total("taken") == 2
    view = runtime.view.get("serving", "chat") if runtime.view else None
    assert view is not None and view.desired == 4 and view.decision_id == expected[-2].trigger.id


def test_a_restart_rebuilds_state_and_sends_no_trigger_twice() -> None:
    asyncio.run(_restart())


async def _restart() -> None:
    samples, expected = summaries()
    taken = [d.trigger for d in expected if d.outcome == "taken"]
    # Killed after the scale-down went out (its id is on the topic) but before the offset was committed:
    # the summaries since the last commit come again.
    cut = next(i for i, s in enumerate(samples) if s.tick_ns + S >= taken[0].ts_ns) + 1
    committed = cut - 30
    history = History([encode_workload_sample(s) for s in samples[:committed]], sent={taken[0].id: encode_trigger(taken[0])})
    agent, runtime, sink, _, clock = make(history)
    kafka = KafkaLike()
    runtime.sinks.append(kafka)
    async with agent.test_context() as tc:
        await put_all(tc, samples[committed:], clock)
    got = [d.trigger for d in kafka.decisions if d.outcome == "taken"]
    assert got == taken[1:]  # the rollback, and not the scale-down again
    # ClickHouse still gets the scale-down's row: the crash may have come between the two writes.
    assert [d.trigger for d in sink.decisions if d.outcome == "taken"] == taken
    assert got[0].reverses == taken[0].id  # the rebuilt state knew the scale-down it reverses
    assert runtime.stats.suppressed == 1 and runtime.stats.rebuilds == 1


def test_a_bad_message_goes_to_the_dead_letter_sink_and_the_agent_goes_on() -> None:
    asyncio.run(_bad())


async def _bad() -> None:
    samples, _ = summaries()
    agent, runtime, _, letters, clock = make(History([]))
    async with agent.test_context() as tc:
        await tc.put(value=b'{"v": 1, "workload": 3}', key=b"x", partition=0, timestamp=samples[0].tick_ns / 1e9)
        await put_all(tc, samples[:50], clock)
    assert letters.sent == [("missing_field", 0)] and runtime.stats.samples == 50


class Summaries:
    def __init__(self) -> None:
        self.samples: list[WorkloadSample] = []

    async def send(self, samples: Sequence[WorkloadSample], timestamp_ms: int) -> None:
        self.samples.extend(samples)


def test_the_detection_agent_publishes_each_frames_workload_summaries() -> None:
    asyncio.run(_detect_publishes())


async def _detect_publishes() -> None:
    run = run_scenario(SCENARIOS["steady"])
    app = faust.App("flopwatch-detect-tap-test", broker="kafka://127.0.0.1:1", store="memory://",
                    value_serializer="raw", key_serializer="raw", autodiscover=False, web_enabled=False)
    topic = app.topic("flopwatch.frames", key_type=bytes, value_type=bytes)
    out = Summaries()
    runtime = DetectRuntime(DetectParams(), S, History([]), [], Letters(), "flopwatch.frames", summaries=out,
                            link_bytes_s=lambda _m: 32e9)
    agent = install_detect(app, runtime, topic)
    async with agent.test_context() as tc:
        for m in run.frames[:40]:
            await tc.put(value=encode_frame_message(m), key=m.node.encode(), partition=0, timestamp=m.tick_ns / 1e9)
    tap = WorkloadTap(DetectParams().spike_thresholds, lambda _m: 32e9)
    assert out.samples == [s for m in run.frames[:40] for s in tap.summarise(m, ())]
    assert {s.node for s in out.samples} == {"node-00", "node-01"} and all(s.gpus == 2 for s in out.samples)


def test_a_revoked_partition_leaves_the_keda_view() -> None:
    asyncio.run(_revoked())


async def _revoked() -> None:
    samples, _ = summaries()
    agent, runtime, _, _, clock = make(History([]))
    async with agent.test_context() as tc:
        await put_all(tc, samples[:20], clock)
    assert runtime.view is not None and runtime.view.get("serving", "chat") is not None
    runtime.revoke([0])
    assert runtime.view.get("serving", "chat") is None


def test_a_rebuild_does_not_take_what_never_reached_the_topic() -> None:
    asyncio.run(_not_sent())


async def _not_sent() -> None:
    # Live, the scale-down was held by the age guard (the worker read it too late), so it is not on the
    # topic; a rebuild that replays the same summaries must not act as if it had been taken.
    samples, expected = summaries()
    down = next(d.trigger for d in expected if d.outcome == "taken" and d.trigger.action == "scale_down")
    history = History([encode_workload_sample(s) for s in samples if s.tick_ns + S <= down.ts_ns + 20 * S],
                      sent={})
    agent, runtime, _, _, clock = make(history)
    rest = [s for s in samples if s.tick_ns + S > down.ts_ns + 20 * S]
    async with agent.test_context() as tc:
        await put_all(tc, rest[:5], clock)
    assert runtime.view is not None
    view = runtime.view.get("serving", "chat")
    assert view is not None and view.decision_id is None  # no phantom scale-down behind the desired count
