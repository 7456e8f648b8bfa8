"""Buffers frames and events as columns and writes them to ClickHouse; recovers progress after a crash."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from agents.sinks.clickhouse import Backend, Columns
from agents.sinks.rollup_repair import RollupRepair
from schemas import ddl
from schemas.catalog import CATALOG, LABEL_COLUMNS
from schemas.frames import DERIVED_COLUMNS, NOTE_COLUMN
from schemas.records import K8sEvent
from schemas.resolution import at_resolution
from streams.align.aligner import FrameBatch, Recovered

TopicPartition = tuple[str, int]
_COUNTERS = [(s.index, s.name, s.column("last")) for s in CATALOG if s.kind == "counter"]


@dataclass(frozen=True, slots=True)
class Progress:
    """What ClickHouse says was already done, read when partitions are assigned."""

    recovered: Recovered
    consumed: dict[TopicPartition, int] = field(default_factory=dict)  # next offset read before the crash
    events_done: dict[TopicPartition, int] = field(default_factory=dict)  # highest event offset stored
    pods: list[K8sEvent] = field(default_factory=list)  # each pod's latest PodLabels / PodDeleted record


@dataclass(slots=True)
class Pending:
    """Rows taken from the buffers, on their way to ClickHouse."""

    batches: list[FrameBatch]
    events: Columns

    @property
    def rows(self) -> int:
        return sum(len(b) for b in self.batches) + len(self.events.get("ts", ()))


class FrameStore:
    """Column buffers for ``gpu_frames`` and ``k8s_events``; ``flush`` writes them and the progress marks."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._batches: list[FrameBatch] = []
        self._frame_rows = 0
        self._events: Columns = {c: [] for c in ddl.EVENT_COLUMNS}
        self.frames_written = 0
        self.events_written = 0
        self._closed_written: dict[str, int] = {}  # node -> newest final tick (ns) recorded
        self._consumed: dict[TopicPartition, int] = {}  # next offset per partition at the last write
        self.rollups = RollupRepair(backend)

    @property
    def pending_rows(self) -> int:
        return self._frame_rows + len(self._events["ts"])

    def add_frames(self, batch: FrameBatch) -> None:
        if len(batch):
            self._batches.append(batch)
            self._frame_rows += len(batch)

    def add_event(self, ev: K8sEvent, topic: str, partition: int, offset: int) -> None:
        row = (ev.ts_ns, ev.node, ev.type, ev.reason, ev.kind, ev.namespace, ev.pod, ev.workload, list(ev.gpus),
               ev.message, topic, partition, offset)
        for col, v in zip(self._events.values(), row, strict=True):
            col.append(v)

    def detach(self) -> Pending:
        """Hand over what is buffered (cheap; the main loop goes on filling new buffers)."""
        pending = Pending(self._batches, self._events)
        self._batches, self._frame_rows = [], 0
        self._events = {c: [] for c in ddl.EVENT_COLUMNS}
        return pending

    def flush(self, consumed: dict[TopicPartition, int], now_ms: int) -> int:
        return self.write(self.detach(), consumed, now_ms)

    def write(self, pending: Pending, consumed: dict[TopicPartition, int], now_ms: int,
              closed: dict[str, int] | None = None, done: set[str] | None = None) -> int:
        """Write ``pending``; ``consumed`` (next offset read per partition) is recorded first.

        Progress goes before frames on purpose: after a crash between the two, the
        replay knows those offsets were read and re-adds their samples to cells
        past the last written tick, which is exact; the other order would dead-letter
        samples that are already in frames.
        """
        # Nothing here changes this store's state until every insert went through: a write that failed
        # half-way (ClickHouse gone) is retried with the same ``done``, which skips the inserts that went
        # through, and the same token, which makes the server drop a block whose reply was lost
        # (agents.ingest.worker retries it; the legacy layout has no tokens).
        done = set() if done is None else done
        if consumed and "progress" not in done:
            tps = sorted(consumed)
            self.backend.insert("ingest_progress", {
                "topic": [t for t, _ in tps], "partition": [p for _, p in tps],
                "offset": [consumed[tp] for tp in tps], "written_at": [now_ms] * len(tps)})
            done.add("progress")
        ranges = {tp: (self._consumed.get(tp, off), off) for tp, off in consumed.items()}
        frames = _frame_columns(pending.batches) if pending.batches else None
        # The same rows from the same offsets get the same token, in this process's retries or in a replay
        # after a crash between the insert and the commit: the server drops the block, rollups included.
        token = batch_token(ranges, frames)
        n_frames = len(frames["node"]) if frames is not None else 0
        if frames is not None and "frames" not in done:
            if self.rollups.suspect:  # before this node's new frames: its rollups are this worker's alone now
                self.rollups.repair(frames["node"])
            self.backend.insert("gpu_frames", frames, token=token)
            done.add("frames")
        n_events = len(pending.events["ts"])
        if n_events and "events" not in done:
            self.backend.insert("k8s_events", pending.events, token=token + "e")
            done.add("events")
        # After the frames: a closed tick recorded ahead of its frames would make a replay
        # drop samples that were never written.
        moved = {n: t for n, t in (closed or {}).items() if t > self._closed_written.get(n, t - 1)}
        if moved:
            nodes = sorted(moved)
            self.backend.insert("node_progress", {
                "node": nodes, "closed_tick_ms": [moved[n] // 1_000_000 for n in nodes],
                "written_at": [now_ms] * len(nodes)})
        self._consumed.update(consumed)
        self._closed_written.update(moved)
        if closed is not None and len(self._closed_written) > len(closed):
            # Nodes the aligners forgot (or whose partitions went): bounded by the nodes present. One that comes
            # back has its closed tick recorded again, which is harmless (readers take the max).
            self._closed_written = {n: t for n, t in self._closed_written.items() if n in closed}
        self.frames_written += n_frames
        self.events_written += n_events
        written = n_frames + n_events
        return written

    def recover(self) -> Progress:
        db = self.backend.database
        cur = self.backend.layout == "current"
        ts_ms = "toUnixTimestamp64Milli(max(ts))" if cur else "max(ts)"
        _, rows = self.backend.rows(f"SELECT node, {ts_ms} FROM {db}.gpu_frames GROUP BY node")
        boundaries = {str(node): int(ms) * 1_000_000 for node, ms in rows}
        self.rollups.scan(max((int(ms) for _, ms in rows), default=0) // 1000)
        _, rows = self.backend.rows(f"SELECT node, max(closed_tick_ms) FROM {db}.node_progress GROUP BY node")
        for node, ms in rows:  # empty ticks closed after the newest written one are final too
            boundaries[str(node)] = max(boundaries.get(str(node), 0), int(ms) * 1_000_000)
        last = ", ".join(f"argMax({col}, ts)" for _, _, col in _COUNTERS)
        _, rows = self.backend.rows(f"SELECT node, gpu, {last} FROM {db}.gpu_frames GROUP BY node, gpu")
        counters: dict[tuple[str, str, int], float] = {}
        for node, gpu, *vals in rows:
            for (si, _, _), v in zip(_COUNTERS, vals, strict=True):
                if v is not None:
                    counters[(str(node), str(gpu), si)] = float(v)
        _, rows = self.backend.rows(f"SELECT topic, partition, max(offset) FROM {db}.ingest_progress "
                                    "GROUP BY topic, partition")
        consumed = {(str(t), int(p)): int(o) for t, p, o in rows}
        _, rows = self.backend.rows(f"SELECT kafka_topic, kafka_partition, max(kafka_offset) FROM {db}.k8s_events "
                                    "GROUP BY kafka_topic, kafka_partition")
        events_done = {(str(t), int(p)): int(o) for t, p, o in rows}
        # The Kubernetes collector says a pod's labels only when they change: a restarted worker
        # relearns them from what it stored, or long-lived pods would lose their workload.
        _, rows = self.backend.rows(
            f"SELECT node, namespace, pod, argMax(reason, ts), argMax(workload, ts), argMax(gpus, ts), "
            f"argMax(message, ts) FROM {db}.k8s_events WHERE reason IN ('PodLabels', 'PodDeleted') "
            "GROUP BY node, namespace, pod")
        pods = [K8sEvent(str(n), 0, "Normal", str(r), "Pod", str(ns), str(pod), str(wl), tuple(map(str, g)), str(m))
                for n, ns, pod, r, wl, g, m in rows if r == "PodLabels"]
        return Progress(Recovered(boundaries, counters), consumed, events_done, pods)


def batch_token(ranges: Mapping[TopicPartition, tuple[int, int]], frames: Columns | None) -> str:
    """A write's ``insert_deduplication_token``: the offset range per partition it covers and the identity
    (node, gpu, tick) of every row, hashed. Different rows never share a token; the same rows do.

    >>> cols = {"ts": np.array([1000, 2000]), "node": ["n", "n"], "gpu": ["0", "0"]}
    >>> a = batch_token({("sensors.power", 0): (10, 20)}, cols)
    >>> a == batch_token({("sensors.power", 0): (10, 20)}, dict(cols)), a == batch_token({}, cols), len(a)
    (True, False, 32)
    """
    h = hashlib.blake2b(digest_size=16)
    for (topic, part), (lo, hi) in sorted(ranges.items()):
        h.update(f"{topic}:{part}:{lo}-{hi};".encode())
    if frames is not None:
        h.update(np.ascontiguousarray(frames["ts"], dtype=np.int64).tobytes())
        h.update("\x00".join(frames["node"]).encode())
        h.update(b"\x01" + "\x00".join(frames["gpu"]).encode())
    return h.hexdigest()


def _frame_columns(batches: list[FrameBatch]) -> Columns:
    cols: Columns = {"ts": np.concatenate([b.tick_ns for b in batches]) // 1_000_000,
                     "node": [n for b in batches for n in b.node], "gpu": [g for b in batches for g in b.gpu]}
    labels = [lab for b in batches for lab in b.labels]
    for key, col in LABEL_COLUMNS.items():
        default = None if col in ddl.INT_LABEL_COLS else ""
        cols[col] = [lab.get(key, default) for lab in labels]
    # Each value at its column's resolution: what makes a stored value cost ~2 bytes, not ~7.
    for c in ddl.VALUE_COLS:
        cols[c] = at_resolution(c, np.concatenate([b.values[c] for b in batches]))
    for c in ddl.COUNT_COLS:
        cols[c] = np.concatenate([b.counts[c] for b in batches])
    cols["clock_uncertainty_us"] = np.concatenate([b.clock_uncertainty_ns for b in batches]) / 1000.0
    for name in DERIVED_COLUMNS:
        derived = np.concatenate([b.derived.get(name, np.full(len(b), np.nan)) for b in batches])
        # idle is Nullable(UInt8): 0/1, None where it could not be told.
        cols[name] = ([None if v != v else int(v) for v in derived.tolist()] if name == "idle"
                      else at_resolution(name, derived))
    cols[NOTE_COLUMN] = [note for b in batches for note in (b.notes or [""] * len(b))]
    return cols
