"""The detection agent under Faust's test_context(): alerts, replayed duplicates, rebuild after a restart,
and a bad message that goes to the dead-letter sink while the agent goes on."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faust
import numpy as np
import orjson

from agents.detect.agent import DetectRuntime, install
from agents.runtime.give_way import AgentQueues
from agents.runtime.partition_runtime import REPLAY_TURN
from schemas.alerts import Alert, Cause, encode_alert
from schemas.frame_messages import FrameMessage, GpuFrame, encode_frame_message
from schemas.records import Reject
from streams.detect.detectors import DRIFT_RULE, DetectParams

GRID = 1_000_000_000
T0 = 1_796_200_000 * GRID
LABELS = {"namespace": "ml", "workload": "llm", "pod": "llm-0"}


def frames(n: int, drop_at: int, drop_len: int, depth: float = 0.3, seed: int = 1) -> list[bytes]:
    """One node, one GPU: FLOPS/W with 1% noise, dropping by ``depth`` for ``drop_len`` ticks."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        level = 1.0 - (depth if drop_at <= i < drop_at + drop_len else 0.0)
        fpw = 1.0e12 * level * (1 + 0.01 * rng.standard_normal())
        g = GpuFrame("0", LABELS, {"power": 500.0}, {"flops_per_watt": fpw, "gpu_util_p99": 60.0}, "")
        out.append(encode_frame_message(FrameMessage("node-1", T0 + i * GRID, GRID, (g,))))
    return out


class Sink:
    once_per_id = True  # as KafkaAlertSink: left out of what the topic already holds

    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    async def send(self, alerts: Sequence[Alert]) -> None:
        self.alerts.extend(alerts)


class History:
    def __init__(self, messages: list[bytes], sent: dict[str, bytes] | None = None) -> None:
        self.messages = messages
        self.on_topic = sent or {}
        self.asked: list[tuple[int, int, int]] = []

    async def sent(self, since_wall_ms: int) -> dict[str, bytes]:
        return dict(self.on_topic)

    async def read(self, partition: int, since_ms: int, until_offset: int) -> Sequence[bytes]:
        # The test channel numbers offsets from 0 whatever came before: what precedes the first
        # message is what this history was given.
        self.asked.append((partition, since_ms, until_offset))
        return self.messages


class Letters:
    def __init__(self) -> None:
        self.sent: list[tuple[str, int]] = []
        self.closed = False

    def send(self, reject: Reject, value: bytes | None, key: bytes | None, topic: str, partition: int, offset: int,
             headers: Any = (), indices: list[int] | None = None) -> None:
        self.sent.append((reject.reason.value, offset))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def make(history: History, queues: AgentQueues | None = None) -> tuple[Any, DetectRuntime, Sink, Letters]:
    app = faust.App("flopwatch-agent-test", broker="kafka://127.0.0.1:1", store="memory://", value_serializer="raw",
                    key_serializer="raw", autodiscover=False, web_enabled=False)
    topic = app.topic("flopwatch.frames", key_type=bytes, value_type=bytes)
    sink, letters = Sink(), Letters()
    runtime = DetectRuntime(DetectParams(), GRID, history, [sink], letters, "flopwatch.frames", replay_s=180)
    return install(app, runtime, topic, queues), runtime, sink, letters


def on_topic(*alerts: Alert) -> dict[str, bytes]:
    """What the alerts topic holds after ``alerts`` were sent, as the rebuild reads it."""
    return {a.message_id: encode_alert(a) for a in alerts}


async def put_all(agent: Any, messages: list[bytes]) -> None:
    for i, m in enumerate(messages):
        await agent.put(value=m, key=b"node-1", partition=0, timestamp=(T0 + i * GRID) / 1e9)


def test_a_held_drop_fires_once_and_resolves_once() -> None:
    asyncio.run(_a_held_drop_fires_once_and_resolves_once())


