"""Wall-clock latency of a frame in steady live input: from the end of its tick to the moment
it can be read in ClickHouse.

    python deploy/bench/latency.py [--seconds 60] [--nodes 4] [--gpus 4]

Needs Kafka and a ClickHouse server (FLOPWATCH_KAFKA_BOOTSTRAP, FLOPWATCH_CLICKHOUSE_*;
``deploy/services.sh start``). The simulator publishes in real time (every 100 ms); a
``flopwatch worker`` process aligns and writes with the default settings; this script polls
the newest tick per node every 50 ms. A frame's latency is the time it was first seen minus
the end of its tick. Prints one JSON object (median, p95, max in seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agents.collect.simulator import SimulatorPublisher
from agents.kafka.admin import delete_topics, ensure_topics
from agents.settings import load_settings, settings_env
from agents.sinks.clickhouse import open_backend
from streams.sim.simulate import SimParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds left out at the start")
    args = ap.parse_args()
    tag = uuid.uuid4().hex[:6]
    settings = load_settings(topic_prefix=f"lat{tag}.", group_id=f"lat{tag}", clickhouse_database=f"lat_{tag}",
                             clickhouse_backend="native", clickhouse_layout="legacy")
    ensure_topics(settings)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLOPWATCH_")}, **settings_env(settings)}
    worker = subprocess.Popen([sys.executable, "-m", "agents.cli.main", "worker", "--progress", "none"], env=env,
                              stderr=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[2])
    grid = settings.grid_ms
    try:
        time.sleep(8.0)  # the worker joins its group
        params = SimParams(nodes=args.nodes, gpus=args.gpus, seed=3, start_ns=time.time_ns())
        pub = SimulatorPublisher(settings, params, batch_size=100)
        live = threading.Thread(target=pub.live, args=(args.seconds,))
        live.start()
        backend = open_backend(settings)
        newest: dict[str, int] = {}
        lat: list[float] = []
        t_from = params.start_ns // 1_000_000 + int(args.warmup * 1000)
        while live.is_alive():
            time.sleep(0.05)
            try:
                _, rows = backend.rows(f"SELECT node, max(ts) FROM {backend.database}.gpu_frames GROUP BY node")
            except Exception:  # the table appears with the worker's first write
                continue
            seen = time.time() * 1000
            for node, ms in rows:
                prev = newest.get(node)
                newest[node] = int(ms)
                if prev is None:
                    continue
                lat += [(seen - (t + grid)) / 1000 for t in range(prev + grid, int(ms) + 1, grid) if t >= t_from]
        backend.close()
        lat.sort()
        print(json.dumps({"frames_ticks": len(lat), "median_s": round(statistics.median(lat), 3),
                          "p95_s": round(lat[int(0.95 * (len(lat) - 1))], 3), "max_s": round(lat[-1], 3),
                          "nodes": args.nodes, "gpus": args.gpus, "seconds": args.seconds}))
    finally:
        worker.terminate()
        worker.wait(60)
        delete_topics(settings)


if __name__ == "__main__":
    main()
