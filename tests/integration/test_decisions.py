"""Scale triggers through real Kafka: frames -> detection agent -> flopwatch.workloads -> decision agent
-> flopwatch.triggers, with the worker SIGKILLed between a scale-down and the SLA breach that rolls it
back. A read_committed consumer sees each expected trigger exactly once, and nothing else; ClickHouse
``scale_decisions`` holds every decision, taken and withheld."""

from __future__ import annotations

import dataclasses
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import jsonschema
import orjson
import pytest
from confluent_kafka import Producer

from agents.kafka.topics import Topics
from agents.settings import Settings
from agents.sinks.clickhouse import open_backend
from schemas.frame_messages import FrameMessage, encode_frame_message
from schemas.triggers import Trigger, decode_trigger, trigger_schema
from streams.decide.sim import SCENARIOS, run_scenario
from tests.agents.test_web import free_port
from tests.integration.helpers import Worker
from tests.integration.test_detection import read_topic

pytestmark = pytest.mark.integration
S = 1_000_000_000



def publish(settings: Settings, frames: list[FrameMessage]) -> None:
    """The frames, on one partition: a backlog of nodes on different partitions is read partition by
    partition, and a workload first seen that way starts from the nodes read first (README)."""
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 20})
    topic = Topics(settings.topic_prefix).frames
    for m in frames:
        p.produce(topic, key=m.node.encode(), value=encode_frame_message(m), timestamp=m.tick_ns // 1_000_000,
                  partition=0)
    assert p.flush(30) == 0


def triggers(settings: Settings, idle_s: float = 1.0) -> dict[str, list[Trigger]]:
    out: dict[str, list[Trigger]] = defaultdict(list)
    for key, raw in read_topic(settings, Topics(settings.topic_prefix).triggers, idle_s=idle_s):
        jsonschema.validate(orjson.loads(raw), trigger_schema())
        t = decode_trigger(raw)
        assert key == t.key
        out[t.idempotency_key].append(t)
    return out


def wait_for(settings: Settings, action: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(t.action == action for ts in triggers(settings).values() for t in ts):
            return
        time.sleep(1.0)
    raise AssertionError(f"no {action} trigger on the topic within {timeout_s:.0f} s")


def test_each_trigger_once_across_a_sigkill_and_the_rollback_names_the_scale_down(
        base_settings: Settings, tmp_path: Path) -> None:
    sc = SCENARIOS["sla_breach"]
    sc = dataclasses.replace(sc, start_ns=(time.time_ns() - int(sc.duration_s * S) - 60 * S) // S * S)
    run = run_scenario(sc)
    expected = [d.trigger for d in run.decisions if d.outcome == "taken"]
    assert [t.action for t in expected] == ["scale_down", "rollback"]
    # The recorded frames are minutes old: the age guard is for live data, so open it for this replay.
    policy = tmp_path / "policy.toml"
    policy.write_text("[rules]\nmax_age_s = 100000\n")
    settings = base_settings.replace(decide_policy=str(policy), web_enabled=True, web_port=free_port())
    cut = next(i for i, m in enumerate(run.frames) if m.tick_ns - sc.start_ns >= 450 * S)
    publish(settings, run.frames[:cut])  # up to 450 s: the scale-down (at 380 s), not the breach (480 s)

    worker = Worker(settings, "--runtime", "faust")
    try:
        wait_for(settings, "scale_down")
        worker.kill()  # offsets of the workloads and frames topics most likely not committed yet
    finally:
        worker.proc.kill()
    publish(settings, run.frames[cut:])
    worker = Worker(settings, "--runtime", "faust")
    try:
        wait_for(settings, "rollback")
        time.sleep(4)  # a duplicate or a spurious trigger has time to show
        seen = triggers(settings, idle_s=2.0)
        # What KEDA's metrics-api scaler reads: a GET, the number at valueLocation "desired_replicas".
        base = f"http://127.0.0.1:{settings.web_port}"
        keda = orjson.loads(urllib.request.urlopen(f"{base}/keda/serving/chat", timeout=10).read())
        metrics = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    finally:
        assert worker.stop() == 0

    assert all(len(copies) == 1 for copies in seen.values()), {k: len(v) for k, v in seen.items()}
    got = sorted((c[0] for c in seen.values()), key=lambda t: t.ts_ns)
    assert got == expected  # same ids, evidence and before-state as the engine in-process
    assert got[1].reverses == got[0].id
    assert keda["desired_replicas"] == expected[-1].desired == 4 and keda["decision_id"] == expected[-1].id
    assert 'flopwatch_decisions_total{action="rollback",gate="none",outcome="taken"} 1.0' in metrics
    backend = open_backend(settings)
    try:
        _, rows = backend.rows(f"SELECT id, outcome, action, gate FROM {settings.clickhouse_database}.scale_decisions "
                               "FINAL ORDER BY ts")
    finally:
        backend.close()
    assert [(i, o, a, g) for i, o, a, g in rows] == [
        (d.trigger.id, d.outcome, d.trigger.action, d.gate or "") for d in run.decisions]
