"""The Faust app's Kafka clients, where flopwatch needs other settings than Faust's.

The producer (alerts, triggers, workload summaries) is idempotent like every other of ours: Faust asks
aiokafka for idempotence only inside transactions, which flopwatch does not use, and without it a
retried send after a lost acknowledgement (a broker failover) can write an alert twice. Consumers
deduplicate by id anyway; this keeps the topics themselves free of such copies.

The consumer (frames, workload summaries) waits at most ``AGENT_FETCH_WAIT_MS`` in the broker for data.
Faust fixes aiokafka's ``fetch_max_wait_ms`` at 1,500 ms, and aiokafka keeps one fetch in flight per
broker, leaving out the partitions whose records it holds unread: a frame that reaches such a partition
while the fetch of the others waits in the broker waits with it. At 512 GPUs, with the workload
summaries on the same consumer, that put up to 2 s between a frame on Kafka and the detection agent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Consumer, Producer, Transport
from faust.types import ConsumerT, ProducerT

AGENT_FETCH_WAIT_MS = 100  # aiokafka's own default is 500; an idle consumer asks the broker 10 times a second


class IdempotentProducer(Producer):
    """aiokafka's producer with ``acks=all`` and ``enable_idempotence`` always on."""

    def _settings_extra(self) -> Mapping[str, Any]:
        return {"acks": "all", "enable_idempotence": True}


class _PromptConsumerThread(AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Transport) -> AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        # Read by the fetcher, which the consumer builds when it starts: there is no other way in.
        consumer._fetch_max_wait_ms = AGENT_FETCH_WAIT_MS
        return consumer


class PromptConsumer(Consumer):
    """Faust's aiokafka consumer, its fetches held in the broker for ``AGENT_FETCH_WAIT_MS`` at most."""

    def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
        return _PromptConsumerThread(self, loop=self.loop, beacon=self.beacon)


class App(faust.App):
    """A Faust app whose producer is ``IdempotentProducer`` and consumer ``PromptConsumer``."""

    def _new_producer(self) -> ProducerT:
        return IdempotentProducer(self.transport, loop=self.loop, beacon=self.beacon)

    def _new_consumer(self) -> ConsumerT:
        return PromptConsumer(self.transport, callback=self.topics.on_message, loop=self.loop,
                              on_partitions_revoked=self._on_partitions_revoked,
                              on_partitions_assigned=self._on_partitions_assigned, beacon=self.beacon)
