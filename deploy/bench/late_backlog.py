"""A backlog of old data in one poll: what the aligner's verdict on late samples costs.

    python deploy/bench/late_backlog.py [--messages 20000] [--samples 100] [--rounds 3]

A collector that was cut off for an hour and comes back sends its buffer, all of it for cells
the worker closed long ago: one poll can hold ``max_poll_records`` (20,000) such messages. The
aligner queues them and ``advance`` reports each message's late samples (which the ingest then
dead-letters). This times that ``advance`` for a poll of ``--messages`` messages of
``--samples`` samples on one GPU's 23 streams, against the same poll on time (every sample in
an open cell), in the same run; rounds alternate the two. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from schemas.catalog import CATALOG
from streams.align.aligner import AlignParams, GridAligner

S = 1_000_000_000
T0 = 1_796_200_000 * S


def one_poll(messages: int, samples: int, late: bool) -> float:
    """Seconds of the ``advance`` that takes a poll of old (``late``) or current messages."""
    a = GridAligner(AlignParams())
    span = messages * samples // len(CATALOG) * S // 10  # 10 Hz per stream
    now = T0 + span + 3600 * S
    for s in CATALOG:  # the worker has closed everything up to an hour ago
        a.add("node-00", "0", s.index, [now - 10 * S], [1.0], source=s.index)
    a.advance(now)
    base = T0 if late else now - 5 * S
    for k in range(messages):
        s = CATALOG[k % len(CATALOG)]
        start = base + (k // len(CATALOG)) * samples * S // 10
        ts = np.arange(start, start + samples * S // 10, S // 10, dtype=np.int64)
        a.add("node-00", "0", s.index, ts, np.full(samples, 1.0), source=s.index, position=k)
    t = time.perf_counter()
    adv = a.advance(now)
    took = time.perf_counter() - t
    assert late == (sum(len(x.indices) for x in adv.late) == messages * samples)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    on_time, late = [], []
    for _ in range(args.rounds):
        on_time.append(one_poll(args.messages, args.samples, False))
        late.append(one_poll(args.messages, args.samples, True))
    print(json.dumps({"messages": args.messages, "samples_per_message": args.samples,
                      "on_time_s": round(statistics.median(on_time), 4), "late_s": round(statistics.median(late), 4),
                      "late_over_on_time": round(statistics.median(x / y for x, y in zip(late, on_time,
                                                                                           strict=True)), 2),
                      "rounds": args.rounds}))


if __name__ == "__main__":
    main()
