"""Throughput of 1, 2 and 3 workers in one group, and each one's CPU per sample: what the capacity plan uses.

    python deploy/bench/workers.py [--samples 4000000] [--workers 1,2,3] [--partitions 12]

Needs Kafka (FLOPWATCH_KAFKA_BOOTSTRAP, default 127.0.0.1:9092). A simulated 12 x 4 cluster (100-sample
messages, all 23 streams) is published once and read back into memory. For each count, that many
``flopwatch worker`` processes (plain runtime: ingest with derive, spikes and frames on Kafka; each its own
embedded chDB, since only throughput is measured) join a fresh group on fresh topics; once the group is
settled (every worker assigned, no rebalance for 2 s) the recorded messages are produced again, same keys
and so the same partitions, and the workers read them.

The rate is the samples read over the time from the start of that produce to the last flush that added
any; each worker's CPU (user + system, from /proc) is taken over the same span, so starting (imports,
opening chDB, joining the group) is not counted. On this 2-core machine two or three workers share the
cores with the broker and the producer: the sum is bounded, the CPU per sample is the figure.
Prints one JSON object per count and a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
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

from clock_cost import fetch  # deploy/bench/
from scale import cpu_s  # deploy/bench/

from agents.collect.simulator import SimulatorPublisher
from agents.kafka.admin import delete_topics, ensure_topics
from agents.kafka.producer import SampleProducer
from agents.settings import Settings, load_settings, settings_env
from streams.sim.simulate import SimParams

Recorded = list[tuple[str, bytes | None, bytes]]  # (topic without its prefix, key, value)


class _Run:
    """One worker process: when its partitions were assigned, and what its progress lines said with the CPU
    it had used at each."""

    def __init__(self, settings: Settings) -> None:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLOPWATCH_")}, **settings_env(settings)}
        self.proc = subprocess.Popen([sys.executable, "-m", "agents.cli.main", "worker", "--runtime", "plain",
                                      "--progress", "json"],
                                     env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.assigned: list[float] = []
        self.points: list[tuple[float, int, float]] = []  # (monotonic, samples so far, CPU s so far)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if "assigned partitions [" in line:
                self.assigned.append(time.monotonic())
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

    @property
    def samples(self) -> int:
        return self.points[-1][1] if self.points else 0


def _settled(runs: list[_Run], quiet_s: float = 2.0, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(r.assigned for r in runs) and time.monotonic() - max(r.assigned[-1] for r in runs) >= quiet_s:
            return
        if any(r.proc.poll() is not None for r in runs):
            raise RuntimeError("a worker exited before the group settled")
        time.sleep(0.1)
    raise RuntimeError(f"the group did not settle in {timeout_s:.0f} s")


def run(base: Settings, workers: int, recorded: Recorded, samples: int) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    settings = base.replace(topic_prefix=f"wk{tag}.", group_id=f"wk{tag}")
    ensure_topics(settings)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            runs = [_Run(settings.replace(chdb_path=f"{tmp}/chdb{i}")) for i in range(workers)]
            try:
                _settled(runs)
                cpu0 = [cpu_s(r.proc.pid) for r in runs]
                t0 = time.monotonic()
                producer = SampleProducer(settings)
                for topic, key, value in recorded:
                    producer.send(settings.topic_prefix + topic, value, key)
                producer.flush()
                produced_s = time.monotonic() - t0
                deadline = time.monotonic() + 300
                while sum(r.samples for r in runs) < samples and time.monotonic() < deadline:
                    time.sleep(0.1)
            finally:
                for r in runs:
                    r.proc.send_signal(signal.SIGTERM)
                for r in runs:
                    r.proc.wait(60)
                    r.thread.join(10)
    finally:
        delete_topics(settings)
    read = sum(r.samples for r in runs)
    assert read >= samples, f"read {read} of {samples} samples"
    end = max(r.points[-1][0] for r in runs if r.points)
    per = [{"samples": r.samples, "cpu_s": round(r.points[-1][2] - c0, 3),
            "cpu_us_per_sample": round((r.points[-1][2] - c0) / r.samples * 1e6, 3)}
           for r, c0 in zip(runs, cpu0, strict=True) if r.points]
    return {"workers": workers, "samples": read, "seconds": round(end - t0, 3), "produce_s": round(produced_s, 3),
            "samples_per_s": round(read / (end - t0)), "per_worker": per}


def record(base: Settings, samples: int) -> tuple[Recorded, int]:
    """Publish the simulated cluster once and read it back: the messages, and how many samples they hold."""
    tag = uuid.uuid4().hex[:6]
    settings = base.replace(topic_prefix=f"wkrec{tag}.")
    ensure_topics(settings)
    try:
        nodes, gpus = 12, 4
        seconds = max(10.0, samples / (nodes * gpus * 140))  # about 140 samples per GPU-second
        params = SimParams(nodes=nodes, gpus=gpus, seed=5, start_ns=time.time_ns() - int(seconds * 1e9))
        st = SimulatorPublisher(settings, params, batch_size=100).backlog(seconds)
        polls = asyncio.run(fetch(settings, st.messages))
    finally:
        delete_topics(settings)
    n = len(settings.topic_prefix)
    out = [(tp.topic[n:], rec.key, rec.value or b"") for poll in polls for tp, recs in poll.items() for rec in recs]
    return out, st.samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=4_000_000)
    ap.add_argument("--workers", default="1,2,3")
    ap.add_argument("--partitions", type=int, default=12)
    args = ap.parse_args()
    base = load_settings(dict(os.environ), partitions=args.partitions, clickhouse_backend="chdb", web_enabled=False,
                         source_idle_s=0.5)
    recorded, samples = record(base, args.samples)
    print(json.dumps({"samples": samples, "messages": len(recorded)}), flush=True)
    results = []
    for n in [int(x) for x in args.workers.split(",")]:
        res = run(base, n, recorded, samples)
        print(json.dumps(res), flush=True)
        results.append(res)
    one = next((r for r in results if r["workers"] == 1), None)
    summary = {"date": time.strftime("%Y-%m-%d"), "partitions": args.partitions, "runs": [
        {"workers": r["workers"], "samples_per_s": r["samples_per_s"],
         "of_one_worker": round(r["samples_per_s"] / one["samples_per_s"], 2) if one else None,
         "cpu_us_per_sample": [w["cpu_us_per_sample"] for w in r["per_worker"]]} for r in results]}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
