"""What the ingest's core costs per sample, in this thread, without Kafka or ClickHouse: the batched throughput
case's messages handed to ``IngestCore`` in polls, derive, spike engine, pod labels and the frames' encoding on.

    python deploy/bench/core_cpu.py [--seconds 120] [--poll 2000] [--batch-size 100] [--kafka] [--rounds 5]
                                    [--profile]

``throughput.py`` measures the whole worker against a plain decode loop, and on a 2-core machine that shares its
cores with the broker its rounds scatter by +-20%: too much to see a change of a few per cent in the per-sample
path. Here the simulated 8 x 8 cluster of that case is encoded once into records (100 samples a message, the
simulator's backlog order, each node's records in one of the default worker's partitions), cut into polls of
``--poll`` records (with ``--kafka``, published to a broker and read back in a consumer's polls of at most that
many, as a worker gets them), and every round runs a fresh core over all of them: decode and validation,
alignment, the enricher, and the frames' Kafka encoding (``agents.sinks.frames_out.encode_batch``) as the
worker's publish does. The figure is the best round's samples per second of this thread's CPU time; the digest of
the frame messages (in any order) is the same for any poll size and partitioning.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import hashlib
import json
import pstats
import sys
import time
import uuid
import zlib
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agents.collect.simulator import SimulatorPublisher
from agents.ingest.core import IngestCore
from agents.ingest.pricebook_file import PriceBookFile
from agents.kafka.admin import delete_topics, ensure_topics
from agents.kafka.producer import SampleProducer
from agents.kafka.topics import Topics, aiokafka_config
from agents.runtime.gc_tuning import tune_for_throughput
from agents.runtime.timebase import ManualClock
from agents.settings import Settings, load_settings
from agents.sinks.frames_out import encode_batch
from agents.sinks.store import FrameStore, Progress
from schemas.records import Reject
from streams.align.aggregate import FrameBatch
from streams.align.aligner import Recovered
from streams.efficiency.enrich import Enricher
from streams.sim.simulate import SimParams

S = 1_000_000_000
START_NS = 1_796_000_000 * S  # fixed, so the frames' digest is comparable between runs and versions
Poll = dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]


class _Collected:
    """The producer the simulator publishes through: keeps (topic, value, key) in memory."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, str]] = []

    def send(self, topic: str, value: bytes, key: str, **_: Any) -> None:
        self.sent.append((topic, value, key))

    def poll(self, *_: Any) -> int:
        return 0

    def flush(self, *_: Any) -> int:
        return 0


class _Refused:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def send(self, reject: Reject, *_: Any, **__: Any) -> None:
        self.counts[reject.reason.value] += 1


Record = tuple[TopicPartition, ConsumerRecord[bytes, bytes]]


def records(settings: Settings, seconds: float, batch_size: int = 100) -> tuple[list[Record], int]:
    """The records of ``seconds`` of the 8 x 8 cluster at ``batch_size`` samples a message, in the order they were
    sent, and their samples."""
    params = SimParams(nodes=8, gpus=8, seed=1, start_ns=START_NS)
    pub = SimulatorPublisher(settings, params, batch_size=batch_size)
    pub.producer.close()
    out = _Collected()
    pub.producer = out  # type: ignore[assignment]
    samples = pub.backlog(seconds).samples
    offsets: dict[TopicPartition, int] = defaultdict(int)
    recs: list[Record] = []
    for topic, value, key in out.sent:
        tp = TopicPartition(topic, zlib.crc32(key.encode()) % settings.partitions)
        off = offsets[tp]
        offsets[tp] += 1
        recs.append((tp, ConsumerRecord(topic, tp.partition, off, 0, 0, key.encode(), value, None, len(key),
                                        len(value), [])))
    return recs, samples


def cut(recs: list[Record], size: int) -> list[Poll]:
    polls: list[Poll] = []
    for i in range(0, len(recs), size):
        poll: Poll = defaultdict(list)
        for tp, rec in recs[i:i + size]:
            poll[tp].append(rec)
        polls.append(dict(poll))
    return polls


async def _fetch(settings: Settings, count: int, most: int) -> list[Poll]:
    """Every record of the sensor topics again, in the polls an aiokafka consumer returns of at most ``most``."""
    consumer = AIOKafkaConsumer(*Topics(settings.topic_prefix).inputs, **aiokafka_config(settings),
                                group_id=f"core-{uuid.uuid4().hex[:6]}", auto_offset_reset="earliest",
                                enable_auto_commit=False, fetch_max_bytes=64 * 1024 * 1024,
                                max_partition_fetch_bytes=4 * 1024 * 1024)
    await consumer.start()
    polls: list[Poll] = []
    seen = 0
    try:
        while seen < count:
            batch = await consumer.getmany(timeout_ms=1000, max_records=most)
            if batch:
                polls.append({tp: list(rs) for tp, rs in batch.items()})
                seen += sum(len(rs) for rs in batch.values())
    finally:
        await consumer.stop()
    return polls


