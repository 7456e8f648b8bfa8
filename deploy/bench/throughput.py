"""Samples/s through the whole path (Kafka -> decode -> align -> chDB) for one worker process,
beside a plain aiokafka consumer that only decodes the same messages, in the same run.

    python deploy/bench/throughput.py [--samples 2000000] [--single-messages 200000] [--profile]
                                      [--case all|batched|single|clock|efficiency|rollups]

``efficiency``: the spine alone (derive and the frames topic off) against the spine plus
derive, frames on Kafka and the detectors run over those frames, alternating in each round; and
the same full path with every detector and attribution against drift and spikes alone.
``rollups``: the default worker with its ClickHouse rollups against the same without them.

Needs a Kafka broker (FLOPWATCH_KAFKA_BOOTSTRAP, default 127.0.0.1:9092; deploy/kafka.sh start).
Prints one JSON object with the figures; the README's performance section quotes them.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agents.collect.simulator import SimulatorPublisher
from agents.ingest.worker import Ingestor
from agents.kafka.admin import delete_topics, ensure_topics
from agents.kafka.topics import Topics, aiokafka_config
from agents.runtime.gc_tuning import tune_for_throughput
from agents.settings import Settings, load_settings
from streams.sim.simulate import SimParams


def publish(settings: Settings, samples: int, batch_size: int, clock_domains: bool = False) -> dict[str, Any]:
    nodes, gpus = 8, 8
    per_second = 9_000  # about what 8 x 8 simulated GPUs emit per second of event time
    duration = max(10.0, samples / per_second)
    params = SimParams(nodes=nodes, gpus=gpus, seed=1, start_ns=time.time_ns() - int(duration * 1e9))
    pub = SimulatorPublisher(settings, params, batch_size=batch_size, clock_domains=clock_domains)
    t0 = time.perf_counter()
    st = pub.backlog(duration)
    return {"messages": st.messages, "samples": st.samples, "publish_s": time.perf_counter() - t0}


async def plain_decode(settings: Settings, messages: int) -> tuple[float, float]:
    """Seconds, and the process's CPU seconds, for a bare aiokafka getmany loop to read and orjson-decode
    ``messages`` records."""
    consumer = AIOKafkaConsumer(*Topics(settings.topic_prefix).sensors, **aiokafka_config(settings),
                                group_id=f"plain-{uuid.uuid4().hex[:6]}", auto_offset_reset="earliest",
                                enable_auto_commit=False, max_poll_records=settings.max_poll_records,
                                fetch_max_bytes=64 * 1024 * 1024, max_partition_fetch_bytes=4 * 1024 * 1024)
    await consumer.start()
    seen, t0, cpu0 = 0, 0.0, 0.0
    loads = orjson.loads
    try:
        while seen < messages:
            batch = await consumer.getmany(timeout_ms=200)
            if batch and not t0:
                t0, cpu0 = time.perf_counter(), time.process_time()
            for records in batch.values():
                for rec in records:
                    loads(rec.value)
                seen += len(records)
        return time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await consumer.stop()


async def full_path(settings: Settings, samples: int, profile: bool) -> dict[str, Any]:
    ingestor = Ingestor(settings)
    stop = asyncio.Event()
    done: dict[str, float] = {}

    async def watch() -> None:
        # Every sample read: stop, and let the worker close its open cells and write them
        # (drain), instead of timing the idle wait a live stream's tail needs.
        while not stop.is_set():
            await asyncio.sleep(0.005)
            if ingestor.stats.samples >= samples:
                stop.set()

    prof = cProfile.Profile() if profile else None
    task = asyncio.create_task(watch())
    if prof:
        prof.enable()
    cpu0 = time.thread_time()  # the event loop's thread: decode, clocks, alignment (ClickHouse has its own)
    st = await ingestor.run(stop, drain=True)
    done["t"] = time.monotonic_ns()
    cpu = time.thread_time() - cpu0
    process_cpu = time.process_time() - st.first_record_cpu_s  # every thread's: chDB's and librdkafka's too
    if prof:
        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    await task
    secs = (done["t"] - st.first_record_ns) / 1e9
    return {"seconds": secs, "loop_cpu_s": cpu, "process_cpu_s": process_cpu, "samples": st.samples,
            "messages": st.messages,
            "frames": st.frames_written, "rejects": dict(st.rejects)}


def run_case(base: Settings, label: str, samples: int, batch_size: int, profile: bool,
             rounds: int, clock_domains: bool = False) -> dict[str, Any]:
    """Publish once, then alternate the plain decode and the full path ``rounds`` times.

    Alternating in the same run puts both under the same machine noise; the medians
    and the median of the per-round ratios are the figures reported.
    """
    tag = uuid.uuid4().hex[:6]
    settings = base.replace(topic_prefix=f"bench{tag}.", source_idle_s=0.5)
    ensure_topics(settings)
    plain_s: list[float] = []
    plain_cpu: list[float] = []
    fulls: list[dict[str, Any]] = []
    try:
        pub = publish(settings, samples, batch_size, clock_domains)
        for r in range(rounds):
            secs, cpu = asyncio.run(plain_decode(settings, pub["messages"]))
            plain_s.append(secs)
            plain_cpu.append(cpu)
            with tempfile.TemporaryDirectory() as tmp:
                run = settings.replace(group_id=f"bench{tag}-{r}", chdb_path=f"{tmp}/chdb")
                fulls.append(asyncio.run(full_path(run, pub["samples"], profile and r == 0)))
    finally:
        delete_topics(settings)
    for full in fulls:
        assert full["samples"] == pub["samples"] and not full["rejects"], full
    full_s = [f["seconds"] for f in fulls]
    ratios = [p / f for p, f in zip(plain_s, full_s, strict=True)]
    # The same ratio in CPU seconds (every thread of the process, from the first record to the end): what the
    # work costs, less moved than wall time by what else this machine runs.
    cpu_ratios = [p / f["process_cpu_s"] for p, f in zip(plain_cpu, fulls, strict=True)]
    return {
        "case": label, "messages": pub["messages"], "samples": pub["samples"], "rounds": rounds,
        "plain_decode_msgs_per_s": round(pub["messages"] / statistics.median(plain_s)),
        "plain_decode_samples_per_s": round(pub["samples"] / statistics.median(plain_s)),
        "full_path_samples_per_s": round(pub["samples"] / statistics.median(full_s)),
        "full_path_msgs_per_s": round(pub["messages"] / statistics.median(full_s)),
        "ratio_to_plain_decode": round(statistics.median(ratios), 3),
        "ratio_per_round": [round(x, 3) for x in ratios],
        "cpu_ratio_to_plain_decode": round(statistics.median(cpu_ratios), 3),
        "cpu_ratio_per_round": [round(x, 3) for x in cpu_ratios],
        "frames": fulls[0]["frames"],
    }


def clock_cost(base: Settings, samples: int, rounds: int, profile: bool = False) -> dict[str, Any]:
    """Full-path rate with the GPU streams in skewed clock domains over the same data in UTC,
    the two measured back to back in each round (order alternating), so noise cancels."""
    tag = uuid.uuid4().hex[:6]
    utc = base.replace(topic_prefix=f"bu{tag}.", source_idle_s=0.5)
    dom = base.replace(topic_prefix=f"bd{tag}.", source_idle_s=0.5)
    rates: dict[str, list[float]] = {"utc": [], "domains": []}
    cpu: dict[str, list[float]] = {"utc": [], "domains": []}
    for st in (utc, dom):
        ensure_topics(st)
    try:
        pub = {"utc": publish(utc, samples, 100), "domains": publish(dom, samples, 100, clock_domains=True)}
        for r in range(rounds):
            order = [("utc", utc), ("domains", dom)]
            for name, st in order if r % 2 == 0 else order[::-1]:
                with tempfile.TemporaryDirectory() as tmp:
                    run = st.replace(group_id=f"{st.topic_prefix}{r}", chdb_path=f"{tmp}/chdb")
                    full = asyncio.run(full_path(run, pub[name]["samples"], profile and r == 0 and name == "domains"))
                assert full["samples"] == pub[name]["samples"] and not full["rejects"], full
                rates[name].append(full["samples"] / full["seconds"])
                cpu[name].append(full["loop_cpu_s"] * 1e9 / full["samples"])
    finally:
        for st in (utc, dom):
            delete_topics(st)
    ratios = [d / u for d, u in zip(rates["domains"], rates["utc"], strict=True)]
    cpu_ratios = [u / d for d, u in zip(cpu["domains"], cpu["utc"], strict=True)]
    return {"case": "clock domains vs UTC, batched", "rounds": rounds,
            "utc_samples_per_s": round(statistics.median(rates["utc"])),
            "domains_samples_per_s": round(statistics.median(rates["domains"])),
            "domains_over_utc": round(statistics.median(ratios), 3),
            "per_round": [round(x, 3) for x in ratios],
            # The worker's own processing per sample (event-loop thread CPU), which machine
            # noise and ClickHouse's threads disturb far less than the wall clock.
            "utc_loop_cpu_ns_per_sample": round(statistics.median(cpu["utc"])),
            "domains_loop_cpu_ns_per_sample": round(statistics.median(cpu["domains"])),
            "cpu_domains_over_utc": round(statistics.median(cpu_ratios), 3),
            "cpu_per_round": [round(x, 3) for x in cpu_ratios]}


async def frame_ends(settings: Settings) -> dict[int, int]:
    """The frames topic's end offset per partition."""
    from aiokafka import TopicPartition

    topic = Topics(settings.topic_prefix).frames
    consumer = AIOKafkaConsumer(**aiokafka_config(settings), enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
        ends = await consumer.end_offsets(tps)
        return {tp.partition: off for tp, off in ends.items()}
    finally:
        await consumer.stop()


async def detect_frames(settings: Settings, start: dict[int, int], end: dict[int, int],
                        leaks: bool = True) -> tuple[float, int, int]:
    """Seconds for the detection runtime to take the frames between ``start`` and ``end`` (reading them
    included), and how many frames and alerts there were; ``leaks=False``: drift and spikes alone (the leak
    rules and attribution off)."""
    from aiokafka import TopicPartition

    from agents.app import link_capacity
    from agents.detect.agent import DetectRuntime
    from schemas.workload_samples import WorkloadSample, encode_workload_sample

    class NoHistory:
        async def read(self, partition: int, since_ms: int, until_offset: int) -> list[bytes]:
            return []

        async def sent(self, since_wall_ms: int) -> dict[str, bytes]:
            return {}

    class EncodedSummaries:  # the per-workload summaries the default worker publishes, encoded as for Kafka
        def __init__(self) -> None:
            self.bytes = 0

        async def send(self, samples: Sequence[WorkloadSample], timestamp_ms: int) -> None:
            self.bytes += sum(len(encode_workload_sample(s)) for s in samples)

    topic = Topics(settings.topic_prefix).frames
    params = settings.detect_params()
    if not leaks:
        import dataclasses

        from streams.attribution.rank import AttributionParams

        params = dataclasses.replace(params, leaks=params.leaks.all_off(), attribution=AttributionParams(enabled=False))
    runtime = DetectRuntime(params, settings.align_params().grid_ns, NoHistory(), [], None, topic,
                            summaries=EncodedSummaries() if settings.decide else None,
                            link_bytes_s=link_capacity(settings))
    consumer = AIOKafkaConsumer(**aiokafka_config(settings), enable_auto_commit=False)
    await consumer.start()
    alerts, left = 0, {p: end[p] - start[p] for p in end if end[p] > start[p]}
    try:
        tps = [TopicPartition(topic, p) for p in left]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, start[tp.partition])
        t0 = time.perf_counter()
        while any(n > 0 for n in left.values()):
            batch = await consumer.getmany(timeout_ms=1000)
            for tp, records in batch.items():
                for rec in records:
                    if rec.offset < end[tp.partition]:
                        alerts += len(await runtime.handle(rec.partition, rec.offset, rec.timestamp, rec.key,
                                                           rec.value))
                        left[tp.partition] -= 1
        return time.perf_counter() - t0, runtime.stats.frames, alerts
    finally:
        await consumer.stop()


