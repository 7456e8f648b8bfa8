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
issue's measure is the latency beyond lateness + grid. Prints one JSON object.
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

from live_worker import live_worker  # deploy/bench/

from agents.collect.simulator import SimulatorPublisher
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
        lat: list[float] = []
        onsets: list[float] = []
        want = {(t.node, t.gpu) for t in scenario.truth(params.start_ns)}
        fired = set()
        deadline = time.time() + args.seconds + 20
        while time.time() < deadline:
            m = consumer.poll(0.05)
            if m is None or m.error():
                continue
            seen_ns = time.time_ns()
            a = decode_alert(m.value() or b"")
            if a.rule == "efficiency_drift" and a.state == "firing":
                lat.append((seen_ns - a.ts_ns) / 1e9)
                onsets.append((a.ts_ns - a.onset_ts_ns) / 1e9)
                fired.add((a.node, a.gpu))
        live.join()
        lateness = settings.lateness_ms / 1000
        grid = settings.grid_ms / 1000
        lat.sort()

        def q(p: float, minus: float = 0.0) -> float:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))] - minus, 3)

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
            "event_time_onset_to_alert_median_s": round(statistics.median(onsets), 3),
            "nodes": args.nodes, "gpus": args.gpus, "seconds": args.seconds}))


if __name__ == "__main__":
    main()
