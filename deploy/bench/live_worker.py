"""A default ``flopwatch worker`` started for a live benchmark, and a consumer of its alerts.

Used by ``alert_latency.py`` and ``spike_live.py``: fresh topics under a random prefix, chDB in a
temporary directory (whatever ClickHouse the environment names), the worker's stderr in a log
file, and everything stopped and deleted after.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka import Consumer

from agents.kafka.admin import delete_topics, ensure_topics
from agents.kafka.topics import Topics
from agents.settings import Settings, load_settings, settings_env


@contextmanager
def live_worker(prefix: str) -> Iterator[tuple[Settings, Consumer, str, subprocess.Popen[bytes]]]:
    """(settings, a consumer of the alerts topic from its start, the worker's log, its process) once the worker
    has joined."""
    tag = uuid.uuid4().hex[:6]
    tmp = tempfile.mkdtemp()
    settings = load_settings(topic_prefix=f"{prefix}{tag}.", group_id=f"{prefix}{tag}", chdb_path=f"{tmp}/chdb",
                             clickhouse_backend="chdb", clickhouse_layout="current")
    ensure_topics(settings)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLOPWATCH_")}, **settings_env(settings)}
    log_path = f"{tmp}/worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "agents.cli.main", "worker", "--progress", "none"],
                                  env=env, stderr=log, cwd=Path(__file__).resolve().parents[2])
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": f"{prefix}{tag}-read",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([Topics(settings.topic_prefix).alerts])
    try:
        time.sleep(10.0)  # the worker joins its groups
        yield settings, consumer, log_path, worker
    finally:
        consumer.close()
        worker.terminate()
        worker.wait(60)
        delete_topics(settings)
