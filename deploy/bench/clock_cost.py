"""What clock correction costs the worker per sample, without Kafka's and ClickHouse's noise.

    python deploy/bench/clock_cost.py [--samples 2000000] [--rounds 15]

The same simulated cluster is published twice to a real broker: once with every stream
in UTC, once with each node's GPU streams stamped by a skewed, drifting GPU clock (plus
its clock.sync beacons). Both are fetched once into memory, poll by poll as the worker
would get them; then the worker's own processing of those polls (decode and
validation, beacons and fits, holding and correcting domain samples, alignment into
frames) is timed in this thread, the two alternating for ``--rounds`` rounds. Fetching
and the ClickHouse inserts, identical for both, are left out: on a 2-core machine they
are where most of the run-to-run noise of ``throughput.py`` comes from.

Needs a Kafka broker (FLOPWATCH_KAFKA_BOOTSTRAP, default 127.0.0.1:9092).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import publish

from agents.ingest.core import IngestCore
from agents.kafka.admin import delete_topics, ensure_topics
from agents.kafka.producer import SampleProducer
from agents.kafka.topics import Topics, aiokafka_config
from agents.settings import Settings, load_settings
from agents.sinks.clickhouse import open_backend
from agents.sinks.deadletter import DeadLetter
from agents.sinks.store import FrameStore, Progress
from streams.align.aligner import Recovered

Poll = dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]


async def fetch(settings: Settings, messages: int) -> list[Poll]:
    """Every input record (``messages`` sample messages, and the events and beacons with
    them), in the polls a worker's consumer hands over."""
    topics = Topics(settings.topic_prefix)
    consumer = AIOKafkaConsumer(*topics.inputs, **aiokafka_config(settings), group_id=f"fetch-{uuid.uuid4().hex[:6]}",
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                max_poll_records=settings.max_poll_records, fetch_max_bytes=64 * 1024 * 1024,
                                max_partition_fetch_bytes=4 * 1024 * 1024)
    await consumer.start()
    polls: list[Poll] = []
    seen = 0
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=1000)
            if not batch and seen >= messages:
                break
            if batch:
                polls.append(batch)
                seen += sum(len(r) for r in batch.values())
    finally:
        await consumer.stop()
    return polls


def process(settings: Settings, polls: list[Poll], store: FrameStore, dlq: DeadLetter) -> tuple[float, int, int]:
    """Seconds of this thread's CPU to turn ``polls`` into frames; samples and frames made."""
    core = IngestCore(settings, store, dlq)
    sensors = Topics(settings.topic_prefix).sensors
    # As after an assignment of every partition: each sensor topic holds until it delivers. The
    # quiet clocks stay at 0 (no stream counts as idle), which leaves the watermark rule's cost in.
    quiet = {TopicPartition(t, p): 0 for p in range(settings.partitions) for t in sensors}
    core.assign([*quiet, *(TopicPartition(t, p) for p in range(settings.partitions)
                           for t in Topics(settings.topic_prefix).inputs if t not in sensors)], Progress(Recovered()))
    store.detach()
    gc.collect()
    t0 = time.thread_time()
    for poll in polls:
        core.handle(poll)
        core.advance(quiet)
    core.drain()
    cpu = time.thread_time() - t0
    frames = store.pending_rows
    store.detach()
    return cpu, core.stats.samples, frames


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    base = load_settings()
    tag = uuid.uuid4().hex[:6]
    runs = {"utc": base.replace(topic_prefix=f"cu{tag}."), "domains": base.replace(topic_prefix=f"cd{tag}.")}
    polls: dict[str, list[Poll]] = {}
    sent: dict[str, dict[str, Any]] = {}
    for st in runs.values():
        ensure_topics(st)
    try:
        for name, st in runs.items():
            sent[name] = publish(st, args.samples, 100, clock_domains=name == "domains")
            polls[name] = asyncio.run(fetch(st, sent[name]["messages"]))
    finally:
        for st in runs.values():
            delete_topics(st)
    ns: dict[str, list[float]] = {"utc": [], "domains": []}
    with tempfile.TemporaryDirectory() as tmp:
        backend = open_backend(base.replace(chdb_path=f"{tmp}/chdb"))  # never written to: inserts are not timed
        store, dlq = FrameStore(backend), DeadLetter(SampleProducer(base), Topics(base.topic_prefix).dlq)
        frames: dict[str, int] = {}
        for r in range(args.rounds):
            for name in ("utc", "domains") if r % 2 == 0 else ("domains", "utc"):
                cpu, samples, frames[name] = process(runs[name], polls[name], store, dlq)
                assert samples == sent[name]["samples"] and not dlq.counts, (samples, dlq.counts)
                ns[name].append(cpu * 1e9 / samples)
        backend.close()
    ratios = [u / d for u, d in zip(ns["utc"], ns["domains"], strict=True)]
    print(json.dumps({
        "date": time.strftime("%Y-%m-%d"), "samples": sent["utc"]["samples"], "rounds": args.rounds,
        "frames": frames,
        "utc_ns_per_sample": round(statistics.median(ns["utc"])),
        "domains_ns_per_sample": round(statistics.median(ns["domains"])),
        "clock_correction_ns_per_sample": round(statistics.median(ns["domains"]) - statistics.median(ns["utc"])),
        "rate_domains_over_utc": round(statistics.median(ratios), 3),
        "per_round": [round(x, 3) for x in ratios],
    }, indent=2))


if __name__ == "__main__":
    main()
