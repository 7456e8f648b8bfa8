"""The outside peer of ``deploy/bench/quix_peer.py``: a Quix Streams application that only decodes, validates
and sums samples into 1 s cells in its RocksDB state, over the same topics flopwatch reads.

Runs in its own environment (``.venv-quix``, Quix Streams 3.28: a benchmark-only dependency, kept out of
flopwatch's). Arguments: bootstrap, consumer group, state directory, the number of samples to read, then
the topics. Prints one JSON line: samples, messages, rejected messages and the seconds from its first
message to its last sample.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

from quixstreams import Application
from quixstreams.state import State

_S = 1_000_000_000


def valid(m: Any) -> bool:
    """What flopwatch's decoder checks first: version, names, equal-length lists of int times and finite numbers."""
    if not isinstance(m, dict) or m.get("v") != 1:
        return False
    ts, values = m.get("ts_ns"), m.get("value")
    return (isinstance(m.get("node"), str) and isinstance(m.get("gpu"), str) and isinstance(ts, list)
            and isinstance(values, list) and 0 < len(ts) == len(values)
            and all(type(t) is int for t in ts)
            and all(type(x) in (int, float) and math.isfinite(x) for x in values))


def main() -> None:
    bootstrap, group, state_dir, total = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    topics = sys.argv[5:]
    app = Application(broker_address=bootstrap, consumer_group=group, auto_offset_reset="earliest",
                      state_dir=state_dir, use_changelog_topics=False, loglevel="WARNING")
    seen = {"samples": 0, "messages": 0, "rejected": 0, "first": 0.0, "last": 0.0}

    def count(m: Any) -> bool:
        if not seen["first"]:
            seen["first"] = time.perf_counter()
        seen["messages"] += 1
        ok = valid(m)
        if not ok:
            seen["rejected"] += 1
        return ok

    def add(m: dict[str, Any], state: State) -> None:
        # Summed per cell within the message first, then one state read and write per cell (a 100-sample
        # message at 10 Hz spans ~10 cells): the peer's best, not a state operation per sample.
        gpu = m["gpu"]
        cells: dict[int, float] = {}
        for t, x in zip(m["ts_ns"], m["value"], strict=True):
            cell = t // _S
            cells[cell] = cells.get(cell, 0.0) + x
        for cell, cell_sum in cells.items():
            key = f"{gpu}:{cell}"
            state.set(key, state.get(key, 0.0) + cell_sum)
        seen["samples"] += len(m["value"])
        if seen["samples"] >= total:
            seen["last"] = time.perf_counter()
            app.stop()

    for name in topics:
        sdf = app.dataframe(app.topic(name, value_deserializer="json"))
        sdf = sdf.filter(count).update(add, stateful=True)
    app.run()
    print(json.dumps({"samples": seen["samples"], "messages": seen["messages"], "rejected": seen["rejected"],
                      "seconds": seen["last"] - seen["first"]}))


if __name__ == "__main__":
    main()
