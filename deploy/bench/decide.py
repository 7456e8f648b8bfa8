"""Scale decisions: what the engine decides per scenario, how fast a trigger reaches Kafka, and whether
a SIGKILL duplicates one.

    python deploy/bench/decide.py [--live-seconds 100] [--workloads 6] [--skip-live] [--skip-kill]

1. In-process, every scenario of ``streams.decide.sim`` with the default policy: decisions
   against the scenario's expectations, direction changes within a stabilisation window,
   decisions taken on stale data, rollback delay after the SLA breach (event time), and
   the engine's speed on the scenario's summaries.
2. Live (needs Kafka: FLOPWATCH_KAFKA_BOOTSTRAP; ``deploy/services.sh start``): ``--workloads``
   services on their own nodes, each surging at a different time, and one whose scale-down
   is followed by an SLA breach, under a policy with short windows (the windows do not
   change the path a trigger takes). Their frames go to ``flopwatch.frames`` in real time,
   each tick ``allowed lateness`` after it ends, which is when the ingest would close it;
   a default ``flopwatch worker`` (detection agent -> ``flopwatch.workloads`` -> decision agent)
   runs on them. Latency = trigger on Kafka (read_committed) - (its tick's end + lateness):
   the agents' share. The ingest's share beyond the lateness is ``alert_latency.py``'s.
3. SIGKILL: the ``sla_breach`` scenario's frames as a backlog; the worker is killed once the
   scale-down is on the topic, the rest is published, a new worker runs; triggers seen
   twice by a read_committed consumer are counted.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agents.kafka.admin import delete_topics, ensure_topics
from agents.kafka.topics import Topics
from agents.settings import Settings, load_settings, settings_env
from schemas.frame_messages import FrameMessage, encode_frame_message
from schemas.triggers import Trigger, decode_trigger
from streams.decide.engine import Decider
from streams.decide.params import ClassPolicy, DecideParams, Rules
from streams.decide.sim import SCENARIOS, Scenario, check, flaps, run_scenario
from streams.detect.workload_tap import WorkloadTap

ROOT = Path(__file__).resolve().parents[2]
S = 1_000_000_000
FAST = DecideParams(
    rules=Rules(latency_window_s=10, qps_window_s=10, check_interval_s=2, stabilisation_s=20, cooldown_s=30,
                repeat_s=10, watch_s=60),
    classes={"inference": ClassPolicy(online=True, sla_latency_ms=120.0, max_step_up=4, down_checks=3, weight=2.0)})
FAST_TOML = """[rules]
latency_window_s = 10
qps_window_s = 10
check_interval_s = 2
stabilisation_s = 20
cooldown_s = 30
repeat_s = 10
watch_s = 60
max_age_s = {max_age}
[classes.inference]
online = true
sla_latency_ms = 120.0
max_step_up = 4
down_checks = 3
weight = 2.0
"""


def in_process() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, sc in SCENARIOS.items():
        run = run_scenario(sc)
        taken = [d for d in run.decisions if d.outcome == "taken"]
        stale = sum(1 for d in taken if any(a < (d.trigger.ts_ns - sc.start_ns) / S <= b for _, a, b in sc.stopped)
                    or any(a < (d.trigger.ts_ns - sc.start_ns) / S <= b for a, b, lag in sc.lagged
                           if lag > sc.params.rules.max_age_s))
        row: dict[str, Any] = {
            "expectations": len(sc.expect), "expectations_failed": len(check(sc, run)),
            "taken": dict(Counter(d.trigger.action for d in taken)),
            "withheld_by_gate": dict(Counter(d.gate for d in run.decisions if d.outcome == "withheld")),
            "flaps_per_stabilisation_window": flaps(run, sc.params.rules.stabilisation_s),
            "taken_on_stale_data": stale}
        rb = [d.trigger for d in taken if d.trigger.action == "rollback"]
        if rb:
            row["rollback_after_breach_s"] = (rb[0].ts_ns - int(rb[0].evidence["sla_breach"]["breach_ts_ns"] or 0)) / S
        tap = WorkloadTap({"gpu_util": 95.0}, lambda _m: 32e9)
        samples = [s for m in run.frames for s in tap.summarise(m, ())]
        t0 = time.perf_counter()
        dec = Decider(sc.params)
        for s in samples:
            dec.on_sample(s, s.tick_ns + 3 * S)
        row["engine_summaries_per_s"] = round(len(samples) / (time.perf_counter() - t0))
        out[name] = row
    return out


def surge(onset_s: float) -> Callable[[float], float]:
    return lambda t: 2000.0 if t < onset_s else 4200.0


def live_scenarios(n: int, start_ns: int) -> list[Scenario]:
    scs = []
    for i in range(n):
        onset = 20.0 + 8.0 * i
        scs.append(Scenario(f"surge{i}", "surge", 0, surge(onset),
                            namespace="bench", workload=f"svc-{i}", nodes=2, gpus_per_node=4, replicas=4,
                            node_offset=2 * i, params=FAST, start_ns=start_ns))
    scs.append(Scenario("sla", "scale-down then breach", 0, lambda t: 800.0 if t < 60 else 2900.0,
                        namespace="bench", workload="svc-sla", nodes=2, gpus_per_node=4, replicas=4,
                        node_offset=2 * n, params=FAST, start_ns=start_ns))
    return scs


def worker(settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLOPWATCH_")}, **settings_env(settings)}
    return subprocess.Popen([sys.executable, "-m", "agents.cli.main", "worker", "--progress", "none"], env=env,
                            stderr=log.open("wb"), cwd=ROOT)


def consumer(settings: Settings, tag: str) -> Consumer:
    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": f"{tag}-read",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "isolation.level": "read_committed"})
    topic = Topics(settings.topic_prefix).triggers
    c.assign([TopicPartition(topic, p, 0) for p in range(settings.partitions)])
    return c


def publish(p: Producer, topic: str, frames: list[FrameMessage], partition: int = -1) -> None:
    """``partition`` >= 0 puts every frame there (a backlog whose nodes share a partition, see README)."""
    for m in frames:
        p.produce(topic, key=m.node.encode(), value=encode_frame_message(m), timestamp=m.tick_ns // 1_000_000,
                  partition=partition)
    p.flush(30)


def settings_for(tag: str, tmp: str, policy: str) -> Settings:
    return load_settings(topic_prefix=f"{tag}.", group_id=tag, chdb_path=f"{tmp}/chdb-{tag}", decide_policy=policy,
                         web_enabled=False)


def live(seconds: float, workloads: int, tmp: str) -> dict[str, Any]:
    tag = f"dl{uuid.uuid4().hex[:6]}"
    policy = Path(tmp) / "fast.toml"
    policy.write_text(FAST_TOML.format(max_age=30))
    settings = settings_for(tag, tmp, str(policy))
    ensure_topics(settings)
    proc = worker(settings, Path(tmp) / f"{tag}.log")
    c = consumer(settings, tag)
    lateness = settings.lateness_ms * 1_000_000
    try:
        time.sleep(12.0)  # the worker joins its groups
        start = (time.time_ns() // S + 2) * S
        scs = [dataclasses.replace(sc, duration_s=seconds) for sc in live_scenarios(workloads, start)]
        runs = [run_scenario(sc) for sc in scs]
        expected = {d.trigger.id: d.trigger for r in runs for d in r.decisions if d.outcome == "taken"}
        by_tick: dict[int, list[FrameMessage]] = {}
        for r in runs:
            for m in r.frames:
                by_tick.setdefault(m.tick_ns, []).append(m)
        p = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 0})
        topic = Topics(settings.topic_prefix).frames
        seen: dict[str, tuple[Trigger, int]] = {}
        copies: Counter[str] = Counter()
        for tick in sorted(by_tick):
            due = tick + S + lateness  # the ingest closes a tick once the watermark passes its end by this
            while (now := time.time_ns()) < due:
                poll(c, seen, copies, min(0.05, (due - now) / 1e9))
            publish(p, topic, by_tick[tick])
        drain(c, seen, copies, 10.0)
    finally:
        finish(c, proc, settings)
    lat = sorted((wall - (t.ts_ns + lateness)) / 1e9 for t, wall in seen.values())
    kinds = Counter(t.action for t, _ in seen.values())
    rollback = [(wall - (t.ts_ns + lateness)) / 1e9 for t, wall in seen.values() if t.action == "rollback"]

    def q(p: float) -> float:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 3) if lat else float("nan")

    return {"triggers_expected": len(expected), "triggers_seen": len(seen),
            "unexpected": sorted(set(seen) - set(expected)), "missing": sorted(set(expected) - set(seen)),
            "duplicated": sum(n - 1 for n in copies.values()), "by_action": dict(kinds),
            "latency_median_s": round(statistics.median(lat), 3) if lat else None, "latency_p95_s": q(0.95),
            "latency_p99_s": q(0.99), "latency_max_s": round(lat[-1], 3) if lat else None,
            "rollback_wall_latency_s": [round(x, 3) for x in rollback],
            "within_1s": sum(1 for x in lat if x <= 1.0), "workloads": workloads + 1, "seconds": seconds}


def poll(c: Consumer, seen: dict[str, tuple[Trigger, int]], copies: Counter[str], timeout: float) -> None:
    m = c.poll(max(timeout, 0.0))
    if m is None or m.error():
        return
    wall = time.time_ns()
    t = decode_trigger(m.value() or b"")
    copies[t.idempotency_key] += 1
    seen.setdefault(t.id, (t, wall))


def drain(c: Consumer, seen: dict[str, tuple[Trigger, int]], copies: Counter[str], seconds: float) -> None:
    """Keep reading for ``seconds``: a late or duplicated trigger has time to show."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        poll(c, seen, copies, 0.05)