async def _a_held_drop_fires_once_and_resolves_once() -> None:
    agent, runtime, sink, _ = make(History([]))
    async with agent.test_context() as tc:
        await put_all(tc, frames(120, drop_at=70, drop_len=12))
        # The agent yields each message's alerts: what Faust saw is what the sink got.
        assert len(tc.results) == 120
        assert [a for r in tc.results.values() for a in r] == sink.alerts
    drift = [a for a in sink.alerts if a.rule == DRIFT_RULE]
    assert [a.state for a in drift] == ["firing", "resolved"]
    assert drift[0].onset_ts_ns == T0 + 70 * GRID and drift[0].id == drift[1].id
    assert drift[0].ts_ns == T0 + 73 * GRID  # end of the third tick below: held for 3 s
    assert drift[0].workload == "llm" and drift[0].namespace == "ml"
    assert runtime.stats.frames == 120 and runtime.stats.alerts.total == len(sink.alerts)


def test_short_dips_and_replayed_duplicates_do_not_alert() -> None:
    asyncio.run(_short_dips_and_replayed_duplicates_do_not_alert())


async def _short_dips_and_replayed_duplicates_do_not_alert() -> None:
    agent, _, sink, _ = make(History([]))
    msgs = frames(100, drop_at=70, drop_len=2)
    async with agent.test_context() as tc:
        await put_all(tc, msgs[:80] + msgs[60:80] + msgs[80:])  # a redelivered stretch
    assert [a for a in sink.alerts if a.rule == DRIFT_RULE] == []


def test_a_restarted_agent_rebuilds_state_and_sends_the_same_ids() -> None:
    asyncio.run(_a_restarted_agent_rebuilds_state_and_sends_the_same_ids())


