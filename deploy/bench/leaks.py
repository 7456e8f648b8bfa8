"""Leak rules and attribution: recall, delay, false alarms, attribution accuracy and what they cost.

    python deploy/bench/leaks.py [--seeds 3] [--noise-hours 1.5] [--cases 400] [--workers 2]

Four parts, each printed as one JSON object:

- ``scenario``: ``deploy/scenarios/leaks.toml`` (the seven leaks and nine look-alikes on 4 x 4
  simulated GPUs, 30 min) with ``--seeds`` simulator seeds, through the detection agent's
  ``Detectors`` on frames made by ``streams.sim.bench_frames``: per rule the recall and the delay
  from the leak's start to its alert, look-alikes that fired, any other leak alert, and whether
  the cause each leak plants ranks first / in the first three of its attribution.
- ``noise``: the simulator without a scenario, 4 x 4 GPUs for ``--noise-hours`` per seed (two
  seeds): every leak alert is a false alarm, reported per GPU-day.
- ``attribution``: ``--cases`` synthetic alerts on one GPU, each with one planted cause among
  distractors: a series that steps 1-25 s before the symptom (its size 2-8 noise sigmas, the
  other series noisy, three of them stepping at random times outside 45 s before to 15 s after
  the onset, the symptom's mirrors following it), or a Kubernetes event of the pod 12-300 s
  before the onset (with another pod's events and routine events around), or a label change;
  the planted cause's rank: top-1 and top-3 accuracy.
- ``cost``: seconds per frame of ``Detectors.on_message`` on the same frames (4 x 4 GPUs, 15 min)
  with everything on, against drift and spikes alone (leak rules and attribution off), median of
  three rounds each, alternating.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from schemas.alerts import LEAK_RULES, Alert, make_alert  # noqa: E402
from schemas.frame_messages import FrameMessage, GpuFrame  # noqa: E402
from streams.attribution.context import Happening  # noqa: E402
from streams.attribution.rank import SYMPTOM, AttributionParams  # noqa: E402
from streams.detect.detectors import Detectors, DetectParams  # noqa: E402
from streams.leaks.params import LeakParams  # noqa: E402
from streams.sim.bench_frames import frames  # noqa: E402
from streams.sim.scenario import parse_scenario  # noqa: E402
from streams.sim.simulate import ClusterSimulator, SimParams  # noqa: E402

S = 1_000_000_000
DEBUG = False
PLANTED = {"pipeline_stall": {"host_cpu_util"}, "batching_collapse": {"request_rate"},
           "nccl_retransmit_storm": {"nvlink_tx", "nvlink_rx"}, "nccl_slow_allreduce": {"nvlink_tx", "nvlink_rx"},
           "checkpoint_io_storm": {"disk_write"}}


def run_scenario(seed: int) -> dict[str, Any]:
    sc = parse_scenario((ROOT / "deploy/scenarios/leaks.toml").read_text(), "leaks.toml")
    p = SimParams(nodes=4, gpus=4, seed=seed)
    batches = ClusterSimulator(p, scenario=sc).advance(p.start_ns + 1800 * S)
    det = Detectors(DetectParams(), S)
    leaks = [a for m in frames(batches, p.start_ns, 1800, S) for a in det.on_message(m) if a.rule in LEAK_RULES]
    out: dict[str, Any] = {"found": {}, "lookalike_alarms": [], "attribution": {}, "other_alarms": 0}
    used: set[str] = set()
    for t in sc.truth(p.start_ns):
        target = "host" if t.rule == "checkpoint_io_storm" else t.gpu
        hits = [a for a in leaks if a.rule == t.rule and a.node == t.node and a.gpu == target and a.state == "firing"
                and t.start_ns - 60 * S <= a.onset_ts_ns <= t.end_ns]
        used |= {a.id for a in hits}
        if t.expect == "alert":
            out["found"][t.rule] = None if not hits else (hits[0].ts_ns - t.start_ns) / S
            attributed = [a for a in hits if a.causes]
            if t.rule in PLANTED:
                names = [c.cause for c in attributed[0].causes] if attributed else []
                rank = next((i for i, n in enumerate(names) if n in PLANTED[t.rule]), None)
                out["attribution"][t.rule] = rank
        elif hits:
            out["lookalike_alarms"].append(f"{t.rule}/{t.variant}")
    out["other_alarms"] = len({a.id for a in leaks if a.state == "firing"} - used)
    return out


def run_noise(args: tuple[int, float]) -> dict[str, Any]:
    seed, hours = args
    p = SimParams(nodes=4, gpus=4, seed=seed)
    seconds = hours * 3600.0
    batches = ClusterSimulator(p).advance(p.start_ns + int(seconds * S))
    det = Detectors(DetectParams(), S)
    fired: dict[str, int] = defaultdict(int)
    for m in frames(batches, p.start_ns, seconds, S):
        for a in det.on_message(m):
            if a.rule in LEAK_RULES and a.state == "firing" and not a.causes:
                fired[a.rule] += 1
    return {"seed": seed, "gpu_hours": 16 * hours, "alarms": dict(fired)}


# --- attribution on planted causes ---------------------------------------------------------------------------------

CANDIDATES = {  # what a planted series cause can be, per rule (its symptom and mirrors excluded)
    "pipeline_stall": ("host_cpu_util", "disk_write", "dataloader_wait_ms", "pcie_rx"),
    "batching_collapse": ("request_rate", "host_cpu_util", "pcie_rx", "sm_clock"),
    "nccl_slow_allreduce": ("nvlink_tx", "nvlink_rx", "pcie_tx", "ecc_errors", "host_cpu_util"),
    "nccl_retransmit_storm": ("nvlink_tx", "nvlink_rx", "xid_errors", "pcie_rx"),
    "checkpoint_io_storm": ("disk_write", "host_cpu_util"),
    "efficiency_drift": ("sm_clock", "temperature", "nccl_allreduce_ms", "dataloader_wait_ms"),
    "idle_allocated": ("dataloader_wait_ms", "host_cpu_util", "pcie_rx"),
    "memory_fragmentation": ("torch_reserved", "torch_allocated"),
}
LEVEL = {"gpu_util": 70.0, "sm_active": 0.6, "tensor_active": 0.5, "power": 500.0, "temperature": 60.0,
         "sm_clock": 1900.0, "fb_used": 60000.0, "pcie_tx": 2e9, "pcie_rx": 3e9, "nvlink_tx": 5e10, "nvlink_rx": 5e10,
         "ecc_errors": 1.0, "xid_errors": 0.5, "torch_allocated": 4e10, "torch_reserved": 6e10,
         "nccl_allreduce_ms": 5.0, "nccl_retries": 1.0, "dataloader_wait_ms": 5.0, "queue_depth": 3.0,
         "request_rate": 400.0, "request_latency_ms": 20.0, "flops_per_watt": 1e12, "host_cpu_util": 30.0,
         "disk_write": 5e7}
REASONS = ("OOMKilled", "Evicted", "BackOff", "NodeHasDiskPressure", "Preempting", "Killing")


def planted_case(k: int) -> tuple[str, str]:
    """One synthetic alert with one planted cause; (the cause, its rank as a string: '0', '1', ... or 'none')."""
    rng = np.random.default_rng(10_000 + k)
    rule = list(CANDIDATES)[k % len(CANDIDATES)]
    kind = ("series", "series", "series", "event", "labels")[int(rng.integers(5))]
    n, onset = 300, 220
    symptom = SYMPTOM[rule]
    cause = str(rng.choice(CANDIDATES[rule])) if kind == "series" else (
        str(rng.choice(REASONS)) if kind == "event" else "workload_changed")
    lead = int(rng.integers(1, 26))
    t = np.arange(n)
    series: dict[str, np.ndarray] = {}
    for name, level in LEVEL.items():  # AR(1) noise, 3% of the level
        e = rng.standard_normal(n)
        x = np.empty(n)
        x[0] = e[0]
        for i in range(1, n):
            x[i] = 0.7 * x[i - 1] + e[i]
        series[name] = level * (1 + 0.03 * x)
    sign = -1.0 if symptom in ("gpu_util", "sm_active", "flops_per_watt") else 1.0
    series[symptom] = series[symptom] * np.where(t >= onset, 1 + sign * 0.6, 1.0)
    if symptom in ("gpu_util", "sm_active", "flops_per_watt"):  # the mirrors follow the symptom
        for m in ("gpu_util", "sm_active", "tensor_active", "power", "flops_per_watt"):
            if m != symptom:
                series[m] = series[m] * np.where(t >= onset, 0.5, 1.0)
    for name in rng.choice([s for s in LEVEL if s != symptom and s != cause], 3, replace=False):
        # Distractors step at random times, but not where a cause would (45 s before the onset to 15 s after):
        # a series that steps there is a cause as plausible as the planted one.
        at = int(rng.choice([x for x in range(20, n - 20) if not onset - 45 <= x <= onset + 15]))
        series[str(name)] = series[str(name)] * np.where(t >= at, 1 + rng.choice([-1, 1]) * rng.uniform(0.1, 0.5), 1.0)
    if kind == "series":
        size = rng.uniform(2.0, 8.0) * 0.03 * rng.choice([-1, 1])
        series[cause] = series[cause] * np.where(t >= onset - lead, 1 + size, 1.0)
    det = Detectors(DetectParams(), S)
    base = 1_796_200_000 * S
    labels_old = {"namespace": "ml", "workload": "etl", "pod": "etl-0"}
    labels = {"namespace": "ml", "workload": "llm", "pod": "llm-0"}
    for i in range(n):
        values = {k2: float(v[i]) for k2, v in series.items() if k2 not in ("host_cpu_util", "disk_write",
                                                                            "flops_per_watt")}
        lab = labels_old if kind == "labels" and i < onset - lead else labels
        g = GpuFrame("0", lab, values, {"flops_per_watt": float(series["flops_per_watt"][i])}, "")
        host = GpuFrame("host", {}, {"host_cpu_util": float(series["host_cpu_util"][i]),
                                     "disk_write": float(series["disk_write"][i])}, {}, "")
        det._remember(FrameMessage("node-1", base + i * S, S, (g, host)))
    if kind == "event":
        det.events.add(Happening("node-1", base + (onset - lead * 12) * S, cause, "Warning", pod="llm-0"))
        det.events.add(Happening("node-1", base + (onset - 5) * S, str(rng.choice(REASONS)), "Warning",
                                 pod="other-0"))  # another pod's trouble
        det.events.add(Happening("node-1", base + (onset - 30) * S, "Pulled", "Normal", pod="llm-0"))
    a: Alert = make_alert(rule, "warning", "node-1", "0", value=1.0, threshold=1.0, onset_ts_ns=base + onset * S,
                          ts_ns=base + (onset + 30) * S)
    got = det.causes(a)
    names = [c.cause for c in got]
    if DEBUG and (not names or names[0] != cause):
        print(kind, rule, cause, lead, [(c.cause, c.confidence, c.evidence.get("lead_s")) for c in got[:3]])
    return f"{kind}:{rule}", str(names.index(cause)) if cause in names else "none"


def attribution(cases: int, workers: int) -> dict[str, Any]:
    with ProcessPoolExecutor(workers) as ex:
        got = list(ex.map(planted_case, range(cases), chunksize=8))
    ranks = [r for _, r in got]
    by_kind: dict[str, list[str]] = defaultdict(list)
    for key, r in got:
        by_kind[key.split(":")[0]].append(r)

    def acc(rs: list[str], k: int) -> float:
        return round(sum(r != "none" and int(r) < k for r in rs) / len(rs), 4)

    return {"part": "attribution", "cases": cases, "top1": acc(ranks, 1), "top3": acc(ranks, 3),
            "by_kind": {k: {"cases": len(v), "top1": acc(v, 1), "top3": acc(v, 3)} for k, v in sorted(by_kind.items())}}


def cost(rounds: int) -> dict[str, Any]:
    p = SimParams(nodes=4, gpus=4, seed=3)
    batches = ClusterSimulator(p).advance(p.start_ns + 900 * S)
    msgs = list(frames(batches, p.start_ns, 900, S))
    plain = DetectParams(leaks=LeakParams().all_off(), attribution=AttributionParams(enabled=False))
    times: dict[str, list[float]] = {"all": [], "drift_and_spikes": []}
    for _ in range(rounds):
        for name, params in (("all", DetectParams()), ("drift_and_spikes", plain)):
            det = Detectors(params, S)
            t0 = time.perf_counter()
            for m in msgs:
                det.on_message(m)
            times[name].append((time.perf_counter() - t0) / len(msgs))
    a, b = statistics.median(times["all"]), statistics.median(times["drift_and_spikes"])
    return {"part": "cost", "frames": len(msgs), "gpus_per_frame": 4, "us_per_frame_all": round(a * 1e6, 1),
            "us_per_frame_drift_and_spikes": round(b * 1e6, 1), "ratio_without_to_with": round(b / a, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--noise-hours", type=float, default=1.5)
    ap.add_argument("--cases", type=int, default=400)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as ex:
        scen = list(ex.map(run_scenario, range(args.seeds)))
        noise = list(ex.map(run_noise, [(s, args.noise_hours) for s in (11, 12)]))
    per_rule: dict[str, dict[str, Any]] = {}
    for rule in LEAK_RULES:
        delays = [r["found"][rule] for r in scen if r["found"].get(rule) is not None]
        ranks = [r["attribution"].get(rule) for r in scen if rule in r["attribution"]]
        per_rule[rule] = {"recall": round(len(delays) / len(scen), 3),
                          "delay_s_median": statistics.median(delays) if delays else None,
                          "delay_s_max": max(delays) if delays else None,
                          "planted_cause_top1": None if not ranks else sum(r == 0 for r in ranks) / len(ranks),
                          "planted_cause_top3": None if not ranks else sum(r is not None and r < 3 for r in ranks)
                          / len(ranks)}
    print(json.dumps({"part": "scenario", "seeds": args.seeds, "per_rule": per_rule,
                      "lookalike_alarms": [x for r in scen for x in r["lookalike_alarms"]],
                      "other_alarms": sum(r["other_alarms"] for r in scen)}, indent=1))
    gpu_h = sum(n["gpu_hours"] for n in noise)
    alarms = sum(sum(n["alarms"].values()) for n in noise)
    print(json.dumps({"part": "noise", "gpu_hours": gpu_h, "alarms": alarms,
                      "per_gpu_day": round(alarms / gpu_h * 24, 3), "by_seed": noise}, indent=1))
    print(json.dumps(attribution(args.cases, args.workers), indent=1))
    print(json.dumps(cost(args.rounds), indent=1))
    print(json.dumps({"wall_s": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    main()
