"""Running the real worker process and reading what it wrote."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

from agents.clickhouse import open_backend
from agents.settings import Settings, settings_env
from schemas import ddl
from streams.simulate import ClusterSimulator, SimParams
from tests.oracle import Rows, oracle, series_of


def worker_cmd(*extra: str) -> list[str]:
    return [sys.executable, "-m", "agents.cli", "worker", "--progress", "json", *extra]


def worker_env(settings: Settings) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("FLOPWATCH_")}, **settings_env(settings)}


def run_worker_until_idle(settings: Settings, idle_s: float = 2.0, timeout_s: float = 180.0) -> dict[str, Any]:
    """Run ``flopwatch worker`` until it has written everything; return its last stats line."""
    proc = subprocess.run(worker_cmd("--exit-when-idle", str(idle_s)), env=worker_env(settings),
                          capture_output=True, text=True, timeout=timeout_s)  # run() kills it on timeout
    assert proc.returncode == 0, proc.stderr[-4000:]
    return last_stats(proc.stderr)


def last_stats(stderr: str) -> dict[str, Any]:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("{")]
    assert lines, stderr[-4000:]
    out: dict[str, Any] = orjson.loads(lines[-1])
    return out


def expected_frames(params: SimParams, duration_s: float) -> Rows:
    sim = ClusterSimulator(params)
    return oracle(series_of(sim.advance(params.start_ns + int(duration_s * 1e9))))


def stored_frames(settings: Settings) -> tuple[Rows, int]:
    """Rows of gpu_frames keyed like the oracle, and the raw row count (duplicates show there)."""
    backend = open_backend(settings)
    try:
        ts = "toUnixTimestamp64Milli(ts)" if backend.layout == "current" else "ts"
        cols = [*ddl.VALUE_COLS, *ddl.COUNT_COLS]
        _, rows = backend.rows(f"SELECT {ts}, node, gpu, {', '.join(cols)} FROM {backend.database}.gpu_frames")
    finally:
        backend.close()
    out: Rows = {}
    for ms, node, gpu, *vals in rows:
        row = dict(zip(cols, vals, strict=True))
        for c in ddl.COUNT_COLS:
            row[c] = int(row[c])  # type: ignore[call-overload]
        out[(str(node), str(gpu), int(ms) * 1_000_000)] = row
    return out, len(rows)


def assert_frames_equal(got: Rows, want: Rows) -> None:
    missing, extra = want.keys() - got.keys(), got.keys() - want.keys()
    assert not missing and not extra, f"{len(missing)} frames missing (e.g. {sorted(missing)[:3]}), " \
                                      f"{len(extra)} unexpected (e.g. {sorted(extra)[:3]})"
    bad = []
    for key, row in want.items():
        for col, v in row.items():
            g = got[key][col]
            ok = (g is None) if v is None else (g is not None and abs(float(g) - float(v)) <= 1e-9 * max(1.0, abs(float(v))))  # type: ignore[arg-type]
            if not ok:
                bad.append((key, col, v, g))
    assert not bad, f"{len(bad)} cells differ, e.g. {bad[:5]}"


def wait_for_stats(proc: subprocess.Popen[str], done: Callable[[dict[str, Any]], bool],
                   timeout_s: float = 120.0) -> dict[str, Any]:
    """Read a worker's stderr until a stats line satisfies ``done``; fail after ``timeout_s``."""
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    stream = proc.stderr
    threading.Thread(target=lambda: [lines.put(ln) for ln in stream], daemon=True).start()
    deadline = time.monotonic() + timeout_s
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        start = line.find('{"event":"flush"')
        if start >= 0:
            seen = orjson.loads(line[start:].strip())
            if done(seen):
                return seen
    raise AssertionError(f"worker did not reach the expected state in {timeout_s:.0f} s; last stats {seen}")
