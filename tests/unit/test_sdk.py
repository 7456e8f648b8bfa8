"""agents.collect.sdk: validation, batching per series, size/age flushes, bounded buffering, beacons (no Kafka)."""

from __future__ import annotations

import doctest
import time
from typing import Any

import orjson
import pytest

import agents.collect.batching
from agents.collect.batching import Batcher
from agents.collect.sdk import Publisher, check_sample, read_domain_clock
from agents.settings import Settings
from schemas.codec import decode_beacon, decode_samples
from schemas.records import ClockBeacon, SampleBatch


class FakeProducer:
    """Keeps produced messages; acknowledges them on poll/flush unless ``down``."""

    def __init__(self) -> None:
        self.down = False
        self.queue: list[tuple[str, bytes, str, Any]] = []
        self.delivered: list[tuple[str, bytes, str]] = []
        self.refuse = False  # raise BufferError like a full librdkafka queue

    def produce(self, topic: str, value: bytes, key: str, on_delivery: Any) -> None:
        if self.refuse:
            raise BufferError("Local: Queue full")
        self.queue.append((topic, value, key, on_delivery))

    def poll(self, timeout: float) -> int:
        if self.down:
            return 0
        n = len(self.queue)
        for topic, value, key, cb in self.queue:
            self.delivered.append((topic, value, key))
            cb(None, None)
        self.queue.clear()
        return n

    def flush(self, timeout: float) -> int:
        self.poll(timeout)
        return len(self.queue)

    def fail_all(self, err: str = "timed out") -> None:
        for _, _, _, cb in self.queue:
            cb(err, None)
        self.queue.clear()


def _pub(**kw: Any) -> tuple[Publisher, FakeProducer]:
    fake = FakeProducer()
    return Publisher(Settings(topic_prefix="p."), producer=fake, **kw), fake


def _batches(fake: FakeProducer) -> list[tuple[str, str, SampleBatch]]:
    out = []
    for topic, value, key in fake.delivered:
        if topic.endswith("clock.sync"):
            continue
        got = decode_samples(value, topic.removeprefix("p.sensors."))
        assert isinstance(got, SampleBatch), got
        out.append((topic, key, got))
    return out


