"""The Faust app's producer (alerts, triggers, workload summaries), idempotent like every other of ours.

Faust asks aiokafka for idempotence only inside transactions, which flopwatch does not use: without
it a retried send after a lost acknowledgement (a broker failover) can write an alert twice. Consumers
deduplicate by id anyway; this keeps the topics themselves free of such copies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import faust
from faust.transport.drivers.aiokafka import Producer
from faust.types import ProducerT


class IdempotentProducer(Producer):
    """aiokafka's producer with ``acks=all`` and ``enable_idempotence`` always on."""

    def _settings_extra(self) -> Mapping[str, Any]:
        return {"acks": "all", "enable_idempotence": True}


class App(faust.App):
    """A Faust app whose producer is ``IdempotentProducer``."""

    def _new_producer(self) -> ProducerT:
        return IdempotentProducer(self.transport, loop=self.loop, beacon=self.beacon)
