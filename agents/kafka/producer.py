"""The producer client: confluent-kafka, idempotent, batched, delivery errors surfaced.

Collectors, the simulator and the dead-letter path all publish through it.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from agents.kafka.topics import confluent_config
from agents.settings import Settings

log = logging.getLogger(__name__)


class DeliveryError(RuntimeError):
    """Kafka did not acknowledge some messages; the text names how many and the first cause."""


def producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """librdkafka options of every confluent-kafka producer of flopwatch: idempotent, ``acks=all``
    (a write counts once ``min.insync.replicas`` have it), batched and compressed; ``overrides`` may
    tune the batching but not those two."""
    conf = confluent_config(settings) | {
        "linger.ms": 20,
        "batch.size": 1_000_000,
        "compression.type": "lz4",
        "queue.buffering.max.messages": 500_000,
        "queue.buffering.max.kbytes": 512 * 1024,
        # Keys are node names; the default murmur2 partitioner matches the Java
        # clients, so third-party producers place a node where we do.
        "partitioner": "murmur2_random",
    }
    conf.update(overrides)
    conf |= {"enable.idempotence": True, "acks": "all"}  # retries never reorder or duplicate within a partition
    return conf


class SampleProducer:
    """Idempotent producer; ``flush()`` raises if any message since the last flush was not delivered."""

    def __init__(self, settings: Settings, **overrides: Any) -> None:
        conf = producer_config(settings, **overrides)
        self._producer = Producer(conf)
        self._failed = 0
        self._first_error: KafkaError | None = None
        self.delivered = 0

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.delivered += 1
            return
        self._failed += 1
        if self._first_error is None:
            self._first_error = err

    def send(self, topic: str, value: bytes, key: str | bytes | None = None,
             headers: list[tuple[str, str | bytes | None]] | None = None, timestamp_ms: int = 0) -> None:
        """``timestamp_ms`` 0: the broker's create time (now); otherwise the message's event time."""
        while True:
            try:
                self._producer.produce(topic, value, key, headers=headers, on_delivery=self._on_delivery,
                                       timestamp=timestamp_ms)
                return
            except BufferError:
                # Local queue full: wait for deliveries instead of dropping (back-pressure).
                self._producer.poll(0.05)

    def poll(self) -> None:
        self._producer.poll(0)

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued, then let librdkafka go: a producer left behind keeps
        reconnecting (and logging) after its broker is gone."""
        try:
            self.flush(timeout_s)
        finally:
            del self._producer  # the last reference: librdkafka's threads stop with it

    def flush(self, timeout_s: float = 60.0) -> None:
        left = self._producer.flush(timeout_s)
        if left:
            raise DeliveryError(f"{left} messages still unacknowledged after {timeout_s:.0f} s")
        if self._failed:
            failed, err = self._failed, self._first_error
            self._failed, self._first_error = 0, None
            raise DeliveryError(f"{failed} messages were not delivered; first error: {err}")
