"""Every producer of flopwatch waits for all in-sync replicas and is idempotent (a replicated cluster's contract)."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from aiokafka import AIOKafkaConsumer
from faust.transport.drivers.aiokafka import Transport

from agents.app import create_app
from agents.kafka.faust_producer import AGENT_FETCH_WAIT_MS, IdempotentProducer, PromptConsumer
from agents.kafka.producer import producer_config
from agents.settings import SettingsError, load_settings


def test_the_faust_apps_producer_of_alerts_and_triggers_is_idempotent_with_acks_all() -> None:
    async def made() -> tuple[object, int, bool]:
        app = create_app(load_settings({}, web_enabled=False))
        producer = app.producer
        assert isinstance(producer, IdempotentProducer)
        client = producer._new_producer()  # the aiokafka producer it would start
        return producer, client._sender._acks, client._txn_manager is not None

    producer, acks, idempotent = asyncio.run(made())
    assert isinstance(producer, IdempotentProducer) and acks == -1 and idempotent


def test_the_agents_consumer_waits_in_the_broker_at_most_a_tenth_of_a_second_not_fausts_one_and_a_half() -> None:
    async def made() -> AIOKafkaConsumer:
        app = create_app(load_settings({}, web_enabled=False))
        assert isinstance(app.consumer, PromptConsumer)
        transport = app.transport
        assert isinstance(transport, Transport)
        return app.consumer._thread._create_worker_consumer(transport)  # the aiokafka consumer it would start

    client = asyncio.run(made())
    assert client._fetch_max_wait_ms == AGENT_FETCH_WAIT_MS == 100
    assert client._group_id and not client._enable_auto_commit  # Faust's other settings kept
    # aiokafka builds its fetcher from the attribute when the consumer starts: an upgrade that stops doing so fails here.
    assert "fetch_max_wait_ms=self._fetch_max_wait_ms" in inspect.getsource(AIOKafkaConsumer.start)


def test_the_sample_frames_and_dead_letter_producers_are_idempotent_with_acks_all_whatever_the_overrides() -> None:
    conf = producer_config(load_settings({}), **{"linger.ms": 5, "acks": "1", "enable.idempotence": False})
    assert conf["acks"] == "all" and conf["enable.idempotence"] is True and conf["linger.ms"] == 5


def test_min_insync_replicas_defaults_to_one_less_than_the_replication_and_is_validated() -> None:
    assert [load_settings({}, replication=r).min_insync() for r in (1, 2, 3, 5)] == [1, 1, 2, 2]
    assert load_settings({}, replication=3, min_insync_replicas=3).min_insync() == 3
    with pytest.raises(SettingsError, match=r"min_insync_replicas=4: must be between 1 and the replication \(3\)"):
        load_settings({}, replication=3, min_insync_replicas=4)
