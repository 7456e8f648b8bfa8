"""The producer surfaces delivery failures; the native ClickHouse backend fails loudly, not silently."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agents.kafka.producer import DeliveryError, SampleProducer
from agents.settings import Settings
from agents.sinks.clickhouse import Backend, ClickHouseError, NativeBackend, open_backend
from agents.sinks.schema import ensure_schema
from tests.integration.conftest import ROOT

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


def test_the_frames_retention_is_the_setting_and_follows_a_change(base_settings: Settings) -> None:
    """gpu_frames' TTL is FLOPWATCH_FRAMES_RETENTION_DAYS; starting with another value changes the table."""
    from schemas.ddl import ttl_days_of

    def ttl(backend: Backend) -> int | None:
        _, rows = backend.rows("SELECT create_table_query FROM system.tables WHERE database = "
                               f"'{base_settings.clickhouse_database}' AND name = 'gpu_frames'")
        return ttl_days_of(str(rows[0][0]))

    backend = open_backend(base_settings)
    try:
        ensure_schema(backend, 30)
        assert ttl(backend) == 30
        ensure_schema(backend, 45)  # a restart with another retention
        assert ttl(backend) == 45
        ensure_schema(backend, 45)  # and again: nothing to change
        assert ttl(backend) == 45
    finally:
        backend.close()


def test_native_backend_over_tls_with_a_password_trusts_the_servers_ca_only(native_settings: Settings) -> None:
    """deploy/clickhouse.sh serves the native protocol over TLS on its port + 440, with a throw-away CA."""
    ca = Path(os.environ.get("FLOPWATCH_STATE_DIR", ROOT / ".flopwatch")) / "clickhouse" / "tls" / "ca.pem"
    tls = native_settings.replace(clickhouse_port=native_settings.clickhouse_port + 440, clickhouse_secure=True,
                                  clickhouse_ca_certs=str(ca))
    backend = NativeBackend(tls, attempts=1)
    # 18.16 has no currentUser(): the running query's own row in system.processes names its user.
    mark = "SELECT any(user) FROM system.processes WHERE query LIKE '%tls-user-check%'"
    assert backend.rows(mark)[1] == [(native_settings.clickhouse_user,)]
    backend.close()
    untrusted = NativeBackend(tls.replace(clickhouse_ca_certs=""), attempts=1)  # the system's CAs only
    with pytest.raises(ClickHouseError, match=r"unreachable.*(certificate|SSL)") as err:
        untrusted.rows("SELECT 1")
    assert tls.clickhouse_password.get() not in str(err.value)
    plain = NativeBackend(tls.replace(clickhouse_secure=False), attempts=1)  # plain text to the TLS port
    with pytest.raises(ClickHouseError):
        plain.rows("SELECT 1")


def test_a_statements_parameters_are_the_backends_to_quote(any_settings: Settings) -> None:
    """What the rollup repair relies on: a node name goes to the server as a parameter, quotes and all."""
    backend = open_backend(any_settings)
    try:
        ensure_schema(backend)
        db = any_settings.clickhouse_database
        backend.execute(f"CREATE TABLE {db}.params_t (node String, hour UInt32) ENGINE = Memory")
        node = "rack'7\\gpu \"a\" -- ;"
        backend.execute(f"INSERT INTO {db}.params_t SELECT {backend.param('node', 'String')}, "
                        f"{backend.param('hour', 'UInt32')}", {"node": node, "hour": 1_796_198_400})
        _, rows = backend.rows(f"SELECT node, hour FROM {db}.params_t")
        assert rows == [(node, 1_796_198_400)]
    finally:
        backend.close()
