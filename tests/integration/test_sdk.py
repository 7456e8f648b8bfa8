"""agents.collect.sdk through real Kafka: every sample sent arrives exactly once, decodable by schemas.codec."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from agents.collect.sdk import Publisher
from agents.kafka.topics import Topics
from agents.settings import Settings
from schemas.codec import decode_beacon, decode_samples
from schemas.records import ClockBeacon, Labels, SampleBatch

pytestmark = pytest.mark.integration


def read_topics(settings: Settings, topics: list[str], want: int | None = None,
                idle_s: float = 3.0, timeout_s: float = 60.0) -> list[tuple[str, bytes | None, bytes]]:
    """Every message on ``topics``: with ``want``, until that many arrived (then a short idle) or ``timeout_s``
    passed; without, until nothing came for ``idle_s``. (A pause of ``idle_s`` between fetches on a loaded CI
    machine ended a read with ``want`` unmet: 1,220 of 1,224 samples.)"""
    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": f"read-{time.time_ns()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    parts = []
    for topic in topics:
        meta = c.list_topics(topic, timeout=10)
        parts += [TopicPartition(topic, p, 0) for p in meta.topics[topic].partitions]
    c.assign(parts)
    out: list[tuple[str, bytes | None, bytes]] = []
    start = last = time.monotonic()
    while time.monotonic() - start <= timeout_s:
        quiet = time.monotonic() - last
        if (quiet >= 0.5 and len(out) >= want) if want is not None else quiet >= idle_s:
            break
        m = c.poll(0.2)
        if m is None or m.error():
            continue
        out.append((m.topic() or "", m.key(), m.value() or b""))
        last = time.monotonic()
    c.close()
    return out


def test_every_sample_arrives_exactly(base_settings: Settings) -> None:
    rng = random.Random(3)
    acked: list[int] = []
    sent: Counter[tuple[Any, ...]] = Counter()
    topics = Topics(base_settings.topic_prefix)
    now = time.time_ns()
    with Publisher(base_settings, max_batch=100, max_age_ms=50,
                   on_delivery=lambda n, err: acked.append(n) if err is None else None) as pub:
        for i in range(5000):
            sensor = rng.choice(["power", "gpu_util", "fb_used", "temperature"])
            node, gpu = f"node-{rng.randrange(3)}", str(rng.randrange(4))
            clock = rng.choice(["utc", f"nvml:{node}"])
            choices: list[Labels | None] = [None, {"gpu_model": "NVIDIA H200"}, {"pod": "p1", "pid": 42}]
            labels = rng.choice(choices)
            ts = now + i * 1000
            value = float(rng.randrange(0, 100))
            assert pub.send(sensor, node, gpu, ts, value, labels=labels, clock=clock)
            sent[(sensor, node, gpu, ts, value, clock, tuple(sorted((labels or {}).items())))] += 1
            if i % 500 == 0:
                pub.poll()
        assert pub.beacon("node-0", "nvml:node-0", 123_456, now, now + 40_000)
    stats = pub.stats
    assert stats.dropped == 0 and stats.failed == 0
    assert stats.delivered == stats.sent == stats.accepted == 5000
    assert sum(acked) == 5000 + 1  # the beacon is acknowledged too

    msgs = read_topics(base_settings, [topics.sensor(i) for i in (0, 3, 4, 5)], want=stats.messages)
    assert len(msgs) == stats.messages
    got: Counter[tuple[Any, ...]] = Counter()
    for topic, key, raw in msgs:
        sensor = topic.removeprefix(topics.prefix + "sensors.")
        batch = decode_samples(raw, sensor)
        assert isinstance(batch, SampleBatch), batch
        assert key == batch.node.encode()
        assert len(batch) <= 100
        for t, v in zip(batch.ts_ns, batch.value, strict=True):
            got[(sensor, batch.node, batch.gpu, t, v, batch.clock, tuple(sorted((batch.labels or {}).items())))] += 1
    assert got == sent

    beacons = read_topics(base_settings, [topics.clock_sync], want=1)
    assert [decode_beacon(raw) for _, _, raw in beacons] == [ClockBeacon("node-0", "nvml:node-0", 123_456, now,
                                                                         now + 40_000)]


def test_unreachable_kafka_bounds_the_buffer_and_never_blocks() -> None:
    errors: list[Any] = []
    pub = Publisher("127.0.0.1:1", max_batch=10, max_buffered=200, delivery_timeout_s=2.0,
                    on_delivery=lambda n, err: errors.append(err))
    start = time.monotonic()
    accepted = sum(pub.send("power", "n", "0", time.time_ns(), 100.0) for _ in range(1000))
    assert accepted == 200
    assert pub.stats.dropped == 800
    assert time.monotonic() - start < 1.0  # sending never waited for the broker
    time.sleep(2.5)  # the delivery timeout passes: librdkafka gives the messages up
    pub.poll()
    stats = pub.close(timeout_s=3.0)
    assert time.monotonic() - start < 10.0
    assert stats.failed == 200 and pub.buffered == 0
    assert errors and all(e is not None for e in errors)