def finish(c: Consumer, proc: subprocess.Popen[bytes], settings: Settings) -> None:
    c.close()
    proc.terminate()
    proc.wait(60)
    delete_topics(settings)


def sigkill(tmp: str) -> dict[str, Any]:
    tag = f"dk{uuid.uuid4().hex[:6]}"
    policy = Path(tmp) / "kill.toml"
    policy.write_text("[rules]\nmax_age_s = 100000\n")  # a backlog of recorded frames: the age guard is for live
    settings = settings_for(tag, tmp, str(policy))
    ensure_topics(settings)
    sc = SCENARIOS["sla_breach"]
    sc = dataclasses.replace(sc, start_ns=(time.time_ns() - int(sc.duration_s * S) - 60 * S) // S * S)
    run = run_scenario(sc)
    expected = {d.trigger.id for d in run.decisions if d.outcome == "taken"}
    cut = next(i for i, m in enumerate(run.frames) if m.tick_ns - sc.start_ns >= 450 * S)
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 20})
    topic = Topics(settings.topic_prefix).frames
    seen: dict[str, tuple[Trigger, int]] = {}
    copies: Counter[str] = Counter()
    proc = worker(settings, Path(tmp) / f"{tag}-1.log")
    c = consumer(settings, tag)
    try:
        publish(p, topic, run.frames[:cut], partition=0)
        deadline = time.monotonic() + 120
        while not seen and time.monotonic() < deadline:
            poll(c, seen, copies, 0.2)
        proc.kill()
        proc.wait(30)
        publish(p, topic, run.frames[cut:], partition=0)
        proc = worker(settings, Path(tmp) / f"{tag}-2.log")
        deadline = time.monotonic() + 150
        while len(seen) < len(expected) and time.monotonic() < deadline:
            poll(c, seen, copies, 0.2)
        drain(c, seen, copies, 5.0)
    finally:
        finish(c, proc, settings)
    def show(ts: list[Trigger]) -> list[str]:
        return [f"{t.action}@{(t.ts_ns - sc.start_ns) / S:.0f}s" for t in sorted(ts, key=lambda t: t.ts_ns)]

    return {"expected": len(expected), "seen": len(seen), "missing": len(expected - set(seen)),
            "unexpected": len(set(seen) - expected), "duplicated": sum(n - 1 for n in copies.values()),
            "expected_triggers": show([d.trigger for d in run.decisions if d.outcome == "taken"]),
            "seen_triggers": show([t for t, _ in seen.values()])}


