"""Scale curve: the default worker live at growing cluster sizes; its CPU per GPU-hour, peak RSS and alert latency.

    python deploy/bench/scale.py [--sizes 64,256,1024] [--hz 1,10] [--seconds 100] [--step 0.25] [--profile]

Needs Kafka (FLOPWATCH_KAFKA_BOOTSTRAP; ``deploy/services.sh start``). For each size (GPUs, 8 per node) and
sampling rate of the NVML/DCGM and framework streams, a fresh default ``flopwatch worker`` (Faust runtime,
chDB, 1 s grid) reads the simulated cluster published live (all 23 streams; the host and inference
streams at their own 1 Hz) in ``--step`` s steps, as a collector flushing that often would. From 40 s on,
one GPU after another drops 30% of its efficiency for 10 s, every 3 s; the script reads the alerts.

The worker's CPU (user + system, from /proc) is taken over the steady part (from 20 s to the end) and
turned into CPU seconds per GPU-hour; peak RSS is the kernel's high-water mark (VmHWM). Alert latency is as
in ``alert_latency.py``: from the end of the confirming tick to the alert on Kafka, shown beyond the
allowed lateness and grid. The publisher shares this 2-core machine: its lag (how far behind real time a
step finished, at most) is printed so a run it could not keep up with is seen for what it is.
Prints one JSON object per run and a summary with the cost per GPU relative to the smallest size.
``--profile`` (py-spy, the ``bench`` extra) also samples the worker over the steady part and writes where its
time goes to ``build/flamegraphs/worker-live-<gpus>x<hz>hz.txt`` (deploy/bench/stacks.py).
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from alert_latency import scenario_text  # deploy/bench/
from live_worker import live_worker  # deploy/bench/
from stacks import summarize  # deploy/bench/

from agents.collect.simulator import PublishStats, SimulatorPublisher
from schemas.alerts import decode_alert
from streams.sim.scenario import parse_scenario
from streams.sim.simulate import SimParams

S = 1_000_000_000
GPUS_PER_NODE = 8
ROOT = Path(__file__).resolve().parents[2]
PROFILE_RATE = 100
TICK_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK_S


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def run(gpus: int, hz: int, seconds: float, step_s: float, profile: bool = False) -> dict[str, Any]:
    nodes = max(1, gpus // GPUS_PER_NODE)
    period = S // hz
    with live_worker("sc") as (settings, consumer, _, worker):
        scenario = parse_scenario(scenario_text(nodes, GPUS_PER_NODE, seconds, every=3.0), "scale")
        params = SimParams(nodes=nodes, gpus=GPUS_PER_NODE, seed=5, start_ns=time.time_ns(), steady=True,
                           nvml_period_ns=period, step_period_ns=max(period, 250_000_000))
        pub = SimulatorPublisher(settings, params, batch_size=1000, scenario=scenario)
        behind: list[float] = []

        def on_step(_: PublishStats) -> None:
            behind.append((time.time_ns() - pub.until_ns) / S)

        live = threading.Thread(target=pub.live, args=(seconds,), kwargs={"step_s": step_s, "on_step": on_step})
        t0 = time.monotonic()
        live.start()
        stacks = ROOT / "build" / "flamegraphs" / f"worker-live-{gpus}x{hz}hz.stacks"
        spy: subprocess.Popen[bytes] | None = None
        lat: list[float] = []
        fired: set[str] = set()
        cpu0: tuple[float, float] | None = None
        cpu1: tuple[float, float] | None = None
        while cpu1 is None or time.monotonic() - cpu1[0] < 10:  # alerts of the last drops come after
            now = time.monotonic()
            if cpu0 is None and now - t0 >= 20:
                cpu0 = (now, cpu_s(worker.pid))
                if profile:
                    spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p",
                                            str(worker.pid), "-d", str(max(5, int(seconds - 25))), "-r",
                                            str(PROFILE_RATE), "-f", "raw", "-o", str(stacks), "--nonblocking"],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if cpu1 is None and not live.is_alive():
                cpu1 = (now, cpu_s(worker.pid))
            m = consumer.poll(0.05)
            if m is None or m.error():
                continue
            seen_ns = time.time_ns()
            a = decode_alert(m.value() or b"")
            if a.rule == "efficiency_drift" and a.state == "firing" and a.id not in fired:
                fired.add(a.id)  # the attributed firing follows the plain one under the same id
                lat.append((seen_ns - a.ts_ns) / S)
        live.join()
        rss = peak_rss_mib(worker.pid)
        if spy is not None:
            spy.wait(60)
            summarize(stacks, stacks.with_suffix(".txt"), PROFILE_RATE)
        assert cpu0 is not None and cpu1 is not None
        wall, cpu = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
        lat.sort()
        slack = (settings.lateness_ms + settings.grid_ms) / 1000

        def q(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))] - slack, 3) if lat else None

        return {"gpus": nodes * GPUS_PER_NODE, "nodes": nodes, "hz": hz, "seconds": seconds,
                "samples": pub.stats.samples, "messages": pub.stats.messages,
                "samples_per_s": round(pub.stats.samples / seconds),
                "worker_cpu_share": round(cpu / wall, 3),
                "cpu_s_per_gpu_hour": round(cpu / wall * 3600 / (nodes * GPUS_PER_NODE), 2),
                "peak_rss_mib": round(rss, 1),
                "alerts": len(lat), "drops": len(scenario.events),
                "beyond_lateness_and_grid_median_s": round(statistics.median(lat) - slack, 3) if lat else None,
                "beyond_lateness_and_grid_p99_s": q(0.99),
                "publisher_behind_max_s": round(max(behind), 2) if behind else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="64,256,1024", help="GPUs, comma-separated (8 per node)")
    ap.add_argument("--hz", default="1,10", help="sampling rates of the NVML/DCGM and framework streams")
    ap.add_argument("--seconds", type=float, default=100.0)
    ap.add_argument("--step", type=float, default=0.25, help="seconds between the publisher's flushes")
    ap.add_argument("--profile", action="store_true", help="py-spy the worker over each run's steady part")
    args = ap.parse_args()
    out = []
    for hz in (int(h) for h in args.hz.split(",")):
        for gpus in (int(g) for g in args.sizes.split(",")):
            r = run(gpus, hz, args.seconds, args.step, args.profile)
            print(json.dumps(r), flush=True)
            out.append(r)
    for hz in {r["hz"] for r in out}:
        rows = [r for r in out if r["hz"] == hz]
        base = rows[0]["cpu_s_per_gpu_hour"]
        print(json.dumps({"hz": hz, "cost_per_gpu_vs_smallest": {r["gpus"]: round(r["cpu_s_per_gpu_hour"] / base, 3)
                                                                 for r in rows},
                          "peak_rss_mib": {r["gpus"]: r["peak_rss_mib"] for r in rows}}), flush=True)


if __name__ == "__main__":
    main()
