"""Creating and checking topics: every input topic must share one partition count, and the cluster
must have the brokers the replication asks for."""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic  # type: ignore[attr-defined]

from agents.kafka.topics import Topics, confluent_config
from agents.settings import Settings

log = logging.getLogger(__name__)


class TopicLayoutError(RuntimeError):
    """Existing topics disagree with the configured partition count."""


class KafkaUnavailable(RuntimeError):
    """Kafka could not be reached, or refused flopwatch's credentials; the text says which (never the secret)."""


def metadata(settings: Settings, timeout_s: float = 30.0) -> tuple[AdminClient, ClusterMetadata]:
    """An admin client and the cluster's metadata; fails fast, and clearly, on refused credentials."""
    errors: list[KafkaError] = []
    admin = AdminClient(confluent_config(settings) | {"error_cb": errors.append})
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return admin, admin.list_topics(timeout=min(2.0, timeout_s))
        except KafkaException as exc:
            admin.poll(0.1)  # serves the error callback
            refused = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
            if refused:
                raise KafkaUnavailable(
                    f"Kafka at {settings.kafka_bootstrap} refused the credentials of user "
                    f"{settings.kafka_sasl_username!r} ({settings.kafka_sasl_mechanism} over "
                    f"{settings.kafka_security_protocol}): check FLOPWATCH_KAFKA_SASL_USERNAME and "
                    f"FLOPWATCH_KAFKA_SASL_PASSWORD ({refused[-1].str()})") from None
            if time.monotonic() >= deadline:
                last = errors[-1].str() if errors else str(exc)
                raise KafkaUnavailable(f"cannot reach Kafka at {settings.kafka_bootstrap} "
                                       f"({settings.kafka_security_protocol}) within {timeout_s:g} s: {last}") from None


def ensure_topics(settings: Settings, timeout_s: float = 30.0) -> list[str]:
    """Create missing topics; fail loudly if existing ones break co-partitioning."""
    topics = Topics(settings.topic_prefix)
    admin, meta = metadata(settings, timeout_s)
    missing = [t for t in topics.all if t not in meta.topics]
    if missing and len(meta.brokers) < settings.replication:
        raise TopicLayoutError(
            f"FLOPWATCH_REPLICATION={settings.replication} but the cluster at {settings.kafka_bootstrap} has "
            f"{len(meta.brokers)} broker(s) up; start the others or lower the replication")
    if missing:
        config = {"min.insync.replicas": str(settings.min_insync())}
        futures = admin.create_topics(
            [NewTopic(t, num_partitions=settings.partitions, replication_factor=settings.replication, config=config)
             for t in missing],
            operation_timeout=timeout_s,
        )
        for _name, fut in futures.items():
            try:
                fut.result(timeout_s)
            except Exception as exc:  # a concurrent worker may have created it first
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
        meta = _until_listed(admin, missing, timeout_s)
    thin = sorted(t for t in topics.all if t in meta.topics and any(
        len(p.replicas) < settings.replication for p in meta.topics[t].partitions.values()))
    if thin:  # made earlier with a lower replication: they work, but say so (Kafka cannot raise it in place)
        log.warning("%d topic(s) have fewer replicas than FLOPWATCH_REPLICATION=%d (e.g. %s); reassign their "
                    "partitions (kafka-reassign-partitions) to replicate them", len(thin), settings.replication,
                    thin[0])
    wrong = {t: len(meta.topics[t].partitions) for t in topics.inputs
             if t in meta.topics and len(meta.topics[t].partitions) != settings.partitions}
    if wrong:
        detail = ", ".join(f"{t}={n}" for t, n in sorted(wrong.items()))
        raise TopicLayoutError(
            f"input topics must all have {settings.partitions} partitions so one worker sees every stream "
            f"of a node; found {detail}. Set FLOPWATCH_PARTITIONS or repartition the topics.")
    return missing


def _until_listed(admin: AdminClient, created: list[str], timeout_s: float) -> ClusterMetadata:
    """The cluster's metadata once every created topic is in it with its partitions. A broker learns of a new
    topic from the controller a moment after the creation is acknowledged: a client started at once (a collector
    that checks its topic) could otherwise be told the topic is not there."""
    deadline = time.monotonic() + timeout_s
    while True:
        meta = admin.list_topics(timeout=timeout_s)
        unseen = [t for t in created if t not in meta.topics or meta.topics[t].error is not None
                  or not meta.topics[t].partitions]
        if not unseen:
            return meta
        if time.monotonic() >= deadline:
            raise TopicLayoutError(f"{len(unseen)} topic(s) created but not in the cluster's metadata after "
                                   f"{timeout_s:g} s (e.g. {unseen[0]})")
        time.sleep(0.1)


def delete_topics(settings: Settings, timeout_s: float = 30.0) -> None:
    admin = AdminClient(confluent_config(settings))
    futures = admin.delete_topics(Topics(settings.topic_prefix).all, operation_timeout=timeout_s)
    for fut in futures.values():
        try:
            fut.result(timeout_s)
        except Exception as exc:
            if "UNKNOWN_TOPIC" not in str(exc):
                raise
