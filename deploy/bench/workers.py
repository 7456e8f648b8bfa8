"""Throughput of 1, 2 and 3 workers in one group, and each one's CPU per sample: what the capacity plan uses.

    python deploy/bench/workers.py [--samples 2000000] [--workers 1,2,3] [--partitions 12]

Needs Kafka (FLOPWATCH_KAFKA_BOOTSTRAP, default 127.0.0.1:9092). A simulated 12 x 4 cluster (100-sample
messages, all 23 streams) is published once as a backlog on a ``--partitions`` topic set; then for each
count, that many ``flopwatch worker`` processes (plain runtime: ingest with derive, spikes and frames on
Kafka; each its own embedded chDB, since only throughput is measured) read it all in a fresh group.

The rate is the samples read over the time from the first flush with samples to the last one that added
any, as the workers' progress lines say; each worker's CPU (user + system, from /proc) is taken over the
same span, so its start (imports, opening chDB, joining the group) is not counted. On this 2-core machine
two or three workers share the cores with the broker: the sum is bounded, the CPU per sample is the figure.
Prints one JSON object per count and a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale import cpu_s  # deploy/bench/

from agents.collect.simulator import SimulatorPublisher
from agents.kafka.admin import delete_topics, ensure_topics
from agents.settings import Settings, load_settings, settings_env
from streams.sim.simulate import SimParams

IDLE_S = 4.0


class _Run:
    """One worker process and what its progress lines said, with the CPU it had used at each."""

    def __init__(self, settings: Settings) -> None:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLOPWATCH_")}, **settings_env(settings)}
        self.proc = subprocess.Popen([sys.executable, "-m", "agents.cli.main", "worker", "--runtime", "plain",
                                      "--exit-when-idle", str(IDLE_S), "--progress", "json"],
                                     env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.points: list[tuple[float, int, float]] = []  # (monotonic, samples so far, CPU s so far)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            start = line.find('{"event":"flush"')
            if start < 0:
                continue
            samples = int(json.loads(line[start:])["samples"])
            try:
                cpu = cpu_s(self.proc.pid)
            except OSError:
                continue  # exiting
            if samples and (not self.points or samples > self.points[-1][1]):
                self.points.append((time.monotonic(), samples, cpu))


def run(base: Settings, workers: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        group = f"workers{uuid.uuid4().hex[:6]}"
        runs = [_Run(base.replace(group_id=group, chdb_path=f"{tmp}/chdb{i}")) for i in range(workers)]
        for r in runs:
            r.proc.wait(600)
            r.thread.join(10)
    used = [r for r in runs if len(r.points) >= 2]
    first, last = min(r.points[0][0] for r in used), max(r.points[-1][0] for r in used)
    samples = sum(r.points[-1][1] for r in runs if r.points)
    # Each worker over its own span with samples; the samples it read before its first flush count too.
    per = [{"samples": r.points[-1][1], "cpu_s": round(r.points[-1][2] - r.points[0][2], 3),
            "cpu_us_per_sample": round((r.points[-1][2] - r.points[0][2]) / (r.points[-1][1] - r.points[0][1])
                                       * 1e6, 3)} for r in used]
    return {"workers": workers, "samples": samples, "seconds": round(last - first, 3),
            "samples_per_s": round(samples / (last - first)), "per_worker": per}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=2_000_000)
    ap.add_argument("--workers", default="1,2,3")
    ap.add_argument("--partitions", type=int, default=12)
    args = ap.parse_args()
    tag = uuid.uuid4().hex[:6]
    base = load_settings(dict(os.environ), topic_prefix=f"wk{tag}.", partitions=args.partitions,
                         clickhouse_backend="chdb", web_enabled=False, source_idle_s=0.5)
    ensure_topics(base)
    results = []
    try:
        nodes, gpus = 12, 4
        seconds = max(10.0, args.samples / (nodes * gpus * 140))  # about 140 samples per GPU-second
        params = SimParams(nodes=nodes, gpus=gpus, seed=5, start_ns=time.time_ns() - int(seconds * 1e9))
        st = SimulatorPublisher(base, params, batch_size=100).backlog(seconds)
        print(json.dumps({"published_samples": st.samples, "messages": st.messages}), flush=True)
        for n in [int(x) for x in args.workers.split(",")]:
            res = run(base, n)
            print(json.dumps(res), flush=True)
            results.append(res)
    finally:
        delete_topics(base)
    one = next((r for r in results if r["workers"] == 1), None)
    summary = {"date": time.strftime("%Y-%m-%d"), "partitions": args.partitions, "runs": [
        {"workers": r["workers"], "samples_per_s": r["samples_per_s"],
         "of_one_worker": round(r["samples_per_s"] / one["samples_per_s"], 2) if one else None,
         "cpu_us_per_sample": [w["cpu_us_per_sample"] for w in r["per_worker"]]} for r in results]}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