def end_to_end(seconds: float, nodes: int, gpus: int, tmp: str) -> dict[str, Any]:
    """The simulated cluster's sensors in real time through the whole worker (ingest included): every
    trigger's latency beyond its tick's end + the allowed lateness."""
    from agents.collect.simulator import SimulatorPublisher
    from streams.sim.simulate import SimParams

    tag = f"de{uuid.uuid4().hex[:6]}"
    settings = load_settings(topic_prefix=f"{tag}.", group_id=tag, chdb_path=f"{tmp}/chdb-{tag}", web_enabled=False)
    ensure_topics(settings)
    proc = worker(settings, Path(tmp) / f"{tag}.log")
    c = consumer(settings, tag)
    seen: dict[str, tuple[Trigger, int]] = {}
    copies: Counter[str] = Counter()
    try:
        time.sleep(12.0)
        params = SimParams(nodes=nodes, gpus=gpus, seed=4, start_ns=time.time_ns())
        pub = SimulatorPublisher(settings, params, batch_size=100)
        live = threading.Thread(target=pub.live, args=(seconds,))
        live.start()
        while live.is_alive():
            poll(c, seen, copies, 0.05)
        drain(c, seen, copies, 10.0)
    finally:
        finish(c, proc, settings)
    lateness = settings.lateness_ms * 1_000_000
    lat = sorted((wall - (t.ts_ns + lateness)) / 1e9 for t, wall in seen.values())
    return {"triggers": len(lat), "by_action": dict(Counter(t.action for t, _ in seen.values())),
            "beyond_lateness_s": [round(x, 3) for x in lat], "nodes": nodes, "gpus": gpus, "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--live-seconds", type=float, default=100.0)
    ap.add_argument("--workloads", type=int, default=6)
    ap.add_argument("--skip-live", action="store_true")
    ap.add_argument("--skip-kill", action="store_true")
    ap.add_argument("--e2e-seconds", type=float, default=0.0,
                    help="also run the simulated cluster's sensors through the whole worker this long")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    out: dict[str, Any] = {"scenarios": in_process()}
    if not args.skip_live:
        out["live"] = live(args.live_seconds, args.workloads, tmp)
    if not args.skip_kill:
        out["sigkill"] = sigkill(tmp)
    if args.e2e_seconds > 0:
        out["end_to_end"] = end_to_end(args.e2e_seconds, 4, 4, tmp)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