def through_kafka(settings: Settings, recs: list[Record], most: int) -> list[Poll]:
    """``recs`` published to fresh topics of a real broker and read back as a worker's consumer polls them: the
    polls hold what its fetches brought, not a clean interleave in time."""
    settings = settings.replace(topic_prefix=f"core{uuid.uuid4().hex[:6]}.")
    topics = Topics(settings.topic_prefix)
    ensure_topics(settings)
    try:
        producer = SampleProducer(settings)
        for tp, rec in recs:
            producer.send(settings.topic_prefix + tp.topic.removeprefix("core."), rec.value or b"",
                          rec.key.decode() if rec.key else None)
        producer.flush()
        producer.close()
        polls = asyncio.run(_fetch(settings, len(recs), most))
    finally:
        delete_topics(settings)
    # Back under the prefix the core is set up for.
    name = {t: f"core.{t.removeprefix(settings.topic_prefix)}" for t in topics.inputs}
    return [{TopicPartition(name[tp.topic], tp.partition): rs for tp, rs in poll.items()} for poll in polls]


def one_round(settings: Settings, polls: list[Poll], grid_ns: int, seconds: float,
              frames_out: Path | None = None) -> tuple[float, int, str]:
    """This thread's CPU seconds for a fresh core to take every poll; samples placed, and a digest of the frame
    messages, in any order (a change to the hot path must keep it; polls of another size make the same)."""
    refused = _Refused()
    store = FrameStore(None)  # type: ignore[arg-type]  # never written: the frames are dropped at each poll
    clock = ManualClock(wall_ns=START_NS + int(seconds * S), mono_ns=0)
    enricher = Enricher(PriceBookFile(None, clock).current, grid_ns)
    core = IngestCore(settings, store, refused, clock, enricher)
    made: list[bytes] = []

    def publish(batch: FrameBatch) -> None:
        made.extend(message for _, _, message in encode_batch(batch, grid_ns))

    core.on_frames = publish
    tps = sorted({tp for poll in polls for tp in poll})
    core.assign(tps, Progress(Recovered()))
    quiet = {tp: 0 for tp in tps if tp.topic in core.sensor_topics}
    t0 = time.thread_time()
    for poll in polls:
        core.handle(poll)
        core.advance(quiet)
        store.detach()
    core.drain()
    store.detach()
    cpu = time.thread_time() - t0
    if refused.counts:
        raise RuntimeError(f"records refused: {dict(refused.counts)}")
    if frames_out is not None:
        frames_out.write_bytes(b"\n".join(sorted(made)) + b"\n")
    return cpu, core.stats.samples, hashlib.sha256(b"".join(sorted(made))).hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0, help="event time of the simulated cluster")
    ap.add_argument("--poll", type=int, default=2_000, help="records per poll")
    ap.add_argument("--batch-size", type=int, default=100,
                    help="samples a message at most (a live collector's carry a few: try 5)")
    ap.add_argument("--kafka", action="store_true",
                    help="the polls as a consumer reads them back from a broker (FLOPWATCH_KAFKA_BOOTSTRAP)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--frames-out", type=Path, help="write the last round's frame messages here, sorted, one a line")
    ap.add_argument("--profile", action="store_true", help="cProfile one more round, to stderr")
    ap.add_argument("--sort", default="tottime", help="the profile's order: tottime or cumulative")
    ap.add_argument("--top", type=int, default=25, help="the profile's rows")
    args = ap.parse_args()
    settings = load_settings({}, topic_prefix="core.")
    grid_ns = settings.align_params().grid_ns
    recs, samples = records(settings, args.seconds, args.batch_size)
    polls = through_kafka(settings, recs, args.poll) if args.kafka else cut(recs, args.poll)
    gc.collect()
    tune_for_throughput()  # the worker's collector settings (``flopwatch worker`` sets them at start)
    cpus = []
    digests: dict[str, str] = {}
    for _ in range(args.rounds):
        cpu, placed, frames = one_round(settings, polls, grid_ns, args.seconds, args.frames_out)
        assert placed == samples, (placed, samples)
        assert digests.setdefault("first", frames) == frames, "two rounds made different frames"
        cpus.append(cpu)
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(one_round, settings, polls, grid_ns, args.seconds)
        pstats.Stats(prof, stream=sys.stderr).sort_stats(args.sort).print_stats(args.top)
    best = min(cpus)
    print(json.dumps({
        "samples": samples, "records": len(recs), "polls": len(polls), "frames_sha256": frames,
        "cpu_s_per_round": [round(c, 3) for c in cpus],
        "best_samples_per_cpu_s": round(samples / best),
        "us_per_sample_best": round(best / samples * 1e6, 4),
    }, indent=1))


if __name__ == "__main__":
    main()
