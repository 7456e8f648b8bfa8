"""The NVML collector with the pynvml double, publishing into real Kafka for ~3 s; read back and
decoded, then placed on the grid by a real worker (the beacons put the nvml clock on UTC)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import cast

import pytest

from agents.collect.nvml import NvmlCollector
from agents.collect.sdk import Publisher
from agents.kafka.topics import Topics
from agents.settings import Settings
from schemas.catalog import BY_NAME
from schemas.codec import decode_beacon, decode_samples
from schemas.records import ClockBeacon, SampleBatch
from tests.doubles import fake_pynvml as fake
from tests.doubles.fake_pynvml import FakeNvml, ProcessInfo
from tests.integration.helpers import run_worker_until_idle, stored_frames
from tests.integration.test_sdk import read_topics

pytestmark = pytest.mark.integration

UID = "1b2c3d4e-0000-4a5b-8c9d-0123456789ab"
NVML_STREAMS = ("gpu_util", "fb_used", "power", "temperature", "sm_clock", "pcie_tx", "pcie_rx", "nvlink_tx",
                "nvlink_rx", "ecc_errors", "xid_errors")


def test_collector_publishes_decodable_labelled_samples(base_settings: Settings, tmp_path: Path) -> None:
    (tmp_path / "4711").mkdir()
    (tmp_path / "4711" / "cgroup").write_text(f"11:memory:/kubepods/burstable/pod{UID}/{'ab' * 32}\n")
    gpus = fake.gpus(4)
    gpus[0].processes = [ProcessInfo(4711, 8 * 2**30)]
    gpus[3].unsupported = {"nvmlDeviceGetFieldValues"}
    gpus[2].xids = [79]
    node = "node-nv"
    topics = Topics(base_settings.topic_prefix)
    with Publisher(base_settings, max_age_ms=100) as pub:
        collector = NvmlCollector(FakeNvml(gpus), pub, node, region="eu-west", proc_root=tmp_path)
        collector.open()
        stats = collector.run(0.1, duration_s=3.0, stop=threading.Event())
        collector.close()
    assert pub.stats.dropped == 0 and pub.stats.failed == 0
    assert pub.stats.delivered == stats.samples and stats.ticks >= 25

    sensor_topics = [topics.prefix + BY_NAME[s].topic for s in NVML_STREAMS]
    msgs = read_topics(base_settings, sensor_topics, want=pub.stats.messages)
    per: Counter[tuple[str, str]] = Counter()
    domain_max = 0
    for topic, key, raw in msgs:
        sensor = topic.removeprefix(topics.prefix + "sensors.")
        batch = decode_samples(raw, sensor)
        assert isinstance(batch, SampleBatch), batch
        assert key == node.encode() and batch.node == node and batch.clock == f"nvml:{node}"
        assert batch.labels is not None
        assert batch.labels["gpu_model"] == "NVIDIA H200" and batch.labels["region"] == "eu-west"
        if batch.gpu.endswith("/pid:4711"):
            assert batch.labels["pid"] == 4711 and batch.labels["pod"] == UID
        elif batch.gpu == gpus[0].uuid:
            assert batch.labels["pod"] == UID
        else:
            assert "pod" not in batch.labels
        per[(sensor, batch.gpu)] += len(batch)
        domain_max = max(domain_max, max(batch.ts_ns))
    assert sum(per.values()) == stats.samples
    ticks = stats.ticks
    for g in gpus:
        for s in ("gpu_util", "fb_used", "power", "temperature", "sm_clock", "ecc_errors", "xid_errors"):
            assert per[(s, g.uuid)] == ticks, (s, g.uuid)
    for g in gpus[:3]:
        for s in ("pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx"):
            assert per[(s, g.uuid)] == ticks - 1  # a rate needs two readings of the counters
    assert per[("nvlink_tx", gpus[3].uuid)] == 0  # no field values there
    assert 2 <= per[("pcie_tx", gpus[3].uuid)] <= 4  # the blocking throughput call, about once a second
    assert per[("fb_used", f"{gpus[0].uuid}/pid:4711")] == ticks

    beacons = [decode_beacon(raw) for _, _, raw in read_topics(base_settings, [topics.clock_sync], want=4)]
    assert all(isinstance(b, ClockBeacon) and b.clock == f"nvml:{node}" for b in beacons)
    assert 3 <= len(beacons) <= 6
    assert max(b.domain_ns for b in beacons if isinstance(b, ClockBeacon)) > domain_max

    # The pipeline places them: every tick of every GPU lands in a frame, none is rejected no_clock.
    run_worker_until_idle(base_settings, timeout_s=120)
    rows, _ = stored_frames(base_settings)
    power = sum(cast(int, r["n_power"]) for (n, g, _), r in rows.items() if n == node and g == gpus[1].uuid)
    assert power == ticks
    xid_codes = {r["xid_errors"] for (n, g, _), r in rows.items() if g == gpus[2].uuid}
    assert 79.0 in xid_codes


def test_nvml_command_publishes_with_the_double(base_settings: Settings, monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    import sys

    from click.testing import CliRunner

    from agents.cli.nvml import nvml_command

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(fake.gpus(2)))
    monkeypatch.setenv("FLOPWATCH_KAFKA_BOOTSTRAP", base_settings.kafka_bootstrap)
    monkeypatch.setenv("FLOPWATCH_TOPIC_PREFIX", base_settings.topic_prefix)
    monkeypatch.setenv("NODE_NAME", "node-cli")
    result = CliRunner().invoke(nvml_command, ["--duration", "1.5", "--region", "r1", "--proc-root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "dropped 0, failed 0" in result.output
    topics = Topics(base_settings.topic_prefix)
    msgs = read_topics(base_settings, [topics.prefix + "sensors.power"], idle_s=2.0)
    batches = [decode_samples(raw, "power") for _, _, raw in msgs]
    assert batches and all(isinstance(b, SampleBatch) and b.node == "node-cli" and b.labels
                           and b.labels["region"] == "r1" for b in batches)
    assert sum(len(b) for b in batches if isinstance(b, SampleBatch)) >= 2 * 10
