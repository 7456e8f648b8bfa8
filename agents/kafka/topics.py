"""Topic names and the Kafka client configuration (security included) for both clients."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

from agents.settings import Settings
from schemas.catalog import CATALOG

K8S_EVENTS = "k8s.events"
CLOCK_SYNC = "clock.sync"
TRIGGERS = "flopwatch.triggers"
WORKLOADS = "flopwatch.workloads"  # frames summarised per workload and node, keyed by workload
ALERTS = "flopwatch.alerts"
FRAMES = "flopwatch.frames"
DLQ = "flopwatch.dlq"


@dataclass(frozen=True, slots=True)
class Topics:
    """Every topic flopwatch reads or writes, with the configured prefix applied."""

    prefix: str = ""

    def sensor(self, index: int) -> str:
        return self.prefix + CATALOG[index].topic

    @property
    def sensors(self) -> list[str]:
        return [self.prefix + s.topic for s in CATALOG]

    @property
    def k8s_events(self) -> str:
        return self.prefix + K8S_EVENTS

    @property
    def clock_sync(self) -> str:
        return self.prefix + CLOCK_SYNC

    @property
    def dlq(self) -> str:
        return self.prefix + DLQ

    @property
    def frames(self) -> str:
        return self.prefix + FRAMES

    @property
    def alerts(self) -> str:
        return self.prefix + ALERTS

    @property
    def triggers(self) -> str:
        return self.prefix + TRIGGERS

    @property
    def workloads(self) -> str:
        return self.prefix + WORKLOADS

    @property
    def inputs(self) -> list[str]:
        return [*self.sensors, self.k8s_events, self.clock_sync]

    @property
    def outputs(self) -> list[str]:
        return [self.frames, self.workloads, self.triggers, self.alerts, self.dlq]

    @property
    def all(self) -> list[str]:
        return [*self.inputs, *self.outputs]


def confluent_config(s: Settings) -> dict[str, Any]:
    """librdkafka options for the confluent-kafka producer and admin client."""
    conf: dict[str, Any] = {"bootstrap.servers": s.kafka_bootstrap, "security.protocol": s.kafka_security_protocol}
    if s.kafka_security_protocol.startswith("SASL"):
        conf |= {"sasl.mechanism": s.kafka_sasl_mechanism, "sasl.username": s.kafka_sasl_username,
                 "sasl.password": s.kafka_sasl_password.get()}
    if s.kafka_security_protocol.endswith("SSL"):
        for key, val in (("ssl.ca.location", s.kafka_ssl_cafile), ("ssl.certificate.location", s.kafka_ssl_certfile),
                         ("ssl.key.location", s.kafka_ssl_keyfile)):
            if val:
                conf[key] = val
    return conf


def aiokafka_config(s: Settings) -> dict[str, Any]:
    """Keyword arguments for aiokafka clients."""
    conf: dict[str, Any] = {"bootstrap_servers": s.kafka_bootstrap, "security_protocol": s.kafka_security_protocol}
    if s.kafka_security_protocol.startswith("SASL"):
        conf |= {"sasl_mechanism": s.kafka_sasl_mechanism, "sasl_plain_username": s.kafka_sasl_username,
                 "sasl_plain_password": s.kafka_sasl_password.get()}
    if s.kafka_security_protocol.endswith("SSL"):
        ctx = ssl.create_default_context(cafile=s.kafka_ssl_cafile or None)
        if s.kafka_ssl_certfile:
            ctx.load_cert_chain(s.kafka_ssl_certfile, s.kafka_ssl_keyfile or None)
        conf["ssl_context"] = ctx
    return conf
