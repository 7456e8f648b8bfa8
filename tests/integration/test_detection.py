"""Frames on flopwatch.frames and alerts from the Faust detection agent, through real Kafka and ClickHouse.

A scenario schedules one efficiency drop, a dip too short to alert and a 200 ms spike;
the worker (Faust runtime: ingest service + detection agent) is SIGKILLed mid-run and
restarted. Each expected alert message is on the topic exactly once, and nothing else;
ClickHouse ``detections`` holds the same messages.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import jsonschema
import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from agents.collect.simulator import SimulatorPublisher
from agents.kafka.topics import Topics, confluent_config
from agents.settings import Settings
from agents.sinks.clickhouse import open_backend
from schemas.alerts import alert_schema, decode_alert
from schemas.frame_messages import decode_frame_message, frame_schema
from streams.sim.scenario import parse_scenario
from streams.sim.simulate import SimParams
from tests.integration.helpers import Worker, run_worker_until_idle, stored_frames

pytestmark = pytest.mark.integration
S = 1_000_000_000
SCENARIO = """
version = 1
[[event]]
kind = "efficiency_drop"
node = "node-00"
gpu = "0"
start_s = 40.0
duration_s = 10.0
depth = 0.3
[[event]]
kind = "efficiency_drop"
node = "node-01"
gpu = "0"
start_s = 45.0
duration_s = 1.5
depth = 0.3
[[event]]
kind = "spike"
node = "node-00"
gpu = "1"
start_s = 30.2
level = 0.99
# Look-alikes: the load alone moves and power follows; FLOPS/W falls, no drift.
[[event]]
kind = "load_change"
node = "node-01"
gpu = "1"
start_s = 25.0
duration_s = 50.0
profile = "square"
level = 0.3
period_s = 20.0
[[event]]
kind = "load_change"
node = "node-00"
gpu = "1"
start_s = 50.0
duration_s = 29.0
profile = "step"
level = 0.4
"""


def read_topic(settings: Settings, topic: str, idle_s: float = 3.0) -> list[tuple[bytes | None, bytes]]:
    """Everything on ``topic`` (read_committed), until nothing new came for ``idle_s``."""
    return [(key, value) for _, key, value in read_partitions(settings, topic, idle_s)]


def read_partitions(settings: Settings, topic: str, idle_s: float = 3.0) -> list[tuple[int, bytes | None, bytes]]:
    """Everything on ``topic`` (read_committed) as (partition, key, value), each partition in its order."""
    c = _reader(settings)
    meta = c.list_topics(topic, timeout=10)
    c.assign([TopicPartition(topic, p, 0) for p in meta.topics[topic].partitions])
    out: list[tuple[int, bytes | None, bytes]] = []
    last = time.monotonic()
    while time.monotonic() - last < idle_s:
        m = c.poll(0.2)
        if m is None or m.error():
            continue
        out.append((m.partition() or 0, m.key(), m.value() or b""))
        last = time.monotonic()
    c.close()
    return out


def _reader(settings: Settings) -> Consumer:
    """A read_committed consumer of its own group, from the earliest offset, committing nothing."""
    return Consumer(confluent_config(settings) | {"group.id": f"read-{time.time_ns()}", "auto.offset.reset": "earliest",
                                                  "enable.auto.commit": False, "isolation.level": "read_committed"})


def read_to_end(settings: Settings, topics: list[str], timeout_s: float = 60.0) -> dict[str, list[bytes]]:
    """Every message on ``topics`` (read_committed) up to each partition's end as it was when called, with one
    consumer: for a run whose producers have stopped, where waiting for quiet per topic would cost seconds each."""
    c = _reader(settings)
    ends: dict[tuple[str, int], int] = {}
    for topic in topics:
        for p in c.list_topics(topic, timeout=10).topics[topic].partitions:
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                ends[(topic, p)] = high
    c.assign([TopicPartition(t, p, 0) for t, p in ends])
    out: dict[str, list[bytes]] = {t: [] for t in topics}
    deadline = time.monotonic() + timeout_s
    while ends:
        assert time.monotonic() < deadline, f"partitions not read to their end in {timeout_s:.0f} s: {sorted(ends)}"
        m = c.poll(0.2)
        if m is not None and not m.error():
            out[m.topic() or ""].append(m.value() or b"")
        # Transaction markers take offsets without being delivered: the position, not the last message, says done.
        for tp in c.position([TopicPartition(t, p) for t, p in ends]):
            if tp.offset >= ends[(tp.topic, tp.partition)]:
                del ends[(tp.topic, tp.partition)]
    c.close()
    return out


def test_frames_topic_carries_every_stored_frame_with_derived_columns(base_settings: Settings) -> None:
    duration = 15.0
    params = SimParams(nodes=2, gpus=2, seed=5, start_ns=time.time_ns() - int(duration * S), steady=True)
    SimulatorPublisher(base_settings, params, batch_size=50).backlog(duration)
    run_worker_until_idle(base_settings)
    stored, _ = stored_frames(base_settings)
    msgs = read_topic(base_settings, Topics(base_settings.topic_prefix).frames)
    validator = jsonschema.Draft202012Validator(frame_schema())
    seen: dict[tuple[str, str, int], dict[str, float | None]] = {}
    for key, raw in msgs:
        validator.validate(orjson.loads(raw))
        m = decode_frame_message(raw)
        assert key == m.node.encode()
        for g in m.gpus:
            seen[(m.node, g.gpu, m.tick_ns)] = dict(g.derived)
    assert set(seen) == set(stored)  # every frame in ClickHouse is on the topic, and no other
    gpu_rows = [d for (_, gpu, _), d in seen.items() if gpu != "host"]
    assert all(d["tflops"] is not None and d["cost_usd"] is not None for d in gpu_rows)
    backend = open_backend(base_settings)
    try:
        _, rows = backend.rows(f"SELECT count(), countIf(tflops IS NULL), countIf(derive_note = 'host'), "
                               f"median(flops_per_watt), max(cost_usd) FROM {base_settings.clickhouse_database}.gpu_frames")
    finally:
        backend.close()
    total, null_tflops, host_rows, fpw, cost = rows[0]
    assert null_tflops == host_rows > 0 and total > host_rows
    assert 3e11 < float(fpw) < 3e12 and 0 < float(cost) < 0.01  # an H200 at work, FLOP/s per W; USD per 1 s frame


def test_alerts_fire_exactly_once_per_message_id_across_a_sigkill(base_settings: Settings, tmp_path: Path) -> None:
    duration = 80.0
    scenario = parse_scenario(SCENARIO, "test")
    params = SimParams(nodes=2, gpus=2, seed=9, start_ns=(time.time_ns() - int(duration * S)) // S * S, steady=True)
    SimulatorPublisher(base_settings, params, batch_size=50, scenario=scenario).backlog(duration)

    worker = Worker(base_settings, "--runtime", "faust")
    try:
        worker.wait_for(lambda st: st["frames_written"] > 0 and st.get("detect", {}).get("frames", 0) > 20)
        worker.kill()  # mid-run: frames published, alerts maybe sent, offsets maybe not committed
    finally:
        worker.proc.kill()
    first = worker
    worker = Worker(base_settings, "--runtime", "faust")
    topic = Topics(base_settings.topic_prefix).alerts
    try:
        deadline = time.monotonic() + 150
        ids: dict[str, list[bytes]] = defaultdict(list)
        while time.monotonic() < deadline:
            ids = defaultdict(list)
            for _, raw in read_topic(base_settings, topic, idle_s=1.0):
                ids[decode_alert(raw).message_id].append(raw)
            if sum(not m.endswith(":causes") for m in ids) >= 6:  # the six expected; attributions come besides
                break
            time.sleep(2)
        time.sleep(3)  # anything late (a duplicate, a spurious alert) has time to show
        alerts: dict[str, list[bytes]] = defaultdict(list)
        for _, raw in read_topic(base_settings, topic):
            jsonschema.validate(orjson.loads(raw), alert_schema())
            alerts[decode_alert(raw).message_id].append(raw)
    finally:
        assert worker.stop() == 0

    # Each message once on the topic: the restarted agent read which were already there.
    assert all(len(copies) == 1 for copies in alerts.values()), {k: len(v) for k, v in alerts.items()}
    decoded = [decode_alert(c[0]) for c in alerts.values()]
    # An attribution follows a firing with the same id when the series or events name a cause.
    firing_ids = {a.id for a in decoded if a.state == "firing" and not a.causes}
    attributions = [a for a in decoded if a.message_id.endswith(":causes")]
    assert all(a.id in firing_ids for a in attributions)
    got = sorted((a.rule, a.state, a.node, a.gpu, (a.onset_ts_ns - params.start_ns) // S)
                 for a in decoded if a not in attributions)
    assert got == [("efficiency_drift", "firing", "node-00", "0", 40), ("efficiency_drift", "resolved", "node-00", "0", 40),
                   ("sm_spike", "firing", "node-00", "1", 30), ("sm_spike", "resolved", "node-00", "1", 30),
                   ("util_spike", "firing", "node-00", "1", 30), ("util_spike", "resolved", "node-00", "1", 30)], got
    backend = open_backend(base_settings)
    try:
        _, rows = backend.rows(f"SELECT id, state, causes FROM {base_settings.clickhouse_database}.detections FINAL")
    finally:
        backend.close()
    # One row per (id, state): an attribution replaces its firing's row, and brings its causes.
    time.sleep(0.5)  # the log readers reach the end of both workers' output (for the message if this fails)
    first.drain(), worker.drain()
    logs = "".join(["first worker, last lines:\n", *first.tail, "second worker, last lines:\n", *worker.tail])
    assert sorted(f"{i}:{s}" for i, s, _ in rows) == sorted({f"{a.id}:{a.state}" for a in decoded}), logs
    attributed = {a.id: [c.cause for c in a.causes] for a in attributions}
    assert {i: [c["cause"] for c in orjson.loads(str(c))] for i, s, c in rows
            if s == "firing" and i in attributed} == attributed
