"""Wall-clock latency of an efficiency alert in live input: from the last sample that completes the
confirmation (the end of the confirming tick) to the alert on ``flopwatch.alerts``.

    python deploy/bench/alert_latency.py [--seconds 150] [--nodes 4] [--gpus 2] [--every 12]

Needs Kafka (FLOPWATCH_KAFKA_BOOTSTRAP; ``deploy/services.sh start``). The simulator publishes
a steady cluster in real time with a 30 % drop of 10 s on one GPU every ``--every`` seconds
from 40 s on, the GPUs in turn; a ``flopwatch worker`` (Faust runtime: ingest service +
detection agent, default settings, chDB) aligns, derives, publishes frames and detects; this
script reads the alerts as they come.
A tick closes once its node's watermark passes its end by the allowed lateness, so the
figure that is flopwatch's own is the latency beyond that lateness; a stream sampled once per
grid step (the 1 Hz host and clock streams) can hold the watermark up to one more step, so the
issue's measure is the latency beyond lateness + grid. Each alert's path is split into hops: the
confirming tick's frame message seen on ``flopwatch.frames`` (after the tick: the lateness wait, the
aligner and the frame's send), the alert created (its Kafka timestamp, set by the detection agent's
producer: the agent's poll and detection), and the alert seen here (its send and acknowledgement).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson
from live_worker import live_worker  # deploy/bench/

from agents.collect.simulator import SimulatorPublisher
from agents.kafka.topics import Topics
from schemas.alerts import decode_alert
from streams.sim.scenario import parse_scenario
from streams.sim.simulate import SimParams


def scenario_text(nodes: int, gpus: int, seconds: float, every: float = 12.0) -> str:
    events, t, i = ["version = 1"], 40.0, 0
    while t + 12 < seconds:
        events.append(f'[[event]]\nkind = "efficiency_drop"\nnode = "node-{i // gpus % nodes:02d}"\n'
                      f'gpu = "{i % gpus}"\nstart_s = {t:.1f}\nduration_s = 10.0\ndepth = 0.3')
        t, i = t + every, i + 1
    return "\n".join(events)


def by_node(late_frames: list[tuple[float, int, str]], before_s: float) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for after, tick_s, node in late_frames:
        if tick_s < before_s:
            out.setdefault(node, []).append(after)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--every", type=float, default=12.0, help="seconds between drops (each GPU's drops stay "
                    "further apart than the baseline needs to settle: nodes x gpus x every >= 80 s)")
    args = ap.parse_args()
    with live_worker("al") as (settings, consumer, _, _):
        scenario = parse_scenario(scenario_text(args.nodes, args.gpus, args.seconds, args.every), "alert-latency")
        params = SimParams(nodes=args.nodes, gpus=args.gpus, seed=3, start_ns=time.time_ns(), steady=True)
        pub = SimulatorPublisher(settings, params, batch_size=100, scenario=scenario)
        live = threading.Thread(target=pub.live, args=(args.seconds,))
        live.start()
        topics = Topics(settings.topic_prefix)
        consumer.subscribe([topics.alerts, topics.frames])
        ids: set[str] = set()
        frame_seen: dict[tuple[str, int], int] = {}  # (node, tick) -> when its frame message was seen here
        hops: dict[str, list[float]] = {"frame_on_kafka_after_tick": [], "agent": [], "alert_send": []}
        lat: list[float] = []
        from_tick_end: list[float] = []  # the same, counted from the end of the alert's tick
        slowest: list[tuple[float, str, str, int, float | None]] = []  # latency, node, gpu, ts ms in s, frame
        late_frames: list[tuple[float, int, str]] = []  # after its tick's end, the tick in s from the start, node
        onsets: list[float] = []
        want = {(t.node, t.gpu) for t in scenario.truth(params.start_ns)}
        fired = set()
        deadline = time.time() + args.seconds + 20
        while time.time() < deadline:
            m = consumer.poll(0.05)
            if m is None or m.error():
                continue
            seen_ns = time.time_ns()
            if m.topic() == topics.frames:
                doc = orjson.loads(m.value() or b"{}")
                frame_seen.setdefault((doc["node"], doc["tick_ns"]), seen_ns)
                late_frames.append((round((seen_ns - doc["tick_ns"]) / 1e9 - 1, 3),
                                    round((doc["tick_ns"] - params.start_ns) / 1e9), doc["node"]))
                continue
            a = decode_alert(m.value() or b"")
            if a.rule == "efficiency_drift" and a.state == "firing" and a.id not in ids:
                ids.add(a.id)  # the attributed firing follows the plain one under the same id
                lat.append((seen_ns - a.ts_ns) / 1e9)
                grid_ns = settings.grid_ms * 1_000_000  # the confirming tick: the one ending at or after ts
                tick_ns = (a.ts_ns - 1) // grid_ns * grid_ns
                from_tick_end.append((seen_ns - tick_ns - grid_ns) / 1e9)
                framed = frame_seen.get((a.node, tick_ns))
                created_ns = m.timestamp()[1] * 1_000_000
                if framed is not None:
                    hops["frame_on_kafka_after_tick"].append((framed - a.ts_ns) / 1e9)
                    hops["agent"].append((created_ns - framed) / 1e9)
                hops["alert_send"].append((seen_ns - created_ns) / 1e9)
                slowest.append((round(lat[-1], 3), a.node, a.gpu, a.ts_ns % 1_000_000_000 // 1_000_000,
                                None if framed is None else round((framed - a.ts_ns) / 1e9, 3)))
                onsets.append((a.ts_ns - a.onset_ts_ns) / 1e9)
                fired.add((a.node, a.gpu))
        live.join()
        lateness = settings.lateness_ms / 1000
        grid = settings.grid_ms / 1000
        lat.sort()
        from_tick_end.sort()

        def q(p: float, minus: float = 0.0, xs: list[float] = lat) -> float:
            return round(xs[min(len(xs) - 1, int(p * len(xs)))] - minus, 3)

        print(json.dumps({
            "alerts": len(lat), "drops": len(scenario.events), "gpus_expected": len(want), "gpus_fired": len(fired),
            "latency_median_s": round(statistics.median(lat), 3),
            "latency_p95_s": q(0.95),
            "latency_max_s": round(lat[-1], 3), "allowed_lateness_s": lateness,
            "latency_p99_s": q(0.99), "grid_s": grid,
            "beyond_lateness_median_s": round(statistics.median(lat) - lateness, 3),
            "beyond_lateness_p95_s": q(0.95, lateness), "beyond_lateness_p99_s": q(0.99, lateness),
            "beyond_lateness_max_s": round(lat[-1] - lateness, 3),
            "beyond_lateness_and_grid_p99_s": q(0.99, lateness + grid),
            # An alert's time is the instant its hold completed, inside its tick; no frame of that tick can
            # exist before the tick's end. Counted from there, what is left is the lateness, the 1 Hz streams'
            # wait (the grid) and flopwatch's own share.
            "from_tick_end_beyond_lateness_and_grid_median_s": round(statistics.median(from_tick_end) - lateness
                                                                     - grid, 3),
            "from_tick_end_beyond_lateness_and_grid_p99_s": q(0.99, lateness + grid, from_tick_end),
            "event_time_onset_to_alert_median_s": round(statistics.median(onsets), 3),
            "hops_median_s": {k: round(statistics.median(v), 3) if v else None for k, v in hops.items()},
            "hops_max_s": {k: round(max(v), 3) if v else None for k, v in hops.items()},
            "slowest": sorted(slowest, reverse=True)[:5],
            "frames_after_tick_end_median_s": statistics.median(x[0] for x in late_frames) if late_frames else None,
            "latest_frames": sorted(late_frames, reverse=True)[:8],
            # Per node, the median of its frames (the run's last 10 s left out: the input stops there), slowest first.
            "frames_after_tick_end_by_node_median_s": sorted(
                ((round(statistics.median(v), 3), node) for node, v in by_node(late_frames, args.seconds - 10).items()),
                reverse=True)[:6],
            "nodes": args.nodes, "gpus": args.gpus, "seconds": args.seconds}))


if __name__ == "__main__":
    main()
