"""flopwatch's own Prometheus figures, served by the worker at ``/metrics`` (``agents.web``).

The ingest and the detection and decision agents keep running totals (``IngestStats``,
``DetectStats``, ``DecisionTally``); ``observe_ingest``, ``observe_detect`` and
``observe_decisions`` turn them into counter increments by remembering what they saw last. A
total that went down (a fresh stats object after a restart of the ingest) counts as a reset,
as Prometheus' ``rate()`` treats one: its new value is the increase. Counters therefore never go back.

Each ``Metrics`` owns its ``CollectorRegistry`` rather than using the process-wide default,
so tests (and a demo next to a worker) can build several without name clashes.

Labels stay low in cardinality: reject reasons are the stable list of ``schemas.codec``,
rules and actions are a handful, and a gate is the name of a gate, never a workload.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from schemas.records import RejectReason

if TYPE_CHECKING:  # types only: importing the agents would pull River and Kafka into every user of this module
    from agents.detect.agent import DetectStats
    from agents.ingest.stats import IngestStats
    from schemas.alerts import Alert
    from streams.decide.engine import DecisionTally

__all__ = ["DELAY_BUCKETS_S", "OUTCOMES", "AlertDelays", "Metrics"]

OUTCOMES = ("taken", "withheld")
NO_GATE = "none"  # the gate label of a decision no gate held: an empty label would read as no label at all
# From sub-second spikes through the 3 s drift hold to the 30-90 s windows of the scale rules.
DELAY_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 90.0, 120.0, 300.0)


class _Totals:
    """Running totals seen last, per key; ``delta`` is how much a counter must grow."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def delta(self, key: str, total: int) -> int:
        last = self._last.get(key, 0)
        self._last[key] = total
        return total - last if total >= last else total  # went down: a reset, the new total is the increase


