"""The producer surfaces delivery failures; the native ClickHouse backend fails loudly, not silently."""

from __future__ import annotations

import time

import pytest

from agents.kafka.producer import DeliveryError, SampleProducer
from agents.settings import Settings
from agents.sinks.clickhouse import ClickHouseError, NativeBackend, ensure_schema

pytestmark = pytest.mark.integration


def test_undeliverable_messages_raise_on_flush(base_settings: Settings) -> None:
    # The broker does not auto-create topics, so this one cannot take the message.
    producer = SampleProducer(base_settings, **{"message.timeout.ms": 3000})
    producer.send(f"{base_settings.topic_prefix}no.such.topic", b"{}", "node-00")
    with pytest.raises(DeliveryError, match=r"not delivered|unacknowledged"):
        producer.flush(timeout_s=20)
    # Delivered messages are counted and a clean flush passes.
    producer.send(f"{base_settings.topic_prefix}sensors.power", b"{}", "node-00")
    producer.flush(timeout_s=20)
    assert producer.delivered == 1


def test_native_backend_retries_then_names_the_server(native_settings: Settings) -> None:
    down = native_settings.replace(clickhouse_port=1)  # nothing listens there
    t0 = time.monotonic()
    backend = NativeBackend(down, attempts=3, backoff_s=0.05)
    with pytest.raises(ClickHouseError, match="unreachable") as err:
        backend.rows("SELECT 1")
    assert "127.0.0.1:1" in str(err.value) and time.monotonic() - t0 < 30
    assert down.clickhouse_password.get() not in str(err.value)


def test_native_backend_password_auth_and_columnar_insert(native_settings: Settings) -> None:
    backend = NativeBackend(native_settings)
    ensure_schema(backend)
    db = native_settings.clickhouse_database
    backend.insert("ingest_progress", {"topic": ["t", "t"], "partition": [0, 1], "offset": [5, 7],
                                       "written_at": [1, 2]})
    _, rows = backend.rows(f"SELECT partition, offset FROM {db}.ingest_progress ORDER BY partition")
    assert rows == [(0, 5), (1, 7)]
    wrong = NativeBackend(native_settings.replace(clickhouse_password=type(native_settings.clickhouse_password)("x")),
                          attempts=1)
    with pytest.raises(ClickHouseError, match=r"refused|password|Authentication"):
        wrong.rows("SELECT 1")
