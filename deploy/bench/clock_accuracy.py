"""Residual alignment error after clock correction, and the share of samples put in the
wrong grid cell, beside the same figures without correction and with a naive
correction (the latest beacon's midpoint, no filtering), in the same run.

    python deploy/bench/clock_accuracy.py [--domains 8] [--seconds 600]

Pure computation over simulated clock domains (offsets -2..+2 s, drift up to 100 ppm,
beacons every second with round trips 20 us..2 ms, one reset per domain); no services.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from streams.align.clock import BeaconNoise, ClockEstimator, ClockParams, DomainClock

S = 1_000_000_000
T0 = 1_796_200_000 * S


def run(domains: int, seconds: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    noise = BeaconNoise()
    truth_all: list[np.ndarray] = []
    fitted: list[np.ndarray] = []
    naive: list[np.ndarray] = []
    raw: list[np.ndarray] = []
    for _ in range(domains):
        reset = T0 + rng.randrange(seconds // 4, 3 * seconds // 4) * S
        truth = DomainClock(rng.randint(-2 * S, 2 * S), rng.uniform(-100, 100), T0, (reset,))
        est = ClockEstimator(ClockParams())
        for sec in range(seconds):
            b = noise.beacon(rng, "n", "d", truth, T0 + sec * S + rng.randrange(S))
            est.add(b)
            fit = est.fit
            assert fit is not None
            naive_offset = (b.utc_before_ns + b.utc_after_ns) // 2 - b.domain_ns
            # 100 samples a second at random instants (real samples do not sit on grid boundaries)
            utc = T0 + sec * S + np.sort(np.array([rng.randrange(S) for _ in range(100)], dtype=np.int64))
            dom = np.array([truth.to_domain(int(u)) for u in utc], dtype=np.int64)
            ok = np.array([truth.epoch(int(u)) == fit.epoch for u in utc])
            if sec < 10 or not ok.any():
                continue  # before the first fits, or across a reset: such samples are held, not placed
            utc, dom = utc[ok], dom[ok]
            truth_all.append(utc)
            fitted.append(dom + fit.base_ns + np.round(fit.offset_ns + fit.drift * (dom - fit.ref_ns)).astype(np.int64))
            naive.append(dom + naive_offset)
            raw.append(dom)
    true = np.concatenate(truth_all)
    out: dict[str, object] = {"samples": len(true)}
    for name, est_utc in (("corrected", np.concatenate(fitted)), ("naive_last_beacon", np.concatenate(naive)),
                          ("uncorrected", np.concatenate(raw))):
        err = np.abs(est_utc - true)
        out[name] = {
            "residual_p50_us": round(float(np.percentile(err, 50)) / 1e3, 2),
            "residual_p99_us": round(float(np.percentile(err, 99)) / 1e3, 2),
            "wrong_cell_share_100ms": float(np.mean(est_utc // (S // 10) != true // (S // 10))),
            "wrong_cell_share_1s": float(np.mean(est_utc // S != true // S)),
        }
    # Cost of applying a fit, vectorized as the aligner would: ns per sample.
    assert fit is not None  # the last domain's fit
    dom = np.arange(2_000_000, dtype=np.int64) * 1_000_000
    t = time.perf_counter()
    for _ in range(5):
        dom + fit.base_ns + np.round(fit.offset_ns + fit.drift * (dom - fit.ref_ns)).astype(np.int64)
    out["correction_ns_per_sample"] = round((time.perf_counter() - t) / 5 / len(dom) * 1e9, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domains", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print(json.dumps(run(args.domains, args.seconds, args.seed), indent=2))


if __name__ == "__main__":
    main()
