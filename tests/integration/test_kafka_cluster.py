"""A three-broker KRaft cluster (``deploy/kafka.sh start --brokers 3``): the broker that leads most of
flopwatch's partitions is SIGKILLed mid-run and restarted, then another; nothing is lost or doubled.

The cluster runs beside the session's single broker, on its own ports and directory.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from agents.kafka.admin import delete_topics, ensure_topics
from agents.kafka.topics import Topics, confluent_config
from agents.settings import Settings, load_settings
from agents.sinks.clickhouse import NativeBackend
from streams.sim.simulate import SimParams
from tests.integration.helpers import live_run
from tests.integration.own_services import OwnKafka
from tests.integration.test_bursts import wait_exact, whole_second

pytestmark = pytest.mark.integration

PORT = 19092  # brokers on 19092, 19094, 19096; their controllers one above each


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnKafka]:
    c = OwnKafka(tmp_path_factory.mktemp("kafka-cluster"), PORT, brokers=3)
    c.start()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def cluster_settings(cluster: OwnKafka, service_env: dict[str, str]) -> Iterator[Settings]:
    """Fresh topics on the cluster (replication 3); frames to the session's clickhouse-server, which the
    checks read while the worker runs."""
    tag = os.urandom(4).hex()
    env = {k: v for k, v in service_env.items() if k.startswith("FLOPWATCH_CLICKHOUSE")}
    # A SIGKILLed leader's partitions stall their producers for the controller's broker session timeout (9 s) plus
    # the producers' metadata refresh and retries: on the loaded CI machine, beside other tests, once more than the
    # default 15 s idle bound (3 samples late of 45,295). The idle bound must outlast a failover (docs/operations.md).
    settings = load_settings(env, kafka_bootstrap=cluster.bootstrap, replication=3, topic_prefix=f"c{tag}.",
                             group_id=f"g{tag}", partitions=4, clickhouse_database=f"fw_{tag}",
                             clickhouse_backend="native", clickhouse_layout="legacy", source_idle_s=30.0,
                             flush_interval_ms=300, lateness_ms=1000, web_enabled=False)
    ensure_topics(settings)
    yield settings
    delete_topics(settings)
    backend = NativeBackend(settings)
    backend.execute(f"DROP DATABASE IF EXISTS {settings.clickhouse_database}")
    backend.close()


def leader_of_most(settings: Settings, but: set[int]) -> int:
    """The broker that leads most partitions of this run's topics (ties: the lowest id)."""
    meta = AdminClient(confluent_config(settings)).list_topics(timeout=30)
    lead = collections.Counter(p.leader for t in Topics(settings.topic_prefix).all if t in meta.topics
                               for p in meta.topics[t].partitions.values() if p.leader not in but)
    return min(lead, key=lambda b: (-lead[b], b))


def test_the_topics_are_replicated_three_times_with_two_in_sync_required(cluster_settings: Settings) -> None:
    admin = AdminClient(confluent_config(cluster_settings))
    topic = Topics(cluster_settings.topic_prefix).frames
    deadline = time.monotonic() + 30
    while topic not in (meta := admin.list_topics(timeout=30)).topics and time.monotonic() < deadline:
        time.sleep(0.5)  # the broker answering may learn of a new topic a moment after its creation
    assert len(meta.brokers) == 3
    assert {len(p.replicas) for p in meta.topics[topic].partitions.values()} == {3}
    for _ in range(60):  # likewise for its configuration
        [conf] = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
        try:
            assert conf.result(30)["min.insync.replicas"].value == "2"
            break
        except KafkaException as exc:
            assert exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, exc
            time.sleep(0.5)
    else:
        raise AssertionError(f"no broker described {topic} within 30 s")


def test_two_broker_kills_mid_run_lose_and_duplicate_nothing(cluster: OwnKafka, cluster_settings: Settings) -> None:
    settings = cluster_settings
    killed: list[int] = []
    with live_run(settings, SimParams(nodes=2, gpus=2, seed=65, start_ns=whole_second(0)), 80.0) as (
            pub, worker, producing):
        worker.wait_for(lambda st: st["frames_written"] > 0)
        for _ in range(2):
            time.sleep(10.0)
            victim = leader_of_most(settings, set(killed))
            cluster.kill(victim)
            killed.append(victim)
            time.sleep(15.0)
            cluster.start()  # the killed broker comes back and catches up
        producing.join(150)
        assert not producing.is_alive()
        last = wait_exact(worker, settings, list(pub.sent), timeout_s=180)
        assert last["samples"] == pub.stats.samples and len(set(killed)) == 2
