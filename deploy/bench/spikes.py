"""L1 spike engine: capture rate of 200 ms load spikes vs a 60 s average, and its throughput.

    python deploy/bench/spikes.py [--gpus 64] [--minutes 60] [--seed 1] [--background 40,85]
                                  [--messages second|mixed]

Synthetic gpu_util at 10 Hz per GPU (random phase, +-5 ms jitter). Each 60 s block has a
background level uniform in ``--background`` (default [40, 85]%) with 2% gaussian noise, and one spike at a random
instant in [2, 58) s: every sample within 200 ms from it is uniform in [96, 100]%
(a 200 ms spike holds 2 samples, 1-3 with jitter). The engine is fed the way the
pipeline feeds it: one call per GPU per second of samples, then ``tick_peak`` of that
1 s tick; with ``--messages mixed`` (the default) 5% of the messages carry a 3-10 s backlog
instead (a live producer after a hiccup), so the engine's small- and large-call paths
interleave on one series, and each tick is read once its samples are in.

Captured by:
- the engine: ``spike_flags(tick_peak, 95)`` on a tick from the one holding the spike's
  first sample to the one after its last (the only ticks with a window covering it);
- a 60 s average, strict: the trailing 60 s mean at some tick end within 60 s after
  the spike is above 95%;
- a 60 s average, loose: the spike's aligned minute has a mean above its (known)
  background level by 3 standard errors, i.e. the spike is visible in the average at all.
Engine false flags: flagged ticks among those no spike can reach.

Throughput: add + tick_peak over the same arrays and call pattern as ``np.sum`` of each
call's values (the baseline, timed in the same run), and add alone with 10 s per call.
Prints a table and one JSON line.

    python deploy/bench/spikes.py --pipeline [--gpus 64] [--minutes 10] [--compare OLD.py ...]

``--pipeline`` times the enricher's real call pattern instead: gpu_util and sm_active per
GPU, one ``add`` per 10 s message (100 samples), then the ticks that close (up to 2 s
behind the newest message) read in order per series with ``tick_peak`` + ``release``, and
``evict_before`` per batch. ``--compare`` runs other implementations of ``streams/detect/spikes.py``
(e.g. ``git show HEAD:streams/detect/spikes.py > /tmp/old.py``) on the same feed in the same run,
checks their peaks are bit-identical and reports samples/s of each.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from streams.detect.spike_rule import SPIKE_THRESHOLDS, SpikeParams, spike_flags
from streams.detect.spikes import SpikeEngine

S = 1_000_000_000
MS = 1_000_000
LIMIT = SPIKE_THRESHOLDS["gpu_util"]


Load = tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], list[int], list[float]]  # ts, values, spikes, levels


def gpu_load(rng: np.random.Generator, minutes: int, background: tuple[float, float]) -> Load:
    n = minutes * 600
    ts = np.arange(n, dtype=np.int64) * 100 * MS + int(rng.integers(0, 100 * MS)) + rng.integers(-5 * MS, 5 * MS, n)
    ts.sort()
    backgrounds = rng.uniform(*background, minutes)
    vs = np.repeat(backgrounds, 600) + rng.normal(0.0, 2.0, n)
    spikes = []
    for m in range(minutes):
        at = int((m * 60 + rng.uniform(2, 58)) * S)
        hit = (ts >= at) & (ts < at + 200 * MS)
        vs[hit] = rng.uniform(96, 100, int(hit.sum()))
        spikes.append(at)
    return ts, np.clip(vs, 0.0, 100.0), spikes, backgrounds.tolist()


def load_engine(path: str) -> Any:
    """The ``SpikeEngine`` class of a copy of streams/detect/spikes.py at ``path``."""
    spec = importlib.util.spec_from_file_location(f"spikes_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod.SpikeEngine


def pipeline(engine_cls: Any, loads: list[tuple[Load, Load]], seconds: int, message_s: int = 10,
             lag_s: int = 2) -> tuple[float, list[float | None]]:
    """Seconds the enricher's call pattern takes, and the peaks read (in call order)."""
    eng = engine_cls(SpikeParams(), S)
    cuts = [[np.searchsorted(ld[0], np.arange(0, seconds + message_s, message_s, dtype=np.int64) * S)
             for ld in pair] for pair in loads]
    names = ("gpu_util", "sm_active")
    gpus = [str(g) for g in range(len(loads))]
    peaks: list[float | None] = []
    closed = 0  # ticks below this are read
    t0 = time.perf_counter()
    for m in range(0, seconds // message_s):
        for g, pair in enumerate(loads):
            for k, (ts, vs, _, _) in enumerate(pair):
                lo, hi = cuts[g][k][m], cuts[g][k][m + 1]
                eng.add("n", gpus[g], names[k], ts[lo:hi], vs[lo:hi])
        upto = (m + 1) * message_s - lag_s if m + 1 < seconds // message_s else seconds
        for tick in range(closed, upto):
            for name in names:  # the enricher: per sensor, per frame of the batch
                for gpu in gpus:
                    p = eng.tick_peak("n", gpu, name, tick * S)
                    peaks.append(p)
                    if p is not None:
                        eng.release("n", gpu, name, tick * S)
        closed = max(closed, upto)
        eng.evict_before(closed * S - 5 * S)
    return time.perf_counter() - t0, peaks


def run_pipeline(a: argparse.Namespace, rng: np.random.Generator, bg: tuple[float, float]) -> None:
    loads = [(gpu_load(rng, a.minutes, bg), gpu_load(rng, a.minutes, bg)) for _ in range(a.gpus)]
    for pair in loads:  # sm_active is a fraction
        pair[1][1][:] /= 100.0
    seconds = a.minutes * 60
    n_samples = sum(int(ld[0].size) for pair in loads for ld in pair)
    impls = [("current", str(Path(__file__).resolve().parents[2] / "streams" / "spikes.py")), *(
        (f"compare:{c}", c) for c in a.compare)]
    out: dict[str, Any] = {}
    ref: list[float | None] | None = None
    for label, path in impls:
        cls = SpikeEngine if label == "current" else load_engine(path)
        best = float("inf")
        for _ in range(a.repeat):
            took, peaks = pipeline(cls, loads, seconds)
            best = min(best, took)
        if ref is None:
            ref = peaks
        identical = peaks == ref and all(
            (x is None) == (y is None) and (x is None or y is None or
                                            np.float64(x).tobytes() == np.float64(y).tobytes())
            for x, y in zip(peaks, ref, strict=True))
        out[label] = {"samples_per_s": round(n_samples / best), "seconds": round(best, 4),
                      "peaks_identical_to_current": identical}
        print(f"{label:<40} {n_samples / best:>14,.0f} samples/s  {best:.3f} s  identical={identical}")
    print(json.dumps({"bench": "spikes_pipeline", "date": time.strftime("%Y-%m-%d"), "samples": n_samples,
                      "gpus": a.gpus, "minutes": a.minutes, "ticks_read": len(ref or []), **out}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--minutes", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--background", default="40,85", help="range of the per-minute background level, %%")
    ap.add_argument("--pipeline", action="store_true", help="time the enricher's call pattern (see above)")
    ap.add_argument("--messages", choices=("second", "mixed"), default="mixed",
                    help="one message per GPU and second, or mixed with 3-10 s backlogs (both add paths)")
    ap.add_argument("--compare", nargs="*", default=[], help="with --pipeline: other spikes.py files to time")
    ap.add_argument("--repeat", type=int, default=3, help="with --pipeline: best of this many runs")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    bg = tuple(float(x) for x in a.background.split(","))
    assert len(bg) == 2, "--background LO,HI"
    if a.pipeline:
        run_pipeline(a, rng, (bg[0], bg[1]))
        return
    loads = [gpu_load(rng, a.minutes, (bg[0], bg[1])) for _ in range(a.gpus)]
    seconds = a.minutes * 60
    # Per GPU, per second: the slice of its samples (the pipeline's call pattern).
    cuts = [np.searchsorted(ts, np.arange(seconds + 1, dtype=np.int64) * S) for ts, _, _, _ in loads]
    n_samples = sum(int(c[-1] - c[0]) for c in cuts)

    eng = SpikeEngine(SpikeParams(), S)
    peaks = np.full((a.gpus, seconds), np.nan)
    # Per GPU, the seconds each message ends at: one a second, or (mixed) now and then a backlog of 3-10 s
    # in one message, as a live producer sends after a hiccup (the engine's two add paths interleave).
    msg_rng = np.random.default_rng(a.seed + 1)
    msg_ends = [[seconds] * seconds for _ in range(a.gpus)]
    for g in range(a.gpus):
        out, sec = [], 0
        while sec < seconds:
            sec = min(seconds, sec + (int(msg_rng.integers(3, 11)) if a.messages == "mixed"
                                      and msg_rng.random() < 0.05 else 1))
            out.append(sec)
        msg_ends[g] = out
    pos = [0] * a.gpus  # next message of each GPU
    read = [0] * a.gpus  # next tick to read of each GPU
    t0 = time.perf_counter()
    for sec in range(seconds):
        for g, (ts, vs, _, _) in enumerate(loads):
            while pos[g] < len(msg_ends[g]) and msg_ends[g][pos[g]] <= sec + 1:
                lo = cuts[g][msg_ends[g][pos[g] - 1] if pos[g] else 0]
                hi = cuts[g][msg_ends[g][pos[g]]]
                eng.add("n", str(g), "gpu_util", ts[lo:hi], vs[lo:hi])
                pos[g] += 1
            while pos[g] and read[g] < msg_ends[g][pos[g] - 1]:  # the ticks whose samples are in, in order
                p = eng.tick_peak("n", str(g), "gpu_util", read[g] * S)
                peaks[g, read[g]] = np.nan if p is None else p
                read[g] += 1
        eng.evict_before(sec * S - 20 * S)
    engine_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    total = 0.0
    for sec in range(seconds):
        for g, (_, vs, _, _) in enumerate(loads):
            total += float(np.sum(vs[cuts[g][sec]:cuts[g][sec + 1]]))
    numpy_s = time.perf_counter() - t0
    bulk = SpikeEngine(SpikeParams(), S)
    t0 = time.perf_counter()
    for sec in range(0, seconds, 10):
        for g, (ts, vs, _, _) in enumerate(loads):
            lo, hi = cuts[g][sec], cuts[g][min(sec + 10, seconds)]
            bulk.add("n", str(g), "gpu_util", ts[lo:hi], vs[lo:hi])
    bulk_s = time.perf_counter() - t0

    flagged = np.vectorize(lambda p: spike_flags(None if np.isnan(p) else float(p), LIMIT))(peaks)
    engine_hits = strict_hits = loose_hits = n_spikes = one_sample = one_sample_hits = 0
    reachable = np.zeros_like(flagged)
    for g, (ts, vs, spikes, backgrounds) in enumerate(loads):
        csum = np.concatenate(([0.0], np.cumsum(vs)))
        ends = cuts[g]  # index of the first sample of each second
        for m, at in enumerate(spikes):
            n_spikes += 1
            i, j = int(np.searchsorted(ts, at)), int(np.searchsorted(ts, at + 200 * MS))
            first, last = int(ts[i] // S), int(ts[j - 1] // S)
            near = [t for t in range(first, last + 2) if t < seconds]
            reachable[g, near] = True
            hit = bool(flagged[g, near].any())
            engine_hits += hit
            one_sample += j - i == 1
            one_sample_hits += hit and j - i == 1
            trailing = []
            for end_s in range(first + 1, min(first + 61, seconds) + 1):
                lo, hi = ends[max(end_s - 60, 0)], ends[end_s]
                trailing.append((csum[hi] - csum[lo]) / max(hi - lo, 1))
            strict_hits += bool(max(trailing) > LIMIT)
            lo, hi = ends[m * 60], ends[min((m + 1) * 60, seconds)]
            minute = vs[lo:hi]
            loose_hits += bool(minute.mean() > backgrounds[m] + 3 * 2.0 / np.sqrt(minute.size))
    quiet = ~reachable
    res: dict[str, Any] = {
        "spikes": n_spikes, "samples": n_samples, "background_pct": list(bg),
        "capture": {"engine": round(engine_hits / n_spikes, 4), "mean60_strict": round(strict_hits / n_spikes, 4),
                    "mean60_loose": round(loose_hits / n_spikes, 4)},
        "engine_capture_2plus_samples": round((engine_hits - one_sample_hits) / max(n_spikes - one_sample, 1), 4),
        "spikes_with_one_sample": one_sample, "one_sample_captured": one_sample_hits,
        "engine_false_flag_per_tick": round(float(flagged[quiet].mean()), 5),
        "throughput": {"engine_samples_per_s": round(n_samples / engine_s),
                       "numpy_sum_samples_per_s": round(n_samples / numpy_s),
                       "ratio_engine_to_numpy_sum": round(numpy_s / engine_s, 3),
                       "engine_add_only_10s_calls_samples_per_s": round(n_samples / bulk_s),
                       "calls": a.gpus * seconds, "samples_per_call": round(n_samples / (a.gpus * seconds), 1)},
    }
    c, th = res["capture"], res["throughput"]
    print(f"{n_spikes} spikes of 200 ms > 95% in {a.gpus} GPUs x {a.minutes} min of 10 Hz gpu_util"
          f" (background {bg[0]:g}-{bg[1]:g}%)")
    print(f"{'detector':<38} {'capture':>8}")
    print(f"{'engine P99, 100 ms buckets, 1 s window':<38} {c['engine']:>8.2%}")
    print(f"{'60 s mean > 95% (strict)':<38} {c['mean60_strict']:>8.2%}")
    print(f"{'60 s mean > background + 3 s.e.':<38} {c['mean60_loose']:>8.2%}")
    print(f"engine on spikes that hold >= 2 samples: {res['engine_capture_2plus_samples']:.2%}; "
          f"{one_sample} spikes caught only 1 sample (jitter), {one_sample_hits} of them captured")
    print(f"engine false flags: {res['engine_false_flag_per_tick']:.3%} of spike-free ticks")
    print(f"engine add+tick_peak: {th['engine_samples_per_s']:,} samples/s ({th['samples_per_call']} per call); "
          f"np.sum per call: {th['numpy_sum_samples_per_s']:,}/s; ratio {th['ratio_engine_to_numpy_sum']}; "
          f"add only, 10 s per call: {th['engine_add_only_10s_calls_samples_per_s']:,}/s")
    print(json.dumps({"bench": "spikes", "date": time.strftime("%Y-%m-%d"), "checksum": round(total, 1), **res}))


if __name__ == "__main__":
    main()
