"""The detection agent: ``flopwatch.frames`` -> ``streams.detect.detectors`` -> ``flopwatch.alerts`` + ``detections``.

How it steps around Faust's known traps:

- ``concurrency=1`` (faust-streaming#606: with more, a commit can pass a message still in
  flight). Parallelism comes from partitions: more workers in the group, each with its
  own partitions of the node-keyed frames topic.
- No tables at all: changelog recovery can hang (#651, #597, #596, #432), tables cannot be
  written inside ``take()`` (#497) and windowed tables expire on wall time (#250). The
  detectors are plain objects, one ``streams.detect.detectors.Detectors`` per partition, and when
  a partition's first message arrives after an assignment, its state is rebuilt by
  replaying that partition's frames of the last ``replay_s`` seconds (event time: frames
  carry their tick as the Kafka timestamp) up to that message, with the alerts those
  replayed frames cause dropped: they were sent before the crash, since Faust flushes its
  producer before it commits an offset.
- No exactly-once mode (#323, #502). Every alert has a deterministic id, and a rebuild
  also reads which alert messages the alerts topic already holds (the last ten minutes),
  so the frames re-processed after a crash do not send them again. What is left is a
  crash between an alert's send and its acknowledgement; a consumer that acts once per
  ``message_id`` is safe even then, and ``detections`` (ReplacingMergeTree on id, state)
  keeps one row per message.
- Bytes in, our own decoding: a frame that does not decode goes to the dead-letter topic
  and the agent goes on (Faust's own decode path acks and then crashes the agent, #175).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import faust
import orjson

from agents.runtime.backoff import with_backoff
from agents.runtime.give_way import AgentQueues
from agents.runtime.partition_agent import FrameHistory, Rejects, declare
from agents.runtime.partition_runtime import OutputSink, PartitionCounters, PartitionRuntime
from agents.runtime.timebase import SYSTEM_CLOCK, Clock
from schemas.alerts import Alert, alert_key, decode_alert, encode_alert
from schemas.frame_messages import FrameDecodeError, FrameMessage, decode_frame_message
from schemas.records import Reject, RejectReason
from schemas.workload_samples import WorkloadSample, encode_workload_sample
from streams.attribution.context import EventBook
from streams.detect.detectors import AlertTally, Detectors, DetectParams
from streams.detect.workload_tap import WorkloadTap

log = logging.getLogger(__name__)


class AlertSink(Protocol):
    async def send(self, alerts: Sequence[Alert]) -> None: ...


class SummarySink(Protocol):
    """Where each frame's per-workload summaries go (``flopwatch.workloads``, keyed by workload)."""

    async def send(self, samples: Sequence[WorkloadSample], timestamp_ms: int) -> None: ...


@dataclass(slots=True)
class DetectStats(PartitionCounters):
    frames: int = 0
    firing: int = 0
    alerts: AlertTally = field(default_factory=AlertTally)  # those sent: the replayed and suppressed are not


# What the detectors import when first used (River's drift detectors, scipy for the leak rules and
# attribution): ~0.8 s that the settings no longer pay, so every CLI command starts fast.
_NUMERIC = ("river.drift", "scipy.stats", "scipy.special")


