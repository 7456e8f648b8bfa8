"""Issue 22 §5: a flood far above the worker's capacity. Three million single-sample messages (the most
expensive form per sample) are produced as fast as the producer goes, about twice what the default worker
(Faust runtime) reads: its lag on ``/metrics`` grows while the flood lasts and falls to 0 after, it reads at
a steady rate without stalling, and its memory does not grow with what it has read."""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from agents.kafka.producer import SampleProducer
from agents.kafka.topics import Topics
from agents.settings import Settings
from schemas.catalog import BY_NAME
from tests.agents.test_web import free_port
from tests.integration.helpers import Worker

pytestmark = pytest.mark.integration
S = 1_000_000_000
NODES, GPUS, SECONDS, HZ = 16, 8, 300, 10
FLOOD_SENSORS = {"power": 300.0, "gpu_util": 55.0, "sm_active": 0.5, "temperature": 60.0, "fb_used": 4000.0,
                 "sm_clock": 1400.0, "pcie_tx": 1000.0, "pcie_rx": 1000.0}


def flood(settings: Settings) -> int:
    """Five minutes of eight sensors of a 16 x 8 cluster at 10 Hz, one sample a message, as fast as the
    producer takes them; the messages sent."""
    topics = Topics(settings.topic_prefix)
    producer = SampleProducer(settings)
    start = (time.time_ns() // S - SECONDS - 5) * S
    sent = 0
    for k in range(SECONDS * HZ):
        t = start + k * (S // HZ)
        for name, level in FLOOD_SENSORS.items():
            topic, value = topics.sensor(BY_NAME[name].index), level * (1 + k % 7 / 100)
            for n in range(NODES):
                node = f"node-{n:02d}"
                for g in range(GPUS):
                    producer.send(topic, b'{"v":1,"node":"%s","gpu":"%d","ts_ns":%d,"value":%.3f}'
                                  % (node.encode(), g, t, value), node)
                    sent += 1
    producer.flush()
    return sent



def scrape(port: int) -> dict[str, float]:
    """The worker's lag and samples read, from its metrics page; {} while the page is not up."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out = {}
    for name in ("flopwatch_consumer_lag", "flopwatch_samples_total", "flopwatch_open_cells"):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        if m:
            out[name] = float(m.group(1))
    return out


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")) / 1024


def test_a_flood_keeps_memory_flat_a_steady_rate_and_lag_on_metrics(native_settings: Settings) -> None:
    # clickhouse-server, not the embedded chDB: chDB's caches and parts live in the worker's process and
    # added 300-400 MiB in the same flood.
    port = free_port()
    # Idle after 5 s, not the fixture's 1 s: a producer this saturated holds a partition's batches back for
    # seconds at times, and a stream that far behind its peers is late by the rule (docs/time.md).
    settings = native_settings.replace(web_enabled=True, web_bind="127.0.0.1", web_port=port, source_idle_s=5.0)
    worker = Worker(settings, "--runtime", "faust")
    readings: list[tuple[float, float, float, float, float]] = []  # (time, lag, samples read, RSS MiB, open)
    flooded: list[int] = []
    flooding_until: list[float] = []

    def produce() -> None:
        flooded.append(flood(settings))
        flooding_until.append(time.monotonic())

    producer = threading.Thread(target=produce, daemon=True)
    try:
        worker.wait_for_log("assigned partitions [", timeout_s=120)
        producer.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            got = scrape(port)
            lag, samples = got.get("flopwatch_consumer_lag"), got.get("flopwatch_samples_total")
            if lag is not None and samples is not None and lag == lag:  # NaN until the first flush
                readings.append((time.monotonic(), lag, samples, rss_mib(worker.proc.pid),
                                 got.get("flopwatch_open_cells", -1.0)))
                if flooded and lag == 0 and samples >= flooded[0]:
                    break
            assert worker.proc.poll() is None, "".join(worker.tail)[-3000:]
            time.sleep(0.25)
    finally:
        producer.join(300)
        assert worker.stop() == 0
    sent = flooded[0]
    stats = worker.drain()
    # Read once: no replay (a group session lost under the load would replay from the last commit).
    assert stats["messages"] == sent and stats["replayed_dropped"] == 0 and stats["commits_refused"] == 0, stats
    assert set(stats["rejects"]) <= {"late"}, stats["rejects"]  # any late sample is dead-lettered, and counted
    assert readings and readings[-1][1] == 0, f"lag never reached 0: {readings[-5:]}"
    assert readings[-1][2] == sent, (readings[-1], sent)
    # Lag was reported while the flood came and was read, and it came down to 0. (Not monotonically: each
    # partition's end is as of its latest fetch answer, so a partition answered late raises the sum.)
    # Counted in time, not in readings: a scrape of a saturated worker's page takes up to a second, so the
    # number of readings in the same span of lag varies with the machine's load.
    flooding = [r for r in readings if r[1] > 0]
    assert len(flooding) >= 3 and flooding[-1][0] - flooding[0][0] >= 2.0, readings
    after = [r[1] for r in readings if r[0] > flooding_until[0]]
    # The flood outran the worker: a worker that keeps up lags by a poll or two (a few thousand records). How
    # far it fell behind depends on the two processes' shares of the cores (CI once saw 267,219; with the native
    # poll decoder 53,984, under the sent / 40 this asked for before).
    assert max(r[1] for r in readings) > sent / 100, "the flood must outrun the worker"
    # A steady rate: whenever records were waiting, more were read within 5 s (the page moves at each flush, and
    # a flush waits for the previous write on a machine the producer saturates; a reading of lag 0 mid-flood
    # is the worker level with the producer: nothing to read).
    start = next(r for r in readings if r[2] > 0)
    for a in readings:
        if a[0] >= start[0] and a[1] > 0:
            later = [b for b in readings if b[0] >= a[0] + 5.0]
            if later:
                assert later[0][2] > a[2], f"no samples read for 5 s after {a} with records waiting"
    # Memory stays bounded: under 1 GiB, and the last reading within 300 MiB of the first quarter's. (The
    # growth, 59-224 MiB in runs so far, is the frames held open while partitions are read at uneven speeds:
    # flopwatch_open_cells follows it; the aligner caps open samples at 4 M. See docs/capacity.md.)
    assert max(r[4] for r in readings) > 0, "the open frames were never on /metrics"
    quarter = next(r for r in readings if r[2] >= sent / 4)
    peak = max(r[3] for r in readings)
    assert readings[-1][3] <= quarter[3] + 300 and peak < 1024, (quarter, readings[-1], peak)
    rate = (readings[-1][2] - start[2]) / (readings[-1][0] - start[0])
    if os.environ.get("FLOPWATCH_FLOOD_READINGS"):  # (seconds, lag, samples read, RSS MiB, open cells)
        Path(os.environ["FLOPWATCH_FLOOD_READINGS"]).write_text(
            json.dumps([[round(t - readings[0][0], 2), lag, n, round(m, 1), c] for t, lag, n, m, c in readings]))
    print(f"lag on /metrics after the producer finished: {after}")
    print(f"flood of {sent} single-sample messages: read at {rate:,.0f} samples/s, "
          f"lag on /metrics up to {max(r[1] for r in readings):.0f} and down to 0 in {len(readings)} readings, "
          f"peak RSS {peak:.0f} MiB, {stats['rejects'].get('late', 0)} samples late")
