"""Bad input goes to flopwatch.dlq with its original bytes, origin and reason; the worker keeps going."""

from __future__ import annotations

import time
from typing import cast

import orjson
import pytest
from confluent_kafka import Consumer

from agents.collect.simulator import SimulatorPublisher
from agents.kafka.producer import SampleProducer
from agents.kafka.topics import Topics, confluent_config
from agents.settings import Settings
from streams.sim.simulate import SimParams
from tests.integration.helpers import assert_frames_equal, expected_frames, run_worker_until_idle, stored_frames

pytestmark = pytest.mark.integration


def read_dlq(settings: Settings, expect: int, timeout_s: float = 30.0) -> list[tuple[bytes, dict[str, str]]]:
    consumer = Consumer(confluent_config(settings) | {"group.id": f"{settings.group_id}-dlq-reader",
                                                     "auto.offset.reset": "earliest"})
    consumer.subscribe([Topics(settings.topic_prefix).dlq])
    out: list[tuple[bytes, dict[str, str]]] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < expect and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None or msg.error():
            continue
        # A plain Consumer gives headers as (key, bytes or None) pairs and the value as bytes.
        pairs = cast("list[tuple[str, bytes | None]]", msg.headers() or [])
        headers = {k: (v or b"").decode() for k, v in pairs}
        out.append((cast(bytes, msg.value()), headers))
    # Nothing more than expected may arrive either.
    extra = consumer.poll(2.0)
    consumer.close()
    assert extra is None or extra.error(), "more dead letters than bad messages"
    return out


def test_rejects_reach_the_dead_letter_topic_and_good_data_is_exact(base_settings: Settings) -> None:
    settings = base_settings
    topics = Topics(settings.topic_prefix)
    duration = 12.0
    now = time.time_ns()
    params = SimParams(nodes=2, gpus=1, seed=5, start_ns=now - int(duration * 1e9))
    pub = SimulatorPublisher(settings, params, batch_size=10)
    pub.backlog(duration / 2)

    def sample(**kw: object) -> bytes:
        return orjson.dumps({"v": 1, "node": "node-00", "gpu": "0", "ts_ns": now - 3 * 10**9, "value": 50.0} | kw)

    gpu_util = topics.sensor(0)
    bad: dict[str, tuple[str, bytes]] = {
        "malformed_json": (gpu_util, b'{"v": 1, "node": '),
        "unknown_version": (gpu_util, sample(v=2)),
        "missing_field": (gpu_util, orjson.dumps({"v": 1, "gpu": "0", "ts_ns": now, "value": 1.0})),
        "wrong_type": (gpu_util, sample(value="fifty")),
        "not_finite": (gpu_util, b'{"v": 1, "node": "node-00", "gpu": "0", "ts_ns": 1, "value": NaN}'),
        "out_of_range": (gpu_util, sample(value=150.0)),
        "length_mismatch": (gpu_util, sample(ts_ns=[now, now + 1], value=[1.0])),
        "unknown_sensor": (gpu_util, sample(sensor="voltage")),
        "too_old": (gpu_util, sample(ts_ns=now - 30 * 86400 * 10**9)),
        "too_new": (gpu_util, sample(ts_ns=now + 86400 * 10**9)),
        "no_clock": (gpu_util, sample(clock="nvml:node-00", ts_ns=12345)),
    }
    beacon_bad = orjson.dumps({"v": 1, "node": "node-00", "clock": "nvml:node-00", "domain_ns": 1,
                               "utc_before_ns": 10, "utc_after_ns": 5})
    event_bad = orjson.dumps({"v": 1, "node": "node-00", "ts_ns": now, "type": "Warning"})
    producer = SampleProducer(settings)
    for topic, raw in bad.values():
        producer.send(topic, raw, "node-00")
    producer.send(topics.clock_sync, beacon_bad, "node-00")
    producer.send(topics.k8s_events, event_bad, "node-00")
    producer.flush()
    pub.backlog(duration / 2)  # the rest of the good data, after the bad messages

    stats = run_worker_until_idle(settings)
    assert stats["rejects"] == {r: 1 for r in bad} | {"out_of_range": 2, "missing_field": 2}

    # A second run: a sample for a tick already written is late, not merged.
    late = sample(ts_ns=params.start_ns + 1_500_000_000, value=99.0)
    producer.send(gpu_util, late, "node-00")
    producer.flush()
    stats = run_worker_until_idle(settings)
    assert stats["rejects"] == {"late": 1} and stats["late"] == {"node-00/gpu_util": 1}

    letters = read_dlq(settings, expect=len(bad) + 3)
    by_reason: dict[str, list[tuple[bytes, dict[str, str]]]] = {}
    for value, headers in letters:
        by_reason.setdefault(headers["flopwatch.reason"], []).append((value, headers))
    for reason, (topic, raw) in bad.items():
        [(value, headers)] = [x for x in by_reason[reason] if x[1]["flopwatch.topic"] == topic]
        assert value == raw, reason  # original bytes, untouched
        assert headers["flopwatch.detail"]
        assert int(headers["flopwatch.offset"]) >= 0 and int(headers["flopwatch.partition"]) in range(4)
    assert [v for v, _ in by_reason["late"]] == [late]
    origins = {h["flopwatch.topic"] for _, h in letters}
    assert {topics.clock_sync, topics.k8s_events} <= origins

    got, nrows = stored_frames(settings)
    assert nrows == len(got)
    assert_frames_equal(got, expected_frames(params, duration))


