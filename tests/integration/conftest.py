"""Real services for integration tests: Kafka (KRaft) and clickhouse-server, started once per session.

If ``FLOPWATCH_KAFKA_BOOTSTRAP`` is set, the tests use that broker and the ClickHouse
server named by ``FLOPWATCH_CLICKHOUSE_*``; otherwise they start both with
``deploy/services.sh`` and stop them afterwards. Nothing is skipped.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.kafka.admin import delete_topics, ensure_topics
from agents.settings import Settings, load_settings
from agents.sinks.clickhouse import NativeBackend

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def service_env() -> Iterator[dict[str, str]]:
    if os.environ.get("FLOPWATCH_KAFKA_BOOTSTRAP"):
        yield {k: v for k, v in os.environ.items() if k.startswith("FLOPWATCH_")}
        return
    out = subprocess.run([str(ROOT / "deploy/services.sh"), "start"], check=True, capture_output=True, text=True,
                         timeout=600)
    env: dict[str, str] = {}
    for line in out.stdout.splitlines():
        if line.startswith("export "):
            key, _, val = line[len("export "):].partition("=")
            env[key] = shlex.split(val)[0] if val else ""
    try:
        yield env
    finally:
        subprocess.run([str(ROOT / "deploy/services.sh"), "stop"], check=False, timeout=120)


@pytest.fixture
def base_settings(service_env: dict[str, str], tmp_path: Path) -> Iterator[Settings]:
    """Fresh topics (unique prefix), consumer group and embedded ClickHouse directory per test."""
    tag = uuid.uuid4().hex[:8]
    env = {k: v for k, v in service_env.items() if not k.startswith("FLOPWATCH_CLICKHOUSE")}
    settings = load_settings(env, topic_prefix=f"t{tag}.", group_id=f"g{tag}", partitions=4,
                             chdb_path=str(tmp_path / "chdb"), clickhouse_database=f"fw_{tag}",
                             source_idle_s=1.0, flush_interval_ms=300, lateness_ms=1000, clock_wait_s=1.0,
                             web_enabled=False)  # tests that want the pages pick a free port
    ensure_topics(settings)
    yield settings
    delete_topics(settings)


@pytest.fixture
def native_settings(base_settings: Settings, service_env: dict[str, str]) -> Iterator[Settings]:
    """The same, writing to the real clickhouse-server over the native protocol (18.16: legacy layout)."""
    env = {k: v for k, v in service_env.items() if k.startswith("FLOPWATCH_CLICKHOUSE")}
    settings = load_settings(env, **{f: getattr(base_settings, f) for f in (
        "kafka_bootstrap", "topic_prefix", "group_id", "partitions", "clickhouse_database", "source_idle_s",
        "flush_interval_ms", "lateness_ms", "clock_wait_s")}, clickhouse_backend="native", clickhouse_layout="legacy")
    yield settings
    backend = NativeBackend(settings)
    backend.execute(f"DROP DATABASE IF EXISTS {settings.clickhouse_database}")
    backend.close()


@pytest.fixture(params=["chdb", "native"])
def any_settings(request: pytest.FixtureRequest, base_settings: Settings) -> Settings:
    if request.param == "chdb":
        return base_settings
    native: Settings = request.getfixturevalue("native_settings")
    return native
