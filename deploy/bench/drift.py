"""Efficiency-drift rule on synthetic FLOPS/W series: recall, delay and false alarms, per grid and noise.

    python deploy/bench/drift.py [--per-kind 200] [--noise-gpus 100] [--noise-hours 6]
                                 [--noise 0.01,0.02] [--noise-only 0.01,0.02,0.05] [--workers 2] [--seed 1]
                                 [--lookalikes 20] [--no-load] [--power-noise 0.003,0.03]
                                 [--set FIELD=VALUE ...]

Each GPU runs one seeded series through ``streams.detect.drift.EfficiencyDrift`` (default
parameters, or ``--set`` overrides: must alert at 12% for 3 s, never below 10%, 60 s
median baseline). The true
signal is piecewise constant in continuous time; a tick's value is its mean over the
tick, times (1 + a gaussian of sigma ``noise`` per tick, the same sigma at both grids).
Events start at a random instant (not tick-aligned) after 80-110 s of warm-up; a series
ends 10 s after its event:

- drops: depth in {10, 11, 12, 13, 15, 20, 30, 50}%, length uniform in [3, 30] s
  (10-12% is the band where either answer is allowed);
- dips: depth uniform in [20, 60]%, length uniform in (0.3, 1), [1, 2), [2, 3) s, or 2.9 s;
- shallow drops: depth 5%, 8% or 9.5%, length uniform in [10, 60] s;
- noise only: ``--noise-gpus`` GPUs for ``--noise-hours`` at 1 s (a tenth of that at
  100 ms, the same number of ticks), at each ``--noise-only`` level;
- look-alikes (``--lookalikes`` seeds each, 0 to skip): the load alone moves, with the
  physics of ``deploy/bench/load_series.py`` (power follows the load with a 0.5 s lag, the
  work per watt falls with the load): steps down from 0.9 SM activity to 0.8, 0.6 (the
  issue's 0.92 -> 0.5), 0.5 and 0.2 of it, up from 0.4 to 1.5 and 2 times; a square wave between
  0.9 and 0.5 or 0.17 of it with periods of 5, 10, 25, 50 and 120 s; a sine between the
  same with periods of 5, 10, 60 and 120 s; a diurnal ramp down to 0.5 or 0.2 and back over 600
  and 1800 s; a warm-up (the first 10 or 30 s of a pod at 0.1 or 0.4 of its load). Any firing is a
  false alarm, reported per GPU-day of look-alike ticks;
- drops after a load move (with the look-alikes): the load steps from 0.9 to 0.5 at
  60 s, then a drop of 15-30% at that steady load for 4-20 s: the drift must still be seen;
- drifts at a steady load (with the look-alikes): SM activity 0.3, 0.5, 0.7 or 0.95, a drop of
  12, 15, 20 or 30% for 4-30 s, by a slower kernel (less work, same power) or by clocks held
  down under the power cap (less work, same power, which hunts 1% around the cap).

Every tick carries its power (steady at 300-650 W, the first ``--power-noise``, for the drops,
dips, shallow drops and noise; the look-alike families at each ``--power-noise``: NVML's
reading is good to a few watts, but a workload's own power wobbles more), and its FLOPS/W is
the work over that measured power, so the rule judges against its load curve, as the worker does;
``--no-load`` gives the ticks without power (the unconditioned rule; look-alikes then
show what it did before the load curve).

Delay = end of the confirming tick (tick_ns + grid_ns) - TRUE onset, in event time. A drop
is recalled when a firing is confirmed in (onset - one tick, end of drop + one tick]. A
dip or shallow drop with any firing is a false alarm. Also measured (``--sim-noise``, on by
default, under a second): the per-tick noise of ``streams.sim.simulate.ClusterSimulator``'s
FLOPS/W (tensor_active / power per tick), robust sigma of tick-to-tick log differences
/ sqrt(2), for its inference and training GPUs: ~5% per tick at 100 ms (NVML samples
every 100 ms with 0.04 of gaussian activity noise), ~1.6% at 1 s on inference GPUs and
~4.7% on training ones (compute/communication/stall phases inside a second). Neither 1%
nor 2% at 100 ms is what the simulator gives; 2% at 1 s is its inference GPUs. For white
per-sample noise 3 s hold the same information at either grid (se of the level ~0.9%
for the simulator), so 12% vs 10% is then separable only about 85/85 in 3 s, whatever
the rule. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from streams.detect.drift import EfficiencyDrift
from streams.detect.drift_params import DriftParams
from streams.sim.load_series import Load, load_ticks

S = 1_000_000_000
DEPTHS = (0.10, 0.11, 0.12, 0.13, 0.15, 0.20, 0.30, 0.50)
DIPS = {"0.3-1s": (0.3, 1.0), "1-2s": (1.0, 2.0), "2-3s": (2.0, 3.0), "2.9s": (2.9, 2.9)}
SHALLOW = (0.05, 0.08, 0.095)
Case = tuple[str, str, float, float, float, int]  # kind, label, depth, onset_s, length_s, seed
WARM_S = 100.0  # steady load before a look-alike's event
STEADY_LOADS = (0.3, 0.5, 0.7, 0.95)  # SM activity of the drifts at a steady load
STEADY_DEPTHS = (0.12, 0.15, 0.2, 0.3)
LOOKALIKES: dict[str, Load] = {
    **{f"step down {lv:g}": Load("step", 0.9, lv, onset_s=WARM_S, length_s=400) for lv in (0.8, 0.6, 0.5, 0.2)},
    **{f"step up {lv:g}": Load("step", 0.4, lv, onset_s=WARM_S, length_s=400) for lv in (1.5, 2.0)},
    **{f"square {p:g}s {lv:g}": Load("square", 0.9, lv, p, WARM_S, max(300, 5 * p))
       for p in (5, 10, 25, 50, 120) for lv in (0.5, 0.17)},
    **{f"sine {p:g}s {lv:g}": Load("sine", 0.9, lv, p, WARM_S, max(300, 5 * p))
       for p in (5, 10, 60, 120) for lv in (0.5, 0.2)},
    **{f"diurnal {p:g}s {lv:g}": Load("diurnal", 0.9, lv, p, WARM_S, p) for p in (600, 1800) for lv in (0.5, 0.2)},
    # A pod that starts: its first seconds at a fraction of the load (loading weights, warming caches), then full.
    **{f"warm-up {n:g}s {lv:g}": Load("step", 0.9, lv, onset_s=0, length_s=n) for n in (10, 30) for lv in (0.1, 0.4)},
}


def ticks_of(grid_ns: int, seconds: float, depth: float, onset_s: float, length_s: float, noise: float,
             seed: int, sub: int = 1) -> tuple[list[int], list[float], list[tuple[float | None, ...]]]:
    """Ticks, their FLOPS/W and (``sub`` > 1) each tick's profile of ``sub`` buckets, whose mean the tick is
    (each bucket noisier by sqrt(sub), as a bucket holds a tenth of the tick's samples at sub = 10)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * S) // grid_ns
    lo, hi = int(onset_s * S), int((onset_s + length_s) * S)
    level = rng.uniform(2e10, 6e10)
    if sub <= 1:
        t = np.arange(n, dtype=np.int64) * grid_ns
        covered = np.clip(np.minimum(t + grid_ns, hi) - np.maximum(t, lo), 0, grid_ns) / grid_ns
        values = level * (1 - depth * covered) * (1 + rng.normal(0.0, noise, n))
        return t.tolist(), values.tolist(), [()] * n
    step = grid_ns // sub
    tb = np.arange(n * sub, dtype=np.int64) * step
    cov = np.clip(np.minimum(tb + step, hi) - np.maximum(tb, lo), 0, step) / step
    vb = (level * (1 - depth * cov) * (1 + rng.normal(0.0, noise * np.sqrt(sub), n * sub))).reshape(n, sub)
    return (np.arange(n, dtype=np.int64) * grid_ns).tolist(), vb.mean(axis=1).tolist(), \
        [tuple(r) for r in vb.tolist()]


def run_case(args: tuple[int, float, Case, float, dict[str, Any], bool, float, int]) -> dict[str, Any]:
    grid_ns, noise, (kind, label, depth, onset_s, length_s, seed), seconds, overrides, loaded, pn, sub = args
    subs: list[tuple[float | None, ...]] = []
    if kind == "lookalike":
        t, v, power = load_ticks(grid_ns, seconds, LOOKALIKES[label], noise, seed, power_noise=pn)
    elif kind == "steady":  # label "<load> <how>": a drift at a steady SM activity, by a slower kernel or a clock cap
        load, how = label.split()
        t, v, power = load_ticks(grid_ns, seconds, Load("steady", float(load)), noise, seed, drop=depth,
                                 drop_onset_s=onset_s, drop_length_s=length_s, capped=how == "clock", power_noise=pn)
    elif kind == "moved":  # a drop at a steady load the GPU moved to 40-60 s before
        t, v, power = load_ticks(grid_ns, seconds, Load("step", 0.9, 0.5, onset_s=60, length_s=seconds), noise,
                                 seed, drop=depth, drop_onset_s=onset_s, drop_length_s=length_s, power_noise=pn)
    else:
        t, v, subs = ticks_of(grid_ns, seconds, depth, onset_s, length_s, noise, seed, sub)
        rng = np.random.default_rng(seed + 1)
        power = (rng.uniform(300, 650) * (1 + rng.normal(0.0, pn, len(t)))).tolist()
    d = EfficiencyDrift(DriftParams(**overrides), grid_ns)
    loads = power if loaded else [None] * len(t)
    subs = subs or [()] * len(t)
    fired = [(e.tick_ns, e.at_ns or e.tick_ns + grid_ns) for ti, vi, pi, si in zip(t, v, loads, subs, strict=True)
             for e in d.update(ti, vi, "job", load=pi, sub=si) if e.state == "firing"]
    firings = [f for f, _ in fired]
    lo, hi = int(onset_s * S), int((onset_s + length_s) * S)
    hits = [at for f, at in fired if lo - grid_ns < f <= hi + grid_ns]
    return {"kind": kind, "label": label, "depth": depth, "length_s": length_s, "firings": len(firings),
            "ticks": len(t),
            "delay_s": (hits[0] - lo) / S if hits else None, "early": sum(f <= lo - grid_ns for f in firings)}


def cases(per_kind: int, seed: int) -> list[Case]:
    rng = np.random.default_rng(seed)
    out: list[Case] = []

    def some(kind: str, label: str, depth: tuple[float, float], length_s: tuple[float, float]) -> None:
        out.extend((kind, label, float(rng.uniform(*depth)), float(rng.uniform(80, 110)), float(rng.uniform(*length_s)),
                    int(rng.integers(2**31))) for _ in range(per_kind))

    for depth in DEPTHS:
        some("drop", f"{depth * 100:g}%", (depth, depth), (3, 30))
    for label, length in DIPS.items():
        some("dip", label, (0.2, 0.6), length)
    for depth in SHALLOW:
        some("shallow", f"{depth * 100:g}%", (depth, depth), (10, 60))
    return out


def lookalike_cases(seeds: int, seed: int) -> list[Case]:
    rng = np.random.default_rng(seed + 7)
    out: list[Case] = [("lookalike", label, 0.0, 0.0, 0.0, int(rng.integers(2**31)))
                       for label in LOOKALIKES for _ in range(seeds)]
    out += [("moved", f"{depth * 100:g}%", depth, float(rng.uniform(100, 130)), float(rng.uniform(4, 20)),
             int(rng.integers(2**31))) for depth in (0.15, 0.2, 0.3) for _ in range(seeds * 4)]
    out += [("steady", f"{load:g} {how}", depth, float(rng.uniform(80, 110)), float(rng.uniform(4, 30)),
             int(rng.integers(2**31))) for load in STEADY_LOADS for how in ("tensor", "clock")
            for depth in STEADY_DEPTHS for _ in range(seeds)]
    return out


def series_s(c: Case) -> float:
    """How long a case's series runs: 10 s after its event."""
    if c[0] == "lookalike":
        ld = LOOKALIKES[c[1]]
        return ld.onset_s + ld.length_s + 60
    return c[3] + c[4] + 10


def summarise_lookalikes(rows: list[dict[str, Any]], grid_ns: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label in LOOKALIKES:
        sel = [r for r in rows if r["kind"] == "lookalike" and r["label"] == label]
        days = sum(r["ticks"] for r in sel) * grid_ns / S / 86400
        out[label] = {"n": len(sel), "firings": sum(r["firings"] for r in sel),
                      "per_gpu_day": round(sum(r["firings"] for r in sel) / days, 1)}
    days = sum(r["ticks"] for r in rows if r["kind"] == "lookalike") * grid_ns / S / 86400
    steady: dict[str, Any] = {}
    for how in ("tensor", "clock"):
        for depth in STEADY_DEPTHS:
            steady[f"{how} {depth * 100:g}%"] = recall_of([r for r in rows if r["kind"] == "steady"
                                                           and r["label"].endswith(how) and r["depth"] == depth])
    return {"kinds": out, "gpu_days": round(days, 2), "firings": sum(v["firings"] for v in out.values()),
            "per_gpu_day": round(sum(v["firings"] for v in out.values()) / max(days, 1e-9), 2),
            "moved": recall_of([r for r in rows if r["kind"] == "moved"]), "steady": steady}


def recall_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    delays = [r["delay_s"] for r in rows if r["delay_s"] is not None]
    return {"n": len(rows), "recall": round(len(delays) / max(len(rows), 1), 3), "delay_p50_s": pct(delays, 50),
            "delay_p95_s": pct(delays, 95), "early_firings": sum(r["early"] for r in rows)}


def pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 2) if xs else None


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    res: dict[str, Any] = {"drops": {}, "dips": {}, "shallow": {}}
    for depth in DEPTHS:
        label = f"{depth * 100:g}%"
        mine = [r for r in rows if r["kind"] == "drop" and r["label"] == label]
        delays = [r["delay_s"] for r in mine if r["delay_s"] is not None]
        long_ = [r for r in mine if r["length_s"] >= 4]
        res["drops"][label] = {
            "n": len(mine), "recall": round(len(delays) / len(mine), 3),
            "recall_len_ge_4s": round(sum(r["delay_s"] is not None for r in long_) / max(len(long_), 1), 3),
            "within_3.5s": round(sum(x <= 3.5 for x in delays) / len(mine), 3),
            "delay_p50_s": pct(delays, 50), "delay_p95_s": pct(delays, 95),
            "early_firings": sum(r["early"] for r in mine)}
    for kind in ("dips", "shallow"):
        labels = DIPS if kind == "dips" else [f"{d * 100:g}%" for d in SHALLOW]
        for label in labels:
            sel = [r for r in rows if r["kind"] == kind.removesuffix("s") and r["label"] == label]
            alarmed = sum(r["firings"] > 0 for r in sel)
            res[kind][label] = {"n": len(sel), "false_alarm_rate": round(alarmed / len(sel), 3)}
    return res


def sim_noise() -> dict[str, Any]:
    """Per-tick relative noise of the simulator's FLOPS/W (tensor_active / power), per grid and node kind."""
    from streams.sim.simulate import ClusterSimulator, SimParams

    p = SimParams(nodes=2, gpus=2, seed=7)  # node 0 trains, node 1 serves
    sim = ClusterSimulator(p)
    series: dict[tuple[str, str, str], tuple[list[int], list[float]]] = {}
    for b in sim.advance(p.start_ns + 900 * S):
        if b.sensor in ("tensor_active", "power"):
            ts, vs = series.setdefault((b.node, b.gpu, b.sensor), ([], []))
            ts.extend(b.ts_ns)
            vs.extend(b.value)
    out: dict[str, Any] = {}
    for grid_ns in (S, S // 10):
        per: dict[str, list[float]] = {"training": [], "inference": []}
        for (node, gpu, sensor), (ts, pw) in sorted(series.items()):
            if sensor != "power":
                continue
            k = (np.asarray(ts) - p.start_ns) // grid_ns
            n = int(k.max()) + 1
            count = np.bincount(k, minlength=n)
            mean_power = np.bincount(k, weights=np.asarray(pw), minlength=n) / np.maximum(count, 1)
            tk = (np.asarray(series[(node, gpu, "tensor_active")][0]) - p.start_ns) // grid_ns
            mean_tensor = np.bincount(tk, weights=np.asarray(series[(node, gpu, "tensor_active")][1]),
                                      minlength=n)[:n] / np.maximum(np.bincount(tk, minlength=n)[:n], 1)
            busy = (count > 0) & (mean_tensor > 0.3)
            d = np.diff(np.log(mean_tensor[busy] / mean_power[busy]))
            sigma = 1.4826 * float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2)
            per["training" if node.endswith("00") else "inference"].append(sigma)
        out[f"{grid_ns // 1_000_000}ms"] = {kind: round(float(np.median(v)), 4) for kind, v in per.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-kind", type=int, default=200, help="GPUs per drop depth, dip length and shallow depth")
    ap.add_argument("--noise-gpus", type=int, default=100)
    ap.add_argument("--noise-hours", type=float, default=6.0, help="per noise-only GPU at 1 s (a tenth at 100 ms)")
    ap.add_argument("--noise", default="0.01,0.02", help="per-tick noise sigmas (fractions) for the events")
    ap.add_argument("--noise-only", default="0.01,0.02,0.05", help="per-tick noise sigmas for the noise-only GPUs")
    ap.add_argument("--grids-ms", default="1000,100")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-sim-noise", action="store_true", help="skip measuring the simulator's FLOPS/W noise")
    ap.add_argument("--lookalikes", type=int, default=20, help="seeds per look-alike (0: none)")
    ap.add_argument("--no-load", action="store_true", help="ticks without their power: the unconditioned rule")
    ap.add_argument("--no-sub", action="store_true",
                    help="ticks without their 100 ms profiles: the hold timed to the tick end, as before")
    ap.add_argument("--power-noise", default="0.003,0.03",
                    help="per-tick noise of the power reading (fractions); the look-alike families run at each, "
                         "the rest at the first")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a DriftParams field (repeatable), e.g. --set confidence_z=3")
    a = ap.parse_args()
    power_noise = [float(x) for x in a.power_noise.split(",")]
    overrides: dict[str, Any] = {}
    for kv in a.set:
        name, _, raw = kv.partition("=")
        overrides[name] = type(getattr(DriftParams(), name))(raw)
    params = DriftParams(**overrides)
    t0 = time.perf_counter()
    results: list[dict[str, Any]] = []
    all_cases = cases(a.per_kind, a.seed)
    with Pool(a.workers) as pool:
        for grid_ms in (int(x) for x in a.grids_ms.split(",")):
            grid_ns = grid_ms * 1_000_000
            for noise in (float(x) for x in a.noise.split(",")):
                sub = 1 if a.no_sub else grid_ns // 100_000_000  # frames carry 100 ms profiles above a 100 ms grid
                jobs = [(grid_ns, noise, c, c[3] + c[4] + 10, overrides, not a.no_load, power_noise[0], sub)
                        for c in all_cases]
                res = {"grid_ms": grid_ms, "noise": noise, **summarise(pool.map(run_case, jobs, chunksize=16))}
                for pn in power_noise if a.lookalikes else ():
                    look = [(grid_ns, noise, c, series_s(c), overrides, not a.no_load, pn, 1)
                            for c in lookalike_cases(a.lookalikes, a.seed)]
                    res.setdefault("lookalikes", {})[f"{pn:g}"] = summarise_lookalikes(
                        pool.map(run_case, look, chunksize=4), grid_ns)
                results.append(res)
            hours = a.noise_hours * grid_ns / S
            for noise in (float(x) for x in a.noise_only.split(",")):
                quiet: list[Case] = [("noise", "", 0.0, 0.0, 0.0, a.seed * 100_003 + i) for i in range(a.noise_gpus)]
                qrows = pool.map(run_case, [(grid_ns, noise, c, hours * 3600, overrides, not a.no_load, power_noise[0],
                                             1 if a.no_sub else grid_ns // 100_000_000)
                                            for c in quiet], chunksize=4)
                alarms = sum(r["firings"] for r in qrows)
                gpu_days = a.noise_gpus * hours / 24
                results.append({"grid_ms": grid_ms, "noise": noise, "noise_only": {
                    "gpu_days": round(gpu_days, 2), "alarms": alarms, "per_gpu_day": round(alarms / gpu_days, 4),
                    "ticks": sum(r["ticks"] for r in qrows)}})
    sim = None if a.no_sim_noise else sim_noise()
    elapsed = time.perf_counter() - t0
    for res in results:
        if "noise_only" in res:
            r = res["noise_only"]
            print(f"grid {res['grid_ms']} ms, noise only, sigma {res['noise']:g}: {r['alarms']} alarms in "
                  f"{r['gpu_days']} GPU-days ({r['ticks']} ticks) = {r['per_gpu_day']}/GPU-day")
            continue
        print(f"\ngrid {res['grid_ms']} ms, noise {res['noise']:g} per tick")
        print(f"{'depth':>6} {'n':>4} {'recall':>7} {'rec>=4s':>8} {'<=3.5s':>7} {'p50 s':>6} {'p95 s':>6} "
              f"{'early':>5}")
        for depth, r in res["drops"].items():
            print(f"{depth:>6} {r['n']:>4} {r['recall']:>7} {r['recall_len_ge_4s']:>8} {r['within_3.5s']:>7} "
                  f"{r['delay_p50_s']!s:>6} {r['delay_p95_s']!s:>6} {r['early_firings']:>5}")
        print("dips (20-60% deep), false alarms: "
              + "  ".join(f"{k}: {v['false_alarm_rate']}" for k, v in res["dips"].items()))
        print("shallow drops (10-60 s), false alarms: "
              + "  ".join(f"{k}: {v['false_alarm_rate']}" for k, v in res["shallow"].items()))
        for pn, lk in res.get("lookalikes", {}).items():
            print(f"-- power reading noise {pn} per tick --")
            print(f"look-alikes (load alone moves): {lk['firings']} firings in {lk['gpu_days']} GPU-days = "
                  f"{lk['per_gpu_day']}/GPU-day; with firings: "
                  + ("  ".join(f"{k}: {v['firings']}" for k, v in lk["kinds"].items() if v["firings"]) or "none"))
            m = lk["moved"]
            print(f"drops at a steady load after a load step: recall {m['recall']} of {m['n']}, "
                  f"p50 {m['delay_p50_s']} s, p95 {m['delay_p95_s']} s, early {m['early_firings']}")
            print(f"drifts at steady SM activity {', '.join(f'{x:g}' for x in STEADY_LOADS)} (4-30 s long), "
                  "recall / p50 / p95 delay s:")
            print("  " + "  ".join(f"{k}: {v['recall']} / {v['delay_p50_s']} / {v['delay_p95_s']}"
                                   for k, v in lk["steady"].items()))
    if sim is not None:
        print(f"\nsimulator FLOPS/W per-tick noise (robust sigma): {sim}")
    p = params
    print(json.dumps({"bench": "drift", "date": time.strftime("%Y-%m-%d"), "elapsed_s": round(elapsed, 1),
                      "params": {"drop": p.drop, "floor": p.floor, "hold_s": p.hold_ns / S,
                                 "baseline_s": p.baseline_ns / S, "confidence_z": p.confidence_z, "edge_z": p.edge_z,
                                 "max_tolerance_s": p.max_tolerance_ns / S, "max_gap_s": p.max_gap_ns / S,
                                 "load_band": p.load_band, "load_move": p.load_move, "loaded": not a.no_load},
                      "sim_noise": sim, "results": results}))


if __name__ == "__main__":
    main()