def efficiency_cost(base: Settings, samples: int, rounds: int) -> dict[str, Any]:
    """Spine alone vs spine + derive + frames topic + detection, on the same published data."""
    tag = uuid.uuid4().hex[:6]
    settings = base.replace(topic_prefix=f"be{tag}.", source_idle_s=0.5)
    ensure_topics(settings)
    spine_s: list[float] = []
    full_s: list[float] = []
    detect_s: list[float] = []
    plain_detect_s: list[float] = []
    try:
        pub = publish(settings, samples, 100)
        for r in range(rounds):
            variants = [("spine", False), ("full", True)]
            for name, on in variants if r % 2 == 0 else variants[::-1]:
                start = asyncio.run(frame_ends(settings))
                with tempfile.TemporaryDirectory() as tmp:
                    run = settings.replace(group_id=f"be{tag}-{r}-{name}", chdb_path=f"{tmp}/chdb", derive=on,
                                           publish_frames=on)
                    got = asyncio.run(full_path(run, pub["samples"], False))
                assert got["samples"] == pub["samples"] and not got["rejects"], got
                if on:
                    end = asyncio.run(frame_ends(settings))
                    secs, frames, _ = asyncio.run(detect_frames(run, start, end))
                    assert frames > 0
                    detect_s.append(secs)
                    full_s.append(got["seconds"] + secs)
                    plain_secs, _, _ = asyncio.run(detect_frames(run, start, end, leaks=False))
                    plain_detect_s.append(got["seconds"] + plain_secs)
                else:
                    spine_s.append(got["seconds"])
    finally:
        delete_topics(settings)
    ratios = [sp / fu for sp, fu in zip(spine_s, full_s, strict=True)]
    leak_ratios = [w / f for w, f in zip(plain_detect_s, full_s, strict=True)]
    return {"case": "efficiency: spine + derive + frames topic + detection vs spine", "rounds": rounds,
            "samples": pub["samples"],
            "spine_samples_per_s": round(pub["samples"] / statistics.median(spine_s)),
            "full_samples_per_s": round(pub["samples"] / statistics.median(full_s)),
            "detect_seconds_median": round(statistics.median(detect_s), 3),
            "full_over_spine": round(statistics.median(ratios), 3), "per_round": [round(x, 3) for x in ratios],
            # The same full path with drift and spikes alone: what the leak rules and attribution cost.
            "full_with_leaks_over_without": round(statistics.median(leak_ratios), 3),
            "with_leaks_per_round": [round(x, 3) for x in leak_ratios]}