class Metrics:
    """The worker's figures in their own registry; ``render`` gives the text exposition."""

    def __init__(self, process: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        if process:  # CPU, memory, open files of this process (Linux /proc); free to read
            ProcessCollector(registry=r)
        self.samples = Counter("flopwatch_samples_total", "Sensor samples read from Kafka.", registry=r)
        self.frames_written = Counter("flopwatch_frames_written_total",
                                      "Frame rows (one GPU or host per grid tick) written to ClickHouse.",
                                      registry=r)
        self.rejects = Counter("flopwatch_rejects_total", "Input records sent to the dead-letter topic, by reason.",
                               ["reason"], registry=r)
        for reason in RejectReason:  # at 0 from the start, so increase() sees the first reject of each kind
            self.rejects.labels(reason.value)
        self.consumer_lag = Gauge("flopwatch_consumer_lag",
                                  "Records behind the end of the partitions the ingest owns; NaN until known.",
                                  registry=r)
        self.consumer_lag.set(math.nan)  # 0 would claim the worker has caught up before it knows
        # What the ingest holds in memory between flushes: with the lag, what an operator sizes memory by.
        self.open_cells = Gauge("flopwatch_open_cells",
                                "Frames (one GPU or host per tick) with samples waiting for their node's watermark.",
                                registry=r)
        self.nodes_held = Gauge("flopwatch_nodes_held",
                                "Nodes the aligners hold state for; those quiet for FLOPWATCH_NODE_FORGET_S are "
                                "forgotten.", registry=r)
        self.paced = Gauge("flopwatch_paced_partitions",
                           "Sensor topic-partitions left unread for now: read ahead of their partition's slowest "
                           "while its open cells fill (a backlog read in step).", registry=r)
        self.held = Gauge("flopwatch_held_messages",
                          "Clock-domain sample messages waiting for their clock's beacon.", registry=r)
        self.detect_frames = Counter("flopwatch_detect_frames_total",
                                     "Frames messages the detection agent evaluated.", registry=r)
        self.detect_rejects = Counter("flopwatch_detect_rejects_total",
                                      "Frames messages the detection agent dead-lettered (undecodable or a "
                                      "detector failure).", registry=r)
        self.alerts_firing = Gauge("flopwatch_alerts_firing", "Alerts firing now.", registry=r)
        self.alerts_sent = Counter("flopwatch_alerts_sent_total", "Alert messages sent, by rule.", ["rule"],
                                   registry=r)
        self.decisions = Counter("flopwatch_decisions_total",
                                 "Scale decisions, by action, outcome (taken or withheld) and the gate that "
                                 "withheld it (\"none\" when taken).", ["action", "outcome", "gate"], registry=r)
        self.delay = Histogram("flopwatch_detector_delay_seconds",
                               "Event-time delay from a rule's onset to its alert or trigger.", ["kind"],
                               buckets=DELAY_BUCKETS_S, registry=r)
        self._ingest = _Totals()
        self._detect = _Totals()
        self._decide = _Totals()

    # -- running totals ------------------------------------------------------------------
    def observe_ingest(self, stats: IngestStats) -> None:
        """Take the ingest's totals (called after each flush)."""
        self.samples.inc(self._ingest.delta("samples", stats.samples))
        self.frames_written.inc(self._ingest.delta("frames_written", stats.frames_written))
        _by_label(self.rejects, self._ingest, "reject:", stats.rejects)
        if stats.lag is not None:
            self.consumer_lag.set(stats.lag)
        self.open_cells.set(stats.open_cells)
        self.nodes_held.set(stats.nodes_held)
        self.held.set(stats.held)
        self.paced.set(stats.paced)

    def observe_detect(self, stats: DetectStats) -> None:
        """Take the detection agent's totals."""
        self.detect_frames.inc(self._detect.delta("frames", stats.frames))
        self.detect_rejects.inc(self._detect.delta("rejects", stats.rejects + stats.errors))
        self.alerts_firing.set(stats.firing)
        _by_label(self.alerts_sent, self._detect, "rule:", stats.alerts.by_rule)

    def observe_decisions(self, tally: DecisionTally) -> None:
        """Take the decision agent's totals: per action, outcome (``taken`` or ``withheld``) and the gate that
        withheld it."""
        for (action, outcome, gate), total in tally.by_kind.items():
            if outcome not in OUTCOMES:
                raise ValueError(f"decision outcome {outcome!r}: expected one of {', '.join(OUTCOMES)}")
            if not action:
                raise ValueError("decision action must not be empty")
            step = self._decide.delta(f"{action}\0{outcome}\0{gate}", total)
            if step:
                self.decisions.labels(action=action, outcome=outcome, gate=gate or NO_GATE).inc(step)

    # -- events --------------------------------------------------------------------------

    def observe_delay(self, kind: str, seconds: float) -> None:
        """How long (event time) from a rule's onset to its alert or trigger, e.g. ``kind="alert"``."""
        if not kind:
            raise ValueError("delay kind must not be empty")
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"delay {seconds!r} s for {kind!r}: must be finite and >= 0")
        self.delay.labels(kind=kind).observe(seconds)

    # -- exposition ----------------------------------------------------------------------
    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition and its content type."""
        return generate_latest(_WithoutCreated(self.registry)), CONTENT_TYPE_LATEST


class AlertDelays:
    """An alert sink (``agents.detect.agent.AlertSink``) that records, per firing alert, the event time from its
    onset to the alert as ``flopwatch_detector_delay_seconds{kind="alert"}``. The detection agent drops
    alerts it had already sent before a restart ahead of its sinks, so a replay is not counted twice."""

    def __init__(self, metrics: Metrics, kind: str = "alert") -> None:
        self.metrics, self.kind = metrics, kind

    async def send(self, alerts: Sequence[Alert]) -> None:
        for a in alerts:
            if a.state == "firing":  # a resolve's delay is the episode's length, not the detector's
                # ts >= onset is the alert contract; max() keeps a sink from ever raising (it would be retried).
                self.metrics.observe_delay(self.kind, max(0, a.ts_ns - a.onset_ts_ns) / 1e9)


class _WithoutCreated(Collector):
    """The registry without its ``*_created`` samples: the text format has no place for a counter's start
    time, so the client writes it as one more gauge series per counter, which Prometheus would store."""

    _TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        for family in self._registry.collect():  # fresh objects on every collect: safe to trim
            if family.type in self._TYPES:
                family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


def _by_label(counter: Counter, totals: _Totals, prefix: str, by: Mapping[str, int]) -> None:
    for label, total in by.items():
        step = totals.delta(prefix + label, total)
        if step:
            counter.labels(label).inc(step)