async def _a_restarted_agent_rebuilds_state_and_sends_the_same_ids() -> None:
    msgs = frames(150, drop_at=90, drop_len=30)
    agent, _, first, _ = make(History([]))
    async with agent.test_context() as tc:
        await put_all(tc, msgs)
    cut = 100  # the crash: offsets up to 100 were committed, the drop had already fired
    history = History(msgs[:cut])
    agent2, runtime2, second, _ = make(history)
    async with agent2.test_context() as tc:
        for i, m in enumerate(msgs[cut:], start=cut):
            await tc.put(value=m, key=b"node-1", partition=0, timestamp=(T0 + i * GRID) / 1e9)
    assert runtime2.stats.rebuilds == 1 and runtime2.stats.replayed == cut
    assert history.asked == [(0, (T0 + cut * GRID) // 1_000_000 - 180_000, 0)]
    before = {a.message_id for a in first.alerts if a.ts_ns <= T0 + cut * GRID}
    after = [a for a in first.alerts if a.message_id not in before]
    assert [a.message_id for a in second.alerts] == [a.message_id for a in after]


def test_a_long_rebuild_lets_the_rest_of_the_worker_run() -> None:
    asyncio.run(_a_long_rebuild_lets_the_rest_of_the_worker_run())


async def _a_long_rebuild_lets_the_rest_of_the_worker_run() -> None:
    # The group heartbeats, the ingest and the web page share the agent's event loop: a replay must yield.
    msgs = frames(300, drop_at=400, drop_len=0)
    agent, runtime, _, _ = make(History(msgs[:-1]))
    turns = 0
    seen_at_replay: list[int] = []

    async def ticker() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    replay_one = runtime._replay_one

    def replay_counted(partition: int, state: Any, raw: bytes, sent: dict[str, bytes]) -> None:
        seen_at_replay.append(turns)
        replay_one(partition, state, raw, sent)

    runtime._replay_one = replay_counted  # type: ignore[method-assign]
    ticking = asyncio.create_task(ticker())
    try:
        async with agent.test_context() as tc:
            await tc.put(value=msgs[-1], key=b"node-1", partition=0, timestamp=(T0 + 299 * GRID) / 1e9)
    finally:
        ticking.cancel()
    assert len(seen_at_replay) == 299 and runtime.stats.rebuilds == 1
    # Other coroutines ran between the replay's first and last message, once per REPLAY_TURN messages.
    assert seen_at_replay[-1] - seen_at_replay[0] >= 299 // REPLAY_TURN


def test_a_bad_message_goes_to_the_dead_letter_sink_and_the_agent_goes_on() -> None:
    asyncio.run(_a_bad_message_goes_to_the_dead_letter_sink_and_the_agent_goes_on())


async def _a_bad_message_goes_to_the_dead_letter_sink_and_the_agent_goes_on() -> None:
    agent, runtime, _sink, letters = make(History([]))
    msgs = frames(10, drop_at=99, drop_len=0)
    async with agent.test_context() as tc:
        await put_all(tc, [*msgs[:5], b"{not json", *msgs[5:]])
    assert [r for r, _ in letters.sent] == ["malformed_json"]
    assert runtime.stats.frames == 10 and runtime.stats.rejects == 1


def test_alerts_already_on_the_topic_before_a_crash_are_not_sent_again() -> None:
    asyncio.run(_alerts_already_on_the_topic_are_not_sent_again())


async def _alerts_already_on_the_topic_are_not_sent_again() -> None:
    msgs = frames(150, drop_at=90, drop_len=30)
    agent, _, first, _ = make(History([]))
    async with agent.test_context() as tc:
        await put_all(tc, msgs)
    cut = 92  # committed up to tick 92; the firing (at tick 92's end... 93) was sent, then the crash
    fired = [a for a in first.alerts if a.state == "firing"]
    assert fired
    agent2, runtime2, second, _ = make(History(msgs[:cut], sent=on_topic(fired[0])))
    rows = Rows()
    runtime2.sinks.append(rows)
    async with agent2.test_context() as tc:
        for i, m in enumerate(msgs[cut:], start=cut):
            await tc.put(value=m, key=b"node-1", partition=0, timestamp=(T0 + i * GRID) / 1e9)
    assert fired[0].message_id not in {a.message_id for a in second.alerts}
    assert [a.state for a in second.alerts if a.id == fired[0].id] == ["resolved"]
    assert runtime2.stats.suppressed == 1
    # ClickHouse still gets the suppressed firing: the crash may have come between the two sends.
    assert fired[0].message_id in {a.message_id for a in rows.alerts}


class Rows(Sink):
    once_per_id = False  # as the detections ClickHouseRows sink: every message, repeats collapse in the table


class FlakySink(Sink):
    """Fails its first ``failures`` sends (a ClickHouse or broker hiccup)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def send(self, alerts: Sequence[Alert]) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("simulated outage")
        await super().send(alerts)


class FlakyHistory(History):
    def __init__(self, failures: int) -> None:
        super().__init__([])
        self.failures = failures

    async def read(self, partition: int, since_ms: int, until_offset: int) -> Sequence[bytes]:
        if self.failures:
            self.failures -= 1
            raise TimeoutError("simulated slow broker")
        return await super().read(partition, since_ms, until_offset)


def test_a_failing_sink_or_rebuild_is_retried_and_the_agent_goes_on() -> None:
    asyncio.run(_a_failing_sink_or_rebuild_is_retried())


async def _a_failing_sink_or_rebuild_is_retried() -> None:
    app = faust.App("flopwatch-agent-test-flaky", broker="kafka://127.0.0.1:1", store="memory://",
                    value_serializer="raw", key_serializer="raw", autodiscover=False, web_enabled=False)
    topic = app.topic("flopwatch.frames", key_type=bytes, value_type=bytes)
    flaky, steady = FlakySink(failures=2), Sink()
    runtime = DetectRuntime(DetectParams(), GRID, FlakyHistory(failures=1), [flaky, steady], Letters(),
                            "flopwatch.frames")
    agent = install(app, runtime, topic)
    async with agent.test_context() as tc:
        await put_all(tc, frames(100, drop_at=70, drop_len=12))
    assert [a.state for a in flaky.alerts] == ["firing", "resolved"] == [a.state for a in steady.alerts]
    assert runtime.stats.frames == 100 and runtime.stats.errors == 3 and runtime.stats.rebuilds == 1


def test_closing_the_runtime_closes_its_dead_letter_producer() -> None:
    # The demo stops its local broker right after the run: a producer left open would log
    # "Connection refused" under the summary once a second.
    _, runtime, _, letters = make(History([]))
    assert not letters.closed
    runtime.close()
    assert letters.closed


def idle_frames(n: int) -> list[bytes]:
    """One node, one GPU a pod holds and does nothing with, at 3.6 USD per hour."""
    g = GpuFrame("0", LABELS, {"gpu_util": 0.0, "sm_active": 0.0, "power": 80.0},
                 {"idle": 1.0, "cost_usd": 0.001, "gpu_util_p99": 0.0}, "")
    return [encode_frame_message(FrameMessage("node-1", T0 + i * GRID, GRID, (g,))) for i in range(n)]


def test_a_leak_alert_keeps_its_id_across_a_restart() -> None:
    asyncio.run(_a_leak_alert_keeps_its_id_across_a_restart())


async def _a_leak_alert_keeps_its_id_across_a_restart() -> None:
    from streams.leaks.params import IdleAllocatedParams, LeakParams

    params = DetectParams(leaks=LeakParams(idle_allocated=IdleAllocatedParams(idle_s=60.0)))
    msgs = idle_frames(150)

    def build(history: History) -> tuple[Any, DetectRuntime, Sink]:
        app = faust.App("flopwatch-leak-test", broker="kafka://127.0.0.1:1", store="memory://",
                        value_serializer="raw", key_serializer="raw", autodiscover=False, web_enabled=False)
        topic = app.topic("flopwatch.frames", key_type=bytes, value_type=bytes)
        sink = Sink()
        rt = DetectRuntime(params, GRID, history, [sink], Letters(), "flopwatch.frames", replay_s=180)
        return install(app, rt, topic), rt, sink

    agent, _, first = build(History([]))
    async with agent.test_context() as tc:
        await put_all(tc, msgs[:100])
    [fired] = [a for a in first.alerts if a.rule == "idle_allocated"]
    assert fired.onset_ts_ns == T0 and fired.ts_ns == T0 + 60 * GRID
    assert fired.evidence["cost_usd_per_h"] == 3.6 and fired.workload == "llm"
    # A restart at offset 100: the rebuild replays the idle stretch, so the episode keeps its onset and id,
    # and a pod that gets to work resolves the very alert that fired before the crash.
    agent2, _, second = build(History(msgs[:100], sent=on_topic(fired)))
    busy = GpuFrame("0", LABELS, {"gpu_util": 70.0, "sm_active": 0.7, "power": 500.0},
                    {"idle": 0.0, "cost_usd": 0.001, "gpu_util_p99": 70.0}, "")
    tail = [*msgs[100:120], encode_frame_message(FrameMessage("node-1", T0 + 120 * GRID, GRID, (busy,)))]
    async with agent2.test_context() as tc:
        for i, m in enumerate(tail, start=100):
            await tc.put(value=m, key=b"node-1", partition=0, timestamp=(T0 + i * GRID) / 1e9)
    assert [(a.id, a.state) for a in second.alerts if a.rule == "idle_allocated"] == [(fired.id, "resolved")]


def test_an_attribution_is_sent_once_across_a_restart() -> None:
    asyncio.run(_an_attribution_is_sent_once_across_a_restart())


async def _an_attribution_is_sent_once_across_a_restart() -> None:
    from agents.runtime.history import _message_id
    from tests.unit.test_attribution import stall_frames

    msgs = [encode_frame_message(m) for m in stall_frames(300)]
    agent, _, first, _ = make(History([]))
    async with agent.test_context() as tc:
        await put_all(tc, msgs[:260])
    stall = [a for a in first.alerts if a.rule == "pipeline_stall"]
    assert [bool(a.causes) for a in stall] == [False, True] and stall[1].causes[0].cause == "disk_write"
    # What the restarted agent reads back from the alerts topic names the attribution as its own message.
    sent = {_message_id(encode_alert(a)): encode_alert(a) for a in first.alerts}
    assert {a.message_id for a in first.alerts} == set(sent)
    agent2, _, second, _ = make(History(msgs[:260], sent=sent))
    async with agent2.test_context() as tc:
        for i, m in enumerate(msgs[260:], start=260):
            await tc.put(value=m, key=b"node-1", partition=0, timestamp=(T0 + i * GRID) / 1e9)
    assert not [a for a in second.alerts if a.rule == "pipeline_stall" and a.state == "firing"]


def test_a_restart_keeps_the_attribution_consumers_were_given() -> None:
    asyncio.run(_a_restart_keeps_the_attribution_consumers_were_given())


async def _a_restart_keeps_the_attribution_consumers_were_given() -> None:
    from tests.unit.test_attribution import stall_frames

    msgs = [encode_frame_message(m) for m in stall_frames(300)]
    agent, _, first, _ = make(History([]))
    made_at: dict[str, int] = {}
    async with agent.test_context() as tc:
        for i, m in enumerate(msgs):
            await tc.put(value=m, key=b"node-1", partition=0, timestamp=(T0 + i * GRID) / 1e9)
            for a in first.alerts:
                made_at.setdefault(a.message_id, i)
    [firing, attribution] = [a for a in first.alerts if a.rule == "pipeline_stall" and a.state == "firing"]
    assert attribution.causes and made_at[attribution.message_id] > made_at[firing.message_id]
    # Before the crash the attribution went out naming an event the restarted agent has not read back yet
    # (the events topic is another consumer's): made again, its causes differ from what consumers got.
    given = attribution.attributed((Cause("Scheduled", 0.9, {"source": "event"}), *attribution.causes))
    for cut, how in ((made_at[attribution.message_id] - 1, "made again live"),
                     (made_at[attribution.message_id] + 1, "made again in the replay")):
        agent2, runtime2, second, _ = make(History(msgs[:cut], sent=on_topic(firing, given)))
        rows = Rows()
        runtime2.sinks.append(rows)
        async with agent2.test_context() as tc:
            for i, m in enumerate(msgs[cut:], start=cut):
                await tc.put(value=m, key=b"node-1", partition=0, timestamp=(T0 + i * GRID) / 1e9)
        assert attribution.message_id not in {a.message_id for a in second.alerts}, how
        # ClickHouse gets the topic's copy, and the episode's resolution repeats the causes consumers got.
        stored = [a for a in rows.alerts if a.message_id == attribution.message_id]
        assert all(a.causes == given.causes for a in stored) and (stored or how.endswith("replay")), how
        resolved = [a for a in second.alerts if a.id == firing.id and a.state == "resolved"]
        assert [a.causes for a in resolved] in ([], [given.causes]), how


def test_kubernetes_events_feed_the_attribution_book() -> None:
    from agents.detect.events import feed
    from streams.attribution.context import EventBook

    book = EventBook()
    raw = orjson.dumps({"v": 1, "node": "node-1", "ts_ns": T0, "type": "Warning", "reason": "OOMKilled",
                        "kind": "Pod", "namespace": "ml", "pod": "llm-0", "gpus": ["0"], "message": "killed"})
    assert feed(book, raw) and feed(book, raw) and not feed(book, b"{nope")
    [h] = book.around("node-1", T0 - 1, T0 + 1)  # a redelivered event is one event
    assert (h.reason, h.pod, h.gpus, h.type) == ("OOMKilled", "llm-0", ("0",), "Warning")


def test_a_detection_runtime_loads_river_and_scipy_when_it_starts() -> None:
    # The settings no longer import them (every CLI command starts in ~0.4 s); a worker that detects pays
    # the ~0.8 s at start instead of holding up its first frame, or its first alert's attribution.
    code = ("import sys; from agents.detect.agent import DetectRuntime; from streams.detect.detectors import "
            "DetectParams; before = {'river.drift', 'scipy.stats'} & set(sys.modules); "
            "DetectRuntime(DetectParams(), 10**9, None, [], None, 't'); "
            "print(sorted(before), sorted({'river.drift', 'scipy.stats', 'scipy.special'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         cwd=Path(__file__).parents[2])
    assert out.stdout.strip() == "[] ['river.drift', 'scipy.special', 'scipy.stats']"


def test_the_ingest_gives_way_until_the_detection_agent_has_taken_a_ticks_queued_frames() -> None:
    asyncio.run(_the_ingest_gives_way_until_the_detection_agent_has_taken_a_ticks_queued_frames())


async def _the_ingest_gives_way_until_the_detection_agent_has_taken_a_ticks_queued_frames() -> None:
    queues = AgentQueues()
    agent, runtime, _, _ = make(History([]), queues)
    async with agent.test_context() as tc:
        await tc.put(value=frames(1, drop_at=5, drop_len=1)[0], key=b"node-1", partition=0, timestamp=T0 / 1e9)
        msgs = frames(33, drop_at=50, drop_len=1)[1:]
        for i, m in enumerate(msgs, start=1):  # 32 frames delivered at once, as a fetch delivers a tick's frames
            await tc.put(value=m, key=b"node-1", partition=0, timestamp=(T0 + i * GRID) / 1e9, wait=False)
        assert queues.pending() == 32  # the queue watched is the one the agent's Faust stream reads
        await queues.give_way()
        assert queues.pending() == 0 and runtime.stats.frames == 33
    assert queues.pending() == 0  # the stopped agent's queue is no longer counted