def test_a_record_that_trips_a_bug_is_dead_lettered_and_the_worker_goes_on(
        native_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug that one record trips (simulated in the decoders) costs that record only: it goes to
    the dead-letter topic as internal_error with the exception, the rest is exact."""
    import asyncio

    import agents.ingest.core as core
    import agents.ingest.worker as ingest
    from agents.cli.main import _stop_when_idle
    from schemas.codec import decode_k8s_event, decode_samples

    settings = native_settings
    topics = Topics(settings.topic_prefix)
    real_samples, real_event = decode_samples, decode_k8s_event

    def samples_with_bug(raw: bytes, sensor: str, limits: object = None) -> object:
        if b"trips-a-bug" in raw:
            raise ZeroDivisionError("simulated bug")
        return real_samples(raw, sensor, limits)  # type: ignore[arg-type]

    def event_with_bug(raw: bytes) -> object:
        if b"trips-a-bug" in raw:
            raise KeyError("simulated")
        return real_event(raw)

    real_poll = core.decode_poll  # type: ignore[attr-defined]

    def poll_with_bug(raws: list[bytes], sensor: str, limits: object = None) -> object:
        if any(b"trips-a-bug" in raw for raw in raws):  # the poll's decode trips: each record is decoded alone
            raise ZeroDivisionError("simulated bug")
        return real_poll(raws, sensor, limits)  # type: ignore[arg-type]

    monkeypatch.setattr(core, "decode_samples", samples_with_bug)
    monkeypatch.setattr(core, "decode_poll", poll_with_bug)
    monkeypatch.setattr(core, "decode_k8s_event", event_with_bug)
    duration = 8.0
    now = time.time_ns()
    params = SimParams(nodes=2, gpus=1, seed=9, start_ns=now - int(duration * 1e9))
    pub = SimulatorPublisher(settings, params, batch_size=10)
    pub.backlog(duration / 2)
    poison = orjson.dumps({"v": 1, "node": "node-00", "gpu": "0", "ts_ns": now - 10**9, "value": 50.0,
                           "labels": {"pod": "trips-a-bug"}})
    event = orjson.dumps({"v": 1, "node": "node-00", "ts_ns": now, "type": "Normal", "reason": "trips-a-bug",
                          "kind": "Pod"})
    producer = SampleProducer(settings)
    producer.send(topics.sensor(4), poison, "node-00")
    producer.send(topics.sensor(0), poison, "node-00")
    producer.send(topics.k8s_events, event, "node-00")
    producer.flush()
    pub.backlog(duration / 2)

    async def run() -> ingest.IngestStats:
        ingestor = ingest.Ingestor(settings)
        stop = asyncio.Event()
        watcher = asyncio.create_task(_stop_when_idle(ingestor, stop, 2.0))
        try:
            return await asyncio.wait_for(ingestor.run(stop), 180)
        finally:
            watcher.cancel()

    stats = asyncio.run(run())
    assert stats.internal_errors == 3 and dict(stats.rejects) == {"internal_error": 3}, stats.as_dict()
    letters = read_dlq(settings, expect=3)
    assert sorted(v for v, _ in letters) == sorted([poison, poison, event])
    details = sorted(h["flopwatch.detail"] for _, h in letters)
    assert details == ["KeyError: 'simulated'", "ZeroDivisionError: simulated bug",
                       "ZeroDivisionError: simulated bug"], details
    assert {h["flopwatch.reason"] for _, h in letters} == {"internal_error"}
    got, nrows = stored_frames(settings)
    assert nrows == len(got)
    assert_frames_equal(got, expected_frames(params, duration))