class DetectRuntime(PartitionRuntime[Detectors, FrameMessage, Alert]):
    """Per-partition detectors, rebuilt on first use after an assignment; shared by the agent and tests."""

    engine_noun = "detector"
    state_noun = "detector"
    input_noun = "frames"
    output_noun = "alert"
    log_each_error = False
    stats: DetectStats

    def __init__(self, params: DetectParams, grid_ns: int, history: FrameHistory, sinks: Sequence[AlertSink],
                 rejects: Rejects | None, topic: str, replay_s: float = 180.0,
                 summaries: SummarySink | None = None,
                 link_bytes_s: Callable[[str], float | None] = lambda _model: None,
                 clock: Clock = SYSTEM_CLOCK, events: EventBook | None = None) -> None:
        super().__init__(history, sinks, rejects, topic, replay_s, clock)
        for module in _NUMERIC:  # at start, not at the first frame or the first alert, which would wait for them
            importlib.import_module(module)
        self.params = params
        self.grid_ns = grid_ns
        self.stats = DetectStats()
        self.summaries = summaries
        self.link_bytes_s = link_bytes_s
        self.events = events if events is not None else EventBook()  # Kubernetes events, for attribution
        self._taps: dict[int, WorkloadTap] = {}
        self.on_frame: Callable[[FrameMessage], None] | None = None  # sees each live frame (the demo's view)

    def _forget(self, partition: int, state: Detectors | None) -> None:
        self._taps.pop(partition, None)

    def _decode(self, value: bytes) -> FrameMessage | Reject:
        try:
            msg = decode_frame_message(value)
        except FrameDecodeError as exc:
            known = exc.reason in {r.value for r in RejectReason}
            return Reject(RejectReason(exc.reason) if known else RejectReason.WRONG_TYPE, f"frames message: {exc}")
        if self.on_frame is not None:
            self.on_frame(msg)
        return msg

    def _fresh(self, partition: int) -> Detectors:
        return Detectors(self.params, self.grid_ns, self.events)

    def _apply(self, state: Detectors, msg: FrameMessage) -> list[Alert]:
        return state.on_message(msg)

    def _sent_id(self, out: Alert) -> str:
        return out.message_id

    def _as_sent(self, state: Detectors, out: Alert, raw: bytes) -> Alert:
        # An attribution made again after a restart may see fewer Kubernetes events than the first did:
        # what consumers got is the topic's copy, so the table and the episode's later messages carry it.
        try:
            sent = decode_alert(raw)  # its message_id is out's: the rebuild keyed the topic's messages by it
        except ValueError:
            return out
        state.adopt(sent)
        return sent

    def _processed(self, msg: FrameMessage) -> None:
        self.stats.frames += 1

    def _count(self, fresh: Sequence[Alert]) -> None:
        self.stats.alerts.count(fresh)

    async def _after(self, partition: int, state: Detectors, msg: FrameMessage) -> None:
        self.stats.firing = sum(d.firing_count for d in self._by_partition.values())  # per frame: no lists
        if self.summaries is not None:
            await self._summarise(partition, state, msg)

    def _gave_up(self, sink: OutputSink[Alert], batch: Sequence[Alert]) -> None:
        log.error("alert sink %s gave up on %d alerts: %s", type(sink).__name__, len(batch),
                  ", ".join(a.message_id for a in batch))

    def _start_replay(self, partition: int) -> None:
        self._taps[partition] = WorkloadTap(self.params.spike_thresholds, self.link_bytes_s)

    def _replay_one(self, partition: int, state: Detectors, raw: bytes, sent: dict[str, bytes]) -> None:
        msg = decode_frame_message(raw)
        for a in state.on_message(msg):  # alerts dropped: sent before the crash
            if a.causes and a.message_id in sent:
                self._as_sent(state, a, sent[a.message_id])
        self._taps[partition].summarise(msg, state.drifting(msg.node))  # the tap only learns who held what

    def _tap(self, partition: int) -> WorkloadTap:
        tap = self._taps.get(partition)
        if tap is None:
            tap = self._taps[partition] = WorkloadTap(self.params.spike_thresholds, self.link_bytes_s)
        return tap

    async def _summarise(self, partition: int, det: Detectors, msg: FrameMessage) -> None:
        assert self.summaries is not None
        try:
            samples = self._tap(partition).summarise(msg, det.drifting(msg.node))
        except Exception as exc:  # the frame was detected on; a summary bug must not stop the agent
            self.stats.errors += 1
            log.error("workload summary failed for %s@%d", msg.node, msg.tick_ns, exc_info=exc)
            return
        if samples:
            sink = self.summaries
            ok, _ = await with_backoff("workload summaries", lambda: sink.send(samples, msg.tick_ns // 1_000_000),
                                       self._error)
            if not ok:
                log.error("gave up on %d workload summaries of %s@%d", len(samples), msg.node, msg.tick_ns)


class KafkaSummarySink:
    """Sends workload summaries to ``flopwatch.workloads`` keyed by workload, the tick as the Kafka timestamp."""

    def __init__(self, topic: Any) -> None:
        self.topic = topic

    async def send(self, samples: Sequence[WorkloadSample], timestamp_ms: int) -> None:
        for s in samples:
            await self.topic.send(key=s.key, value=encode_workload_sample(s), timestamp=timestamp_ms / 1000)


class KafkaAlertSink:
    """Sends alerts to ``flopwatch.alerts`` through the Faust app's producer, keyed by alert id."""

    once_per_id = True  # the runtime leaves out messages the topic already holds

    def __init__(self, topic: Any) -> None:
        self.topic = topic

    async def send(self, alerts: Sequence[Alert]) -> None:
        for a in alerts:
            await self.topic.send(key=alert_key(a), value=encode_alert(a))


def detection_columns(alerts: Sequence[Alert]) -> dict[str, list[Any]]:
    return {
        "ts": [a.ts_ns // 1_000_000 for a in alerts], "onset_ts": [a.onset_ts_ns // 1_000_000 for a in alerts],
        "id": [a.id for a in alerts], "state": [a.state for a in alerts], "rule": [a.rule for a in alerts],
        "severity": [a.severity for a in alerts], "node": [a.node for a in alerts], "gpu": [a.gpu for a in alerts],
        "workload": [a.workload or "" for a in alerts], "namespace": [a.namespace or "" for a in alerts],
        "value": [a.value for a in alerts], "threshold": [a.threshold for a in alerts],
        "baseline": [a.baseline for a in alerts],
        "evidence": [orjson.dumps(dict(a.evidence), option=orjson.OPT_SORT_KEYS).decode() for a in alerts],
        "causes": [orjson.dumps([c.as_dict() for c in a.causes], option=orjson.OPT_SORT_KEYS).decode() for a in alerts]}


def install(app: faust.App, runtime: DetectRuntime, frames_topic: Any, queues: AgentQueues | None = None) -> Any:
    """Declare the agent on ``app``; returns it (tests drive it with ``agent.test_context()``)."""
    return declare(app, frames_topic, "flopwatch.detect", runtime.handle, runtime.topic, runtime.revoke, queues)

