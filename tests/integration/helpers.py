"""Running the real worker process and reading what it wrote."""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import orjson
from confluent_kafka import Consumer, TopicPartition

from agents.collect.simulator import SimulatorPublisher
from agents.kafka.topics import Topics, confluent_config
from agents.settings import Settings, settings_env
from agents.sinks.clickhouse import open_backend
from schemas import ddl
from schemas.resolution import stored_as
from streams.sim.simulate import ClusterSimulator, SimParams
from tests.oracle import Rows, oracle, series_of


def worker_cmd(*extra: str) -> list[str]:
    """The worker command; the plain runtime (ingest alone) unless ``extra`` names another."""
    runtime = [] if "--runtime" in extra or "--exit-when-idle" in extra else ["--runtime", "plain"]
    return [sys.executable, "-m", "agents.cli.main", "worker", "--progress", "json", *runtime, *extra]


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
            row[c] = int(row[c])
        out[(str(node), str(gpu), int(ms) * 1_000_000)] = row
    return out, len(rows)


def sample_total(rows: Rows, count_column: str) -> int:
    """Samples counted in ``count_column`` over all frames (count cells always hold ints)."""
    return sum(cast(int, r[count_column]) for r in rows.values())


def assert_frames_equal(got: Rows, want: Rows) -> None:
    missing, extra = want.keys() - got.keys(), got.keys() - want.keys()
    assert not missing and not extra, f"{len(missing)} frames missing (e.g. {sorted(missing)[:3]}), " \
                                      f"{len(extra)} unexpected (e.g. {sorted(extra)[:3]})"
    bad = []
    for key, row in want.items():
        for col, v in row.items():
            g = got[key][col]
            # ClickHouse keeps each value at its column's resolution (schemas.resolution).
            ok = (g is None) if v is None else (g is not None and stored_as(col, float(g), float(v)))  # type: ignore[arg-type]
            if not ok:
                bad.append((key, col, v, g))
    assert not bad, f"{len(bad)} cells differ, e.g. {bad[:5]}"