def test_check_sample_rejects_what_the_pipeline_would() -> None:
    check_sample("power", "n", "0", 1, 300.0, {"gpu_model": "H200", "pid": 3}, "utc")
    with pytest.raises(ValueError, match="unknown sensor 'powr'"):
        check_sample("powr", "n", "0", 1, 1.0, None, "utc")
    with pytest.raises(ValueError, match=r"power=6000.0 outside \[0, 5000\] W"):
        check_sample("power", "n", "0", 1, 6000.0, None, "utc")
    with pytest.raises(ValueError, match="finite"):
        check_sample("power", "n", "0", 1, float("nan"), None, "utc")
    with pytest.raises(ValueError, match="finite"):
        check_sample("power", "n", "0", 1, True, None, "utc")
    with pytest.raises(ValueError, match="ts_ns"):
        check_sample("power", "n", "0", 1.5, 1.0, None, "utc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="node"):
        check_sample("power", "", "0", 1, 1.0, None, "utc")
    with pytest.raises(ValueError, match="unknown label 'podd'"):
        check_sample("power", "n", "0", 1, 1.0, {"podd": "x"}, "utc")
    with pytest.raises(ValueError, match="label pid must be int"):
        check_sample("power", "n", "0", 1, 1.0, {"pid": "7"}, "utc")


def test_batches_per_series_flush_on_size_in_the_codec_batch_form() -> None:
    pub, fake = _pub(max_batch=3, max_age_ms=10_000)
    for i in range(7):
        pub.send("power", "node-1", "0", 100 + i, 300.0 + i, clock="nvml:node-1")
        pub.send("power", "node-1", "1", 100 + i, 200.0 + i, clock="nvml:node-1")
        pub.send("gpu_util", "node-2", "0", 100 + i, float(i), labels={"pod": "a"})
    pub.poll()
    got = _batches(fake)
    assert len(got) == 6  # two full batches of 3 per series; one sample each still open
    assert pub.buffered == 3
    for topic, key, b in got:
        assert len(b) == 3
        assert key == b.node
        assert topic == f"p.sensors.{b.sensor}"
    util = [b for _, _, b in got if b.sensor == "gpu_util"]
    assert util[0].labels == {"pod": "a"} and util[0].clock == "utc"
    assert list(util[0].ts_ns) == [100, 101, 102] and list(util[1].value) == [3.0, 4.0, 5.0]
    assert pub.flush() == 0
    assert sum(len(b) for _, _, b in _batches(fake)) == 21
    assert pub.stats.delivered == pub.stats.sent == pub.stats.accepted == 21


def test_labels_split_series() -> None:
    pub, fake = _pub(max_batch=100)
    pub.send("fb_used", "n", "0", 1, 1.0, labels={"pid": 1})
    pub.send("fb_used", "n", "0", 2, 2.0, labels={"pid": 2})
    pub.send("fb_used", "n", "0", 3, 3.0, labels={"pid": 1})
    pub.flush()
    got = sorted((b.labels["pid"], list(b.value)) for _, _, b in _batches(fake) if b.labels)
    assert got == [(1, [1.0, 3.0]), (2, [2.0])]


def test_age_flush_on_poll_and_send() -> None:
    pub, fake = _pub(max_batch=100, max_age_ms=20)
    pub.send("power", "n", "0", 1, 1.0)
    pub.poll()
    assert fake.delivered == []
    time.sleep(0.03)
    pub.poll()
    assert len(_batches(fake)) == 1
    pub.send("power", "n", "0", 2, 1.0)
    time.sleep(0.03)
    pub.send("temperature", "n", "0", 2, 50.0)  # the old power batch goes with this send
    pub.poll()
    assert [b.sensor for _, _, b in _batches(fake)] == ["power", "power"]


def test_batcher_due_and_drain() -> None:
    b = Batcher(max_batch=10, max_age_s=1.0)
    k1 = ("t", "n", "0", "utc", ())
    k2 = ("t", "n", "1", "utc", ())
    b.add(k1, None, 1, 1.0, now=0.0)
    b.add(k2, None, 1, 1.0, now=0.5)
    assert not b.has_due(0.9) and b.due(0.9) == []
    assert [x.key for x in b.due(1.0)] == [k1]
    assert b.pending == 1
    assert [x.key for x in b.due(1.6)] == [k2]
    b.add(k1, None, 2, 2.0, now=2.0)
    assert [x.value for x in b.drain()] == [[2.0]] and b.pending == 0
    with pytest.raises(ValueError):
        Batcher(max_batch=0)


def test_batcher_take_closes_one_series() -> None:
    # The replay closes a series' batch when its labels change: take it, and the count follows.
    b = Batcher(max_batch=10, max_age_s=1.0)
    k = ("t", "n", "0", "utc", ())
    b.add(k, {"pod": "a"}, 1, 1.0, now=0.0)
    b.add(k, {"pod": "a"}, 2, 2.0, now=0.0)
    got = b.get(k)
    assert got is not None and got.labels == {"pod": "a"}
    taken = b.take(k)
    assert taken is got and taken.ts_ns == [1, 2] and b.pending == 0 and b.get(k) is None
    assert b.take(k) is None


def test_the_batcher_module_examples_run() -> None:
    result = doctest.testmod(agents.collect.batching, report=True)
    assert result.attempted >= 1 and result.failed == 0


def test_bounded_buffer_drops_and_counts_while_kafka_is_down() -> None:
    pub, fake = _pub(max_batch=10, max_buffered=50)
    fake.down = True
    accepted = sum(pub.send("power", "n", "0", i, 1.0) for i in range(80))
    assert accepted == 50
    assert pub.stats.dropped == 30 and pub.buffered == 50
    fake.down = False
    pub.poll()
    assert pub.buffered == 0 and pub.stats.delivered == 50
    assert pub.send("power", "n", "0", 100, 1.0)  # room again


def test_failed_deliveries_free_the_buffer_and_are_counted() -> None:
    seen: list[tuple[int, Any]] = []
    pub, fake = _pub(max_batch=5, on_delivery=lambda n, err: seen.append((n, err)))
    fake.down = True
    for i in range(10):
        pub.send("power", "n", "0", i, 1.0)
    fake.fail_all("Message timed out")
    assert pub.stats.failed == 10 and pub.buffered == 0
    assert seen == [(5, "Message timed out"), (5, "Message timed out")]
    assert pub.first_error == "Message timed out"


def test_full_client_queue_drops_instead_of_blocking() -> None:
    pub, fake = _pub(max_batch=2)
    fake.refuse = True
    pub.send("power", "n", "0", 1, 1.0)
    pub.send("power", "n", "0", 2, 1.0)
    assert pub.stats.dropped == 2 and pub.buffered == 0
    assert not pub.beacon("n", "nvml:n", 5, 10, 12)
    assert pub.stats.beacons_dropped == 1


def test_beacons() -> None:
    pub, fake = _pub()
    assert pub.beacon("node-1", "nvml:node-1", 123, 1000, 1010)
    assert pub.beacon_now("node-1", "nvml:node-1", domain=lambda: 77)
    pub.flush()
    raws = [v for t, v, k in fake.delivered if t == "p.clock.sync"]
    assert len(raws) == 2
    first = decode_beacon(raws[0])
    assert first == ClockBeacon("node-1", "nvml:node-1", 123, 1000, 1010)
    second = decode_beacon(raws[1])
    assert isinstance(second, ClockBeacon) and second.domain_ns == 77
    assert second.utc_before_ns <= second.utc_after_ns
    assert orjson.loads(raws[0])["v"] == 1
    with pytest.raises(ValueError, match="before"):
        pub.beacon("n", "nvml:n", 1, 10, 5)
    with pytest.raises(ValueError, match="domain other than 'utc'"):
        pub.beacon("n", "utc", 1, 1, 2)


def test_read_domain_clock_brackets_the_reading() -> None:
    ticks = iter([10, 20, 30])
    assert read_domain_clock(domain=lambda: 555, utc=lambda: next(ticks)) == (555, 10, 20)


def test_context_manager_flushes_and_closes() -> None:
    fake = FakeProducer()
    with Publisher("127.0.0.1:1", producer=fake) as pub:
        pub.send("power", "n", "0", 1, 1.0)
    assert len(fake.delivered) == 1
    assert fake.delivered[0][0] == "sensors.power"
    with pytest.raises(RuntimeError, match="closed"):
        pub.send("power", "n", "0", 1, 1.0)


def test_send_pending_sends_every_open_batch_without_waiting() -> None:
    pub, fake = _pub(max_batch=100, max_age_ms=60_000)
    pub.send("power", "n", "0", 1, 1.0)
    pub.send("power", "n", "1", 1, 1.0)
    fake.down = True
    pub.send_pending()
    assert len(fake.queue) == 2 and pub.buffered == 2  # handed to Kafka, not yet acknowledged
    fake.down = False
    pub.poll()
    assert pub.buffered == 0 and pub.stats.delivered == 2
