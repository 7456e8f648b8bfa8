"""The producer SDK for integrations: validated, batched samples and clock beacons to Kafka.

    with Publisher("127.0.0.1:9092") as pub:
        pub.send("power", "node-07", "GPU-1f2e", time.time_ns(), 312.5, labels={"gpu_model": "H200"})

Samples are checked against ``schemas.catalog`` when sent (a ``ValueError`` names the
problem), collected per series (sensor, node, gpu, clock, labels) and published in the
batch wire form of ``schemas.codec`` on ``sensors.<name>``, keyed by node, when a batch
holds ``max_batch`` samples or its oldest sample is ``max_age_ms`` old (checked on
``send`` and ``poll``). Buffering is bounded: at most ``max_buffered`` samples wait,
in open batches or unacknowledged in the Kafka client; beyond that ``send`` drops the
sample and counts it (``stats.dropped``) instead of blocking, so a collector keeps
sampling through a broker outage and says afterwards what it lost.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, cast

import orjson

from agents.collect.batching import Batcher, OpenBatch, label_key
from agents.kafka.topics import Topics, confluent_config
from agents.settings import Settings
from schemas.catalog import BY_NAME, INT_LABELS, LABEL_COLUMNS, Sensor
from schemas.counters import Counters
from schemas.records import UTC_CLOCK, WIRE_VERSION, Labels

log = logging.getLogger(__name__)

DeliveryCallback = Callable[[int, Any], None]
"""Called once per message with the number of samples (or 1 for a beacon) it carried and
the ``KafkaError`` (None when Kafka acknowledged it)."""


class KafkaProducerLike(Protocol):
    """What the SDK needs of ``confluent_kafka.Producer`` (tests pass a double)."""

    def produce(self, topic: str, value: bytes, key: str, on_delivery: Callable[[Any, Any], None]) -> None: ...

    def poll(self, timeout: float) -> int: ...

    def flush(self, timeout: float) -> int: ...


def check_sample(sensor: str, node: str, gpu: str, ts_ns: int, value: float, labels: Labels | None,
                 clock: str) -> Sensor:
    """The catalog entry of ``sensor``, or a ``ValueError`` naming what the pipeline would reject."""
    spec = BY_NAME.get(sensor)
    if spec is None:
        raise ValueError(f"unknown sensor {sensor!r}: not in schemas.catalog")
    for name, text in (("node", node), ("gpu", gpu), ("clock", clock)):
        if type(text) is not str or not text:
            raise ValueError(f"{sensor}: {name} must be a non-empty string, got {text!r}")
    if type(ts_ns) is not int or not -(2**63) <= ts_ns < 2**63:
        raise ValueError(f"{sensor}: ts_ns must be integer nanoseconds (int64), got {ts_ns!r}")
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ValueError(f"{sensor}: value must be a finite number, got {value!r}")
    if not spec.lo <= value <= spec.hi:
        raise ValueError(f"{sensor}={value!r} outside [{spec.lo:g}, {spec.hi:g}] {spec.unit}")
    if labels:
        for key, val in labels.items():
            if key not in LABEL_COLUMNS:
                raise ValueError(f"{sensor}: unknown label {key!r} (known: {', '.join(LABEL_COLUMNS)})")
            want = int if key in INT_LABELS else str
            if type(val) is not want:
                raise ValueError(f"{sensor}: label {key} must be {want.__name__}, got {val!r}")
    return spec


def read_domain_clock(domain: Callable[[], int] = time.monotonic_ns,
                      utc: Callable[[], int] = time.time_ns) -> tuple[int, int, int]:
    """``(domain_ns, utc_before_ns, utc_after_ns)``: one reading of a clock domain between two
    UTC readings, what a ``clock.sync`` beacon carries."""
    before = utc()
    reading = domain()
    after = utc()
    return reading, before, after


@dataclass(slots=True)
class PublisherStats(Counters):
    """Sample counts since the publisher started (beacons are counted apart)."""

    accepted: int = 0  # taken by send()
    sent: int = 0  # handed to the Kafka client
    delivered: int = 0  # acknowledged by Kafka
    failed: int = 0  # Kafka reported them lost (delivery timeout, broker refused)
    dropped: int = 0  # never handed to Kafka: the buffer bound was reached
    messages: int = 0
    beacons: int = 0
    beacons_dropped: int = 0


class Publisher:
    """Validated, batched samples and ``clock.sync`` beacons to Kafka; see the module docstring.

    ``settings_or_bootstrap``: flopwatch ``Settings`` (brokers, security, topic prefix) or a
    bootstrap string. ``producer``: a confluent-kafka-like producer to use instead of
    making one (tests). ``delivery_timeout_s``: how long Kafka may take before a message
    counts as failed.
    """

    def __init__(self, settings_or_bootstrap: Settings | str, *, max_batch: int = 100, max_age_ms: float = 100.0,
                 max_buffered: int = 100_000, on_delivery: DeliveryCallback | None = None,
                 delivery_timeout_s: float = 120.0, producer: KafkaProducerLike | None = None,
                 **overrides: Any) -> None:
        settings = (Settings(kafka_bootstrap=settings_or_bootstrap) if isinstance(settings_or_bootstrap, str)
                    else settings_or_bootstrap)
        if max_buffered < 1:
            raise ValueError(f"max_buffered must be >= 1, got {max_buffered}")
        self._topics = Topics(settings.topic_prefix)
        self._topic_of = {name: self._topics.prefix + s.topic for name, s in BY_NAME.items()}
        self._batcher = Batcher(max_batch, max_age_ms / 1000.0)
        self.max_buffered = max_buffered
        self._on_delivery = on_delivery
        self.stats = PublisherStats()
        self._in_flight = 0  # samples handed to Kafka, not yet acknowledged or failed
        self._first_error: Any = None
        if producer is None:
            from confluent_kafka import Producer

            conf = confluent_config(settings) | {
                "enable.idempotence": True,  # retries never reorder or duplicate within a partition
                "acks": "all",
                "linger.ms": 20,
                "compression.type": "lz4",
                "message.timeout.ms": int(delivery_timeout_s * 1000),
                # The SDK's own bound is in samples; this one only keeps librdkafka from
                # refusing before it (a message holds at least one sample).
                "queue.buffering.max.messages": max(max_buffered + 1000, 10_000),
                "partitioner": "murmur2_random",  # the Java clients' placement of a node key
            }
            conf.update(overrides)
            producer = cast(KafkaProducerLike, Producer(conf))
        self._producer: KafkaProducerLike | None = producer
        self._closed = False

    @property
    def buffered(self) -> int:
        """Samples waiting: in open batches plus handed to Kafka and not yet acknowledged."""
        return self._batcher.pending + self._in_flight

    @property
    def first_error(self) -> Any:
        """The first delivery error seen, if any (a ``KafkaError``)."""
        return self._first_error

    def send(self, sensor: str, node: str, gpu: str, ts_ns: int, value: float, labels: Labels | None = None,
             clock: str = UTC_CLOCK) -> bool:
        """Queue one sample; False when it was dropped because the buffer is full.

        Raises ``ValueError`` for a sample the pipeline would reject (unknown sensor,
        value outside the catalog's range, wrong types, unknown label).
        """
        if self._closed:
            raise RuntimeError("Publisher is closed")
        check_sample(sensor, node, gpu, ts_ns, value, labels, clock)
        if self._batcher.pending + self._in_flight >= self.max_buffered:
            self.stats.dropped += 1
            return False
        self.stats.accepted += 1
        now = time.monotonic()
        key = (self._topic_of[sensor], node, gpu, clock, label_key(labels))
        full = self._batcher.add(key, labels, ts_ns, float(value), now)
        if full is not None:
            self._produce_batch(full)
        if self._batcher.has_due(now):
            for batch in self._batcher.due(now):
                self._produce_batch(batch)
        return True

    def beacon(self, node: str, clock: str, domain_ns: int, utc_before_ns: int, utc_after_ns: int) -> bool:
        """Publish one ``clock.sync`` beacon at once; False when the Kafka client's queue refused it."""
        if self._closed:
            raise RuntimeError("Publisher is closed")
        if type(node) is not str or not node:
            raise ValueError(f"beacon: node must be a non-empty string, got {node!r}")
        if type(clock) is not str or not clock or clock == UTC_CLOCK:
            raise ValueError(f"beacon: clock must name a domain other than {UTC_CLOCK!r}, got {clock!r}")
        for name, val in (("domain_ns", domain_ns), ("utc_before_ns", utc_before_ns), ("utc_after_ns", utc_after_ns)):
            if type(val) is not int:
                raise ValueError(f"beacon: {name} must be integer nanoseconds, got {val!r}")
        if utc_after_ns < utc_before_ns:
            raise ValueError(f"beacon: utc_after_ns {utc_after_ns} is before utc_before_ns {utc_before_ns}")
        raw = orjson.dumps({"v": WIRE_VERSION, "node": node, "clock": clock, "domain_ns": domain_ns,
                            "utc_before_ns": utc_before_ns, "utc_after_ns": utc_after_ns})
        assert self._producer is not None
        try:
            self._producer.produce(self._topics.clock_sync, raw, node,
                                   on_delivery=functools.partial(self._delivered, 1, True))
        except BufferError:
            self.stats.beacons_dropped += 1
            return False
        self.stats.beacons += 1
        return True

    def beacon_now(self, node: str, clock: str, domain: Callable[[], int] = time.monotonic_ns) -> bool:
        """Read ``domain`` between two UTC readings and publish the beacon."""
        return self.beacon(node, clock, *read_domain_clock(domain))

    def poll(self) -> None:
        """Send batches that reached their age and serve delivery callbacks; never blocks."""
        for batch in self._batcher.due(time.monotonic()):
            self._produce_batch(batch)
        if self._producer is not None:
            self._producer.poll(0)

    def send_pending(self) -> None:
        """Send every open batch now, whatever its age, without waiting for Kafka.

        A collector stamping samples in a clock domain calls it right before each beacon:
        its samples become placeable once a beacon read after them arrives, so sending
        them then costs no latency and makes the batches as large as they can be.
        """
        for batch in self._batcher.drain():
            self._produce_batch(batch)
        if self._producer is not None:
            self._producer.poll(0)

    def flush(self, timeout_s: float = 10.0) -> int:
        """Send every open batch and wait up to ``timeout_s`` for Kafka; returns the messages left."""
        for batch in self._batcher.drain():
            self._produce_batch(batch)
        assert self._producer is not None
        return self._producer.flush(timeout_s)

    def close(self, timeout_s: float = 10.0) -> PublisherStats:
        """Flush (bounded by ``timeout_s``) and release the client; returns the final counts."""
        if self._closed:
            return self.stats
        try:
            left = self.flush(timeout_s)
            if left:
                log.warning("Publisher closing with %d messages (%d samples) unacknowledged after %.0f s",
                            left, self._in_flight, timeout_s)
        finally:
            self._closed = True
            self._producer = None  # the last reference: librdkafka's threads stop with it
        return self.stats

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _produce_batch(self, batch: OpenBatch) -> None:
        n = len(batch.ts_ns)
        assert self._producer is not None
        try:
            self._producer.produce(batch.topic, batch.encode(), batch.node,
                                   on_delivery=functools.partial(self._delivered, n, False))
        except BufferError:
            self.stats.dropped += n  # librdkafka's own queue is full: drop rather than block
            return
        self._in_flight += n
        self.stats.sent += n
        self.stats.messages += 1

    def _delivered(self, n: int, is_beacon: bool, err: Any, _msg: Any) -> None:
        if not is_beacon:
            self._in_flight -= n
            if err is None:
                self.stats.delivered += n
            else:
                self.stats.failed += n
        if err is not None and self._first_error is None:
            self._first_error = err
        if self._on_delivery is not None:
            self._on_delivery(n, err)