class Worker:
    """A ``flopwatch worker`` subprocess; one thread reads its stderr, so it never blocks on a full pipe."""

    def __init__(self, settings: Settings, *extra: str) -> None:
        self.proc = subprocess.Popen(worker_cmd(*extra), env=worker_env(settings), stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True)
        self._lines: queue.Queue[str] = queue.Queue()
        self.tail: collections.deque[str] = collections.deque(maxlen=200)
        self.last: dict[str, Any] = {}
        self.assignments: list[float] = []  # monotonic times of its "assigned partitions" lines, as read
        stream = self.proc.stderr
        assert stream is not None

        def pump() -> None:
            for ln in stream:
                self._lines.put(ln)

        threading.Thread(target=pump, daemon=True).start()

    def _take(self, line: str) -> bool:
        """Note a line; whether it was a stats line."""
        self.tail.append(line)
        if "assigned partitions [" in line:
            self.assignments.append(time.monotonic())
        start = line.find('{"event":"flush"')
        if start >= 0:
            self.last = orjson.loads(line[start:].strip())
        return start >= 0

    def drain(self) -> dict[str, Any]:
        """Read what the worker has printed so far, without waiting; its latest stats."""
        while not self._lines.empty():
            self._take(self._lines.get())
        return self.last

    def wait_for(self, done: Callable[[dict[str, Any]], bool], timeout_s: float = 120.0) -> dict[str, Any]:
        """Read stats lines until one satisfies ``done``; fail after ``timeout_s`` with the worker's log."""
        self._wait(lambda line, stats: stats and done(self.last), "the expected stats", timeout_s)
        return self.last

    def wait_for_log(self, text: str, timeout_s: float = 120.0) -> None:
        """Read until a log line contains ``text``."""
        self._wait(lambda line, stats: text in line, f"a log line with {text!r}", timeout_s)

    def _wait(self, done: Callable[[str, bool], bool], what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None and self._lines.empty():
                    break
                continue
            if done(line, self._take(line)):
                return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)  # the worker prints where its coroutines wait
            time.sleep(1.0)
        self.drain()
        raise AssertionError(f"worker did not show {what} in {timeout_s:.0f} s (exit code "
                             f"{self.proc.poll()}); last stats {self.last}\nits last log lines:\n{''.join(self.tail)}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM and wait; the exit code. A worker that does not stop is killed, never left behind."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        finally:
            self.proc.kill()


def assert_rollups_match_frames(settings: Settings) -> None:
    """Each rollup holds every stored frame exactly once: per GPU its frames and cost sum to the raw table's (a
    replayed block counted twice in a rollup shows here even where gpu_frames collapsed it)."""
    from schemas.rollups import ROLLUPS

    backend = open_backend(settings)
    try:
        if backend.layout != "current":
            return  # the legacy layout has no rollups
        db = backend.database
        _, raw = backend.rows(f"SELECT node, gpu, count(), round(sum(ifNull(cost_usd, 0)), 9) FROM {db}.gpu_frames "
                              "GROUP BY node, gpu ORDER BY node, gpu")
        for r in ROLLUPS:
            _, rolled = backend.rows(f"SELECT node, gpu, sum(frames), round(sum(cost_usd_sum), 9) FROM {db}.{r.table} "
                                     "GROUP BY node, gpu ORDER BY node, gpu")
            assert rolled == raw, (r.table, rolled[:4], raw[:4])
    finally:
        backend.close()


@contextlib.contextmanager
def live_run(settings: Settings, params: SimParams, seconds: float,
             batch_size: int = 100) -> Iterator[tuple[SimulatorPublisher, Worker, threading.Thread]]:
    """A worker, and the simulator publishing ``params`` live for ``seconds`` (recorded) once the worker has
    its partitions; both stopped at the end, whatever happened. Yields the publisher, the worker and the
    publishing thread (join it before comparing with ``pub.sent``)."""
    pub = SimulatorPublisher(settings, params, batch_size=batch_size, record=True)
    worker = Worker(settings)
    stop = threading.Event()
    producing = threading.Thread(target=pub.live, args=(seconds, stop))
    try:
        worker.wait_for_log("assigned partitions [")
        producing.start()
        yield pub, worker, producing
    finally:
        stop.set()
        if producing.is_alive():
            producing.join(60)
        worker.stop()


def dead_letter_summary(settings: Settings, idle_s: float = 1.0) -> dict[str, int]:
    """Records on the dead-letter topic as ``"reason topic key"`` -> samples (a partly refused batch counts its
    refused samples): what a failed exactness check should say, since a sample lost to a frame is either there or
    a bug."""
    topic = Topics(settings.topic_prefix).dlq
    c = Consumer(confluent_config(settings) | {"group.id": f"dlq-{time.time_ns()}", "auto.offset.reset": "earliest",
                                               "enable.auto.commit": False, "isolation.level": "read_committed"})
    out: collections.Counter[str] = collections.Counter()
    try:
        meta = c.list_topics(topic, timeout=10)
        c.assign([TopicPartition(topic, p, 0) for p in meta.topics[topic].partitions])
        last = time.monotonic()
        while time.monotonic() - last < idle_s:
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            last = time.monotonic()
            h = {k: bytes(v).decode(errors="replace") for k, v in cast(list[tuple[str, bytes]], m.headers() or [])}
            key = (m.key() or b"?").decode(errors="replace")
            why = h.get("flopwatch.detail", "").partition(": ")[2][:40]  # a late sample's cause: disorder, idle, cap
            out[f"{h.get('flopwatch.reason')} {h.get('flopwatch.topic')} {key} {why}".rstrip()] += \
                int(h.get("flopwatch.rejected", 1))
    finally:
        c.close()
    return dict(out)
