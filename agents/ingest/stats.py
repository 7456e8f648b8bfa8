"""The ingest's running totals: what the progress line, ``/metrics`` and the benchmarks read."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

from schemas.counters import Counters


@dataclass(slots=True)
class IngestStats(Counters):
    """Running totals, for progress display and the benchmark."""

    messages: int = 0
    samples: int = 0
    frames_written: int = 0
    frames_published: int = 0  # messages (one per node and tick) acknowledged on flopwatch.frames
    events_written: int = 0
    beacons: int = 0
    replayed_dropped: int = 0
    commits_refused: int = 0  # commits Kafka turned down because the group had rebalanced
    commits_failed: int = 0  # commits that timed out (Kafka unreachable); a later flush commits again
    internal_errors: int = 0  # records that tripped a bug of ours (dead-lettered as internal_error)
    frames_past_retention: int = 0  # frames written older than the table's retention: the server drops them
    rejects: Counter[str] = field(default_factory=Counter)
    lag: int | None = None  # records behind the end of the assigned partitions; None: not known yet
    flushes: int = 0
    open_cells: int = 0
    nodes_held: int = 0  # nodes the aligners hold now (those quiet for node_forget_s are forgotten)
    held: int = 0  # clock-domain sample messages waiting for a beacon
    paced: int = 0  # sensor partitions left unread now because they are ahead of their partition's slowest
    paces: int = 0  # times a sensor partition was left unread so (streams.align.pacing)
    late: Counter[str] = field(default_factory=Counter)  # late samples by "node/sensor"
    first_record_ns: int = 0  # monotonic; for throughput figures
    first_record_cpu_s: float = 0.0  # the process's CPU time then (every thread's); for throughput figures
    detect: dict[str, Any] = field(default_factory=dict)  # the detection agent's figures, when one runs beside

    unreported: ClassVar[frozenset[str]] = frozenset({"first_record_ns", "first_record_cpu_s", "detect"})

    def as_dict(self) -> dict[str, Any]:
        out = Counters.as_dict(self)  # not super(): a slotted dataclass is a new class, its cell the old one
        if self.detect:
            out["detect"] = dict(self.detect)
        return out
