"""Spike capture in a live worker: every 200 ms spike must give a ``util_spike`` alert.

    python deploy/bench/spike_live.py [--seconds 240] [--nodes 4] [--gpus 4] [--per-gpu 2] [--seed 1]

Needs Kafka (FLOPWATCH_KAFKA_BOOTSTRAP; ``deploy/services.sh start``). The simulator publishes a
steady cluster in real time (10 Hz samples with their jitter); each GPU first has an efficiency
episode (a 25% drop for 15 s between 50 and 80 s), then ``--per-gpu`` spikes of 200 ms to 96-99.5%
utilisation at random instants from 100 s on, their offsets into the second spread over the whole
second: some at the start of a tick, some across a tick edge. A default ``flopwatch worker`` (Faust
runtime, 1 s grid, chDB) runs beside; this script reads ``flopwatch.alerts``. A spike is caught when
its GPU's ``util_spike`` fires with an onset tick that holds a sample of the spike or is the tick
after it (the 1 s window of the tick after still covers a spike in a tick's last 100 ms). Prints
the spikes missed and one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
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

S = 1_000_000_000


def scenario_text(nodes: int, gpus: int, seconds: float, per_gpu: int, rng: random.Random) -> str:
    events = ["version = 1"]
    for n in range(nodes):
        for g in range(gpus):
            where = f'node = "node-{n:02d}"\ngpu = "{g}"'
            events.append(f'[[event]]\nkind = "efficiency_drop"\n{where}\nstart_s = {rng.uniform(50, 65):.3f}\n'
                          "duration_s = 15.0\ndepth = 0.25")
            starts: list[float] = []
            while len(starts) < per_gpu:
                t = rng.uniform(100, seconds - 10)
                if all(abs(t - u) > 5 for u in starts):
                    starts.append(t)
            for t in sorted(starts):
                events.append(f'[[event]]\nkind = "spike"\n{where}\nstart_s = {t:.3f}\n'
                              f"level = {rng.uniform(0.96, 0.995):.3f}\nduration_ms = 200.0")
    return "\n\n".join(events)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=240.0)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--per-gpu", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with live_worker("sl") as (settings, consumer, log_path, _):
        scenario = parse_scenario(scenario_text(args.nodes, args.gpus, args.seconds, args.per_gpu, rng), "spike-live")
        params = SimParams(nodes=args.nodes, gpus=args.gpus, seed=args.seed, start_ns=time.time_ns(), steady=True)
        truth = [t for t in scenario.truth(params.start_ns) if t.kind == "spike"]
        pub = SimulatorPublisher(settings, params, batch_size=100, scenario=scenario)
        live = threading.Thread(target=pub.live, args=(args.seconds,))
        live.start()
        onsets: dict[tuple[str, str], list[int]] = {}
        deadline = time.time() + args.seconds + 25
        while time.time() < deadline:
            m = consumer.poll(0.1)
            if m is None or m.error():
                continue
            a = decode_alert(m.value() or b"")
            if a.rule == "util_spike" and a.state == "firing":
                onsets.setdefault((a.node, a.gpu), []).append(a.onset_ts_ns)
        live.join()
        missed = []
        for t in truth:
            first, last = t.start_ns // S * S, (t.end_ns - 1) // S * S + S  # the ticks whose windows cover it
            if not any(first <= o <= last for o in onsets.get((t.node, t.gpu), [])):
                missed.append(t)
                print(f"missed: {t.node}/{t.gpu} at {(t.start_ns - params.start_ns) / S:.3f} s "
                      f"({t.start_ns % S // 1_000_000} ms into its second)", file=sys.stderr)
        print(json.dumps({"bench": "spike_live", "date": time.strftime("%Y-%m-%d"), "spikes": len(truth),
                          "caught": len(truth) - len(missed), "missed": len(missed),
                          "gpus_with_alerts": len(onsets), "nodes": args.nodes, "gpus": args.gpus,
                          "seconds": args.seconds, "worker_log": log_path}))


if __name__ == "__main__":
    main()
