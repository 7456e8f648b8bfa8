"""Child process of test_chdb_merge_kill: ``fill PATH DB`` writes frames into an embedded chDB in many parts, starts
``OPTIMIZE ... FINAL`` and prints MERGING once the merge writes its new part, then waits to be killed;
``check PATH DB`` opens the database again and prints what it holds as JSON."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from agents.ingest.simulated import ingest_simulation
from agents.settings import load_settings
from agents.sinks.clickhouse import open_backend
from agents.sinks.schema import ensure_for
from streams.sim.simulate import SimParams

S = 1_000_000_000


def fill(path: str, db: str, copies: int) -> None:
    settings = load_settings({}, clickhouse_backend="chdb", chdb_path=path, clickhouse_database=db)
    b = open_backend(settings)
    ensure_for(b, settings)
    ingest_simulation(b, SimParams(nodes=8, gpus=8, seed=4, start_ns=1_790_000_000 * S), 300)
    _, names = b.rows(f"SELECT name FROM system.columns WHERE database = '{db}' AND table = 'gpu_frames' "
                      "AND name != 'ts' ORDER BY position")
    cols = ", ".join(str(n) for n, in names)
    for k in range(1, copies + 1):  # one part per insert: the 300 s block again, k x 300 s later
        b.execute(f"INSERT INTO {db}.gpu_frames (ts, {cols}) SELECT ts + toIntervalSecond({k * 300}), {cols} "
                  f"FROM {db}.gpu_frames WHERE ts < (SELECT min(ts) FROM {db}.gpu_frames) + toIntervalSecond(300)")
    _, rows = b.rows(f"SELECT count() FROM {db}.gpu_frames")
    _, parts = b.rows(f"SELECT count(), uniqExact(partition) FROM system.parts WHERE database = '{db}' "
                      "AND table = 'gpu_frames' AND active")
    print(json.dumps({"rows": int(rows[0][0]), "parts": int(parts[0][0]), "partitions": int(parts[0][1])}),
          flush=True)
    threading.Thread(target=b.execute, args=(f"OPTIMIZE TABLE {db}.gpu_frames FINAL",), daemon=True).start()
    # The connection is busy with the merge, so it is watched on disk: a merge writes its part into a
    # tmp_merge_ directory and renames it when done.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if any(Path(path).rglob("tmp_merge_*")):
            print("MERGING", flush=True)
            break
        time.sleep(0.005)
    time.sleep(600)  # killed here, mid-merge


def check(path: str, db: str) -> None:
    settings = load_settings({}, clickhouse_backend="chdb", chdb_path=path, clickhouse_database=db)
    b = open_backend(settings)
    ensure_for(b, settings)
    _, rows = b.rows(f"SELECT count(), uniqExact(ts, node, gpu) FROM {db}.gpu_frames")
    _, parts = b.rows(f"SELECT count() FROM system.parts WHERE database = '{db}' AND table = 'gpu_frames' AND active")
    print(json.dumps({"rows": int(rows[0][0]), "distinct": int(rows[0][1]), "parts": int(parts[0][0])}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "fill":
        fill(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        check(sys.argv[2], sys.argv[3])