def rollups_cost(base: Settings, samples: int, rounds: int) -> dict[str, Any]:
    """The default worker with its ClickHouse rollups (materialized views) against the same without them."""
    tag = uuid.uuid4().hex[:6]
    settings = base.replace(topic_prefix=f"br{tag}.", source_idle_s=0.5)
    ensure_topics(settings)
    took: dict[bool, list[float]] = {True: [], False: []}
    try:
        pub = publish(settings, samples, 100)
        for r in range(rounds):
            for on in (True, False) if r % 2 == 0 else (False, True):
                with tempfile.TemporaryDirectory() as tmp:
                    run = settings.replace(group_id=f"br{tag}-{r}-{on}", chdb_path=f"{tmp}/chdb", rollups=on)
                    got = asyncio.run(full_path(run, pub["samples"], False))
                assert got["samples"] == pub["samples"] and not got["rejects"], got
                took[on].append(got["seconds"])
    finally:
        delete_topics(settings)
    ratios = [off / on for on, off in zip(took[True], took[False], strict=True)]
    return {"case": "rollups: the default worker with the 1 min and 1 h rollups vs without", "rounds": rounds,
            "samples": pub["samples"], "with_samples_per_s": round(pub["samples"] / statistics.median(took[True])),
            "without_samples_per_s": round(pub["samples"] / statistics.median(took[False])),
            "with_over_without": round(statistics.median(ratios), 3), "per_round": [round(x, 3) for x in ratios]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2_000_000, help="samples for the batched case (100 per message)")
    ap.add_argument("--single-messages", type=int, default=200_000, help="messages for the single-sample case")
    ap.add_argument("--rounds", type=int, default=5, help="alternating plain/full measurements per case")
    ap.add_argument("--profile", action="store_true", help="cProfile the first full-path round (stderr)")
    ap.add_argument("--case", choices=["all", "batched", "single", "clock", "efficiency", "rollups"], default="all",
                    help="which cases to run")
    args = ap.parse_args()
    base = load_settings()
    tune_for_throughput()  # as `flopwatch worker` does; both sides of every ratio run under it
    results = []
    if args.case in ("all", "batched"):
        results.append(run_case(base, "batched (100 samples/message)", args.samples, 100, args.profile, args.rounds))
    if args.case in ("all", "single"):
        results.append(run_case(base, "single-sample messages", args.single_messages, 1, args.profile, args.rounds))
    if args.case in ("all", "clock"):
        results.append(clock_cost(base, args.samples, args.rounds, args.profile))
    if args.case in ("all", "efficiency"):
        results.append(efficiency_cost(base, args.samples, args.rounds))
    if args.case in ("all", "rollups"):
        results.append(rollups_cost(base, args.samples, args.rounds))
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "results": results}, indent=2))


if __name__ == "__main__":
    main()
