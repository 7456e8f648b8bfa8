"""Node churn: what an advance costs after many nodes came and went, with and without forgetting them.

    python deploy/bench/churn.py [--nodes 1000] [--live 8] [--stay-s 30] [--gpus 8]

An autoscaled cluster replaces its nodes: here ``--live`` nodes are present at any moment, each
sends ``--gpus`` GPUs x the 23 streams at 1 Hz for ``--stay-s`` seconds and is never seen again,
until ``--nodes`` have passed through. The aligner advances once a second of event time, live
(the quiet clocks run). Times the advances of the last tenth of the run, and the nodes and series
the aligner holds at its end, for the default worker (a node quiet for ``forget_s`` is forgotten,
``streams.align.forget``; scaled down from an hour to ``--forget-s``) against the same aligner
that never forgets. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from schemas.catalog import CATALOG
from streams.align.aligner import AlignParams, GridAligner

S = 1_000_000_000
T0 = 1_796_200_000 * S


def run(params: AlignParams, nodes: int, live: int, stay_s: int, gpus: int) -> dict[str, float]:
    a = GridAligner(params)
    a.expect([s.index for s in CATALOG])
    every = stay_s / live  # a new node every this many seconds
    seconds = int(nodes * every) + stay_s
    timed, frames, t_tail = 0.0, 0, seconds - seconds // 10
    for sec in range(seconds):
        first, last = max(0, int((sec - stay_s) / every) + 1), min(nodes - 1, int(sec / every))
        ts = np.array([T0 + sec * S + 1000], np.int64)
        for n in range(first, last + 1):
            for g in range(gpus):
                for s in CATALOG:
                    a.add(f"node-{n:05d}", str(g), s.index, ts, np.array([min(s.hi, 100.0)]), source=s.index,
                          position=sec)
        t = time.perf_counter()
        adv = a.advance(T0 + sec * S + 2 * S)
        if sec >= t_tail:
            timed += time.perf_counter() - t
        frames += len(adv.frames)
    frames += len(a.flush_all().frames)
    return {"advance_ms": round(timed / (seconds - t_tail) * 1000, 3), "nodes_held": a.nodes_held(),
            "series_held": a.series_held(), "frames": frames}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--live", type=int, default=8)
    ap.add_argument("--stay-s", type=int, default=30)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--forget-s", type=int, default=60)
    args = ap.parse_args()
    base = AlignParams()
    forget = AlignParams(forget_ns=args.forget_s * S)
    never = AlignParams(forget_ns=10**18, remember_ns=10**18)
    assert base.forget_ns == 3600 * S  # the default this scales down
    got = {name: run(p, args.nodes, args.live, args.stay_s, args.gpus) for name, p in (("forgets", forget),
                                                                                       ("never", never))}
    assert got["forgets"]["frames"] == got["never"]["frames"]
    print(json.dumps({"nodes": args.nodes, "live": args.live, "stay_s": args.stay_s, "gpus": args.gpus,
                      "forget_s": args.forget_s, **{f"{k}_{m}": v for m, r in got.items() for k, v in r.items()},
                      "never_over_forgets": round(got["never"]["advance_ms"] / got["forgets"]["advance_ms"], 2)}))


if __name__ == "__main__":
    main()
