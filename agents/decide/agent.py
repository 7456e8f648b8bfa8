"""The decision agent: ``flopwatch.workloads`` -> ``streams.decide.engine`` -> ``flopwatch.triggers`` + ClickHouse.

Frames are keyed by node, but a workload spans nodes: the detection agent publishes each
frame's per-workload summaries to ``flopwatch.workloads`` keyed by ``"<namespace>/<workload>"``
(a repartition through a topic keyed by workload), and this agent consumes that topic,
so every summary of one workload reaches one ``Decider``, in the topic's order.

It steps around Faust's traps as the detection agent does (see ``agents.detect.agent``):
``concurrency=1``, no tables, no exactly-once mode. Its state survives a crash and a
rebalance because it is rebuilt: on the first message of a partition after an
assignment, the partition's summaries of the last ``replay_s`` seconds of event time
(summaries carry their tick as the Kafka timestamp) are replayed into a fresh
``Decider`` (with no wall-clock age check: that is for live data), and the decisions
they cause are dropped.

Exactly one trigger per decision, as consumers see it: a trigger's id and
idempotency key are functions of the summary sequence, so a decision re-made after a
crash is the same message. A rebuild reads which trigger ids the triggers topic already
holds and does not send them again; what remains is a crash between a trigger's send
and its acknowledgement, which a consumer that acts once per ``idempotency_key`` absorbs
(``flopwatch act`` does). ``scale_decisions`` (ReplacingMergeTree on id, outcome) keeps
one row per decision.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import faust
import orjson

from agents.decide.scale_view import Desired, ScaleView
from agents.runtime.backoff import with_backoff
from agents.runtime.partition_agent import FrameHistory, Rejects, dead_letter, declare, read_history
from schemas.records import Reject, RejectReason
from schemas.triggers import encode_trigger
from schemas.workload_samples import WorkloadSampleDecodeError, decode_workload_sample
from streams.decide.engine import Decider
from streams.decide.params import DecideParams
from streams.decide.rules import Decision, WorkloadRules

log = logging.getLogger(__name__)


class DecisionSink(Protocol):
    async def send(self, decisions: Sequence[Decision]) -> None: ...


@dataclass(slots=True)
class DecideAgentStats:
    samples: int = 0
    taken: int = 0
    withheld: int = 0
    suppressed: int = 0  # triggers already on the topic before a restart, not sent again
    replayed: int = 0
    rebuilds: int = 0
    rejects: int = 0
    errors: int = 0
    by_action: dict[str, int] = field(default_factory=dict)


class DecideRuntime:
    """Per-partition deciders, rebuilt on first use after an assignment; shared by the agent and tests."""

    def __init__(self, params: DecideParams, history: FrameHistory, sinks: Sequence[DecisionSink],
                 rejects: Rejects | None, topic: str, view: ScaleView | None = None, replay_s: float = 900.0,
                 on_decision: Callable[[Decision], None] | None = None) -> None:
        self.params = params
        self.history = history
        self.sinks = list(sinks)
        self.rejects = rejects
        self.topic = topic
        self.view = view
        self.replay_ms = int(replay_s * 1000)
        self.on_decision = on_decision
        self.stats = DecideAgentStats()
        self.wall_ns: Callable[[], int] = time.time_ns
        self._by_partition: dict[int, Decider] = {}
        self._sent: dict[int, set[str]] = {}

    def revoke(self, partitions: Sequence[int]) -> None:
        for p in partitions:
            dec = self._by_partition.pop(p, None)
            self._sent.pop(p, None)
            if dec is not None and self.view is not None:
                for rules in dec.workloads():  # KEDA must not read a stale answer from this worker
                    self.view.remove(rules.namespace, rules.workload)

    async def handle(self, partition: int, offset: int, timestamp_ms: int, key: bytes | None,
                     value: bytes | None) -> list[Decision]:
        """One summary message; returns (and has sent) the decisions it caused."""
        dec = self._by_partition.get(partition)
        if dec is None:
            dec = self._by_partition[partition] = await self._rebuild_retrying(partition, offset, timestamp_ms)
        try:
            sample = decode_workload_sample(value or b"")
        except WorkloadSampleDecodeError as exc:
            self.stats.rejects += 1
            code = str(exc).split(":", 1)[0]
            reason = RejectReason(code) if code in {r.value for r in RejectReason} else RejectReason.WRONG_TYPE
            await self._reject(Reject(reason, f"workloads message: {exc}"), key, value, partition, offset)
            return []
        try:
            decisions = dec.on_sample(sample, self.wall_ns())
        except Exception as exc:  # a bug of ours on one message must not stop the agent
            self.stats.errors += 1
            log.error("decider failed on %s[%d]@%d; sent to the dead-letter topic", self.topic, partition, offset,
                      exc_info=exc)
            await self._reject(Reject(RejectReason.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"), key, value,
                               partition, offset)
            return []
        self.stats.samples += 1
        sent = self._sent.get(partition)
        fresh = decisions
        if sent and decisions:
            # Triggers already on the topic are not sent again; their rows still go to ClickHouse (the
            # crash may have come between the two), where the table collapses repeats.
            fresh = [d for d in decisions if d.outcome != "taken" or d.trigger.id not in sent]
            self.stats.suppressed += len(decisions) - len(fresh)
            sent.difference_update(d.trigger.id for d in decisions)
        if decisions:
            for sink in self.sinks:
                batch = fresh if getattr(sink, "once_per_id", False) else decisions
                if not batch:
                    continue
                ok, _ = await with_backoff(f"decision sink {type(sink).__name__}",
                                           lambda s=sink, b=batch: s.send(b), self._error)  # type: ignore[misc]
                if not ok:
                    log.error("decision sink %s gave up on %s", type(sink).__name__,
                              ", ".join(d.trigger.id for d in batch))
            for d in fresh:
                self._count(d)
        if self.view is not None:
            self._update_view(dec, sample.namespace, sample.workload)
        return decisions

    def _count(self, d: Decision) -> None:
        if d.outcome == "taken":
            self.stats.taken += 1
            self.stats.by_action[d.trigger.action] = self.stats.by_action.get(d.trigger.action, 0) + 1
        else:
            self.stats.withheld += 1
        if self.on_decision is not None:
            self.on_decision(d)

    def _update_view(self, dec: Decider, namespace: str, workload: str) -> None:
        rules = dec.rules_of(namespace, workload)
        if rules is not None and rules.last_tick is not None:
            assert self.view is not None
            self.view.update(desired_of(rules))

    def _error(self) -> None:
        self.stats.errors += 1

    async def _reject(self, reject: Reject, key: bytes | None, value: bytes | None, partition: int,
                      offset: int) -> None:
        await dead_letter(self.rejects, reject, key, value, self.topic, partition, offset)

    async def _rebuild_retrying(self, partition: int, offset: int, timestamp_ms: int) -> Decider:
        ok, dec = await with_backoff(f"partition {partition}: rebuilding decision state",
                                     lambda: self._rebuild(partition, offset, timestamp_ms), self._error)
        if ok and dec is not None:
            return dec
        log.error("partition %d: decision state not rebuilt; starting empty (no cooldown or window history)",
                  partition)
        self._sent[partition] = set()
        return Decider(self.params)

    async def _rebuild(self, partition: int, offset: int, timestamp_ms: int) -> Decider:
        dec = Decider(self.params)
        sent, replayed = await read_history(self.history, partition, offset, timestamp_ms, self.replay_ms,
                                            self.wall_ns() // 1_000_000)
        self._sent[partition] = sent
        for raw in replayed:
            try:  # decisions dropped: made before the crash; only those that reached the topic count as taken
                dec.on_sample(decode_workload_sample(raw), None, sent.__contains__)
            except Exception:  # counted when it was first read
                continue
        self.stats.replayed += len(replayed)
        self.stats.rebuilds += 1
        if replayed:
            log.info("partition %d: decision state rebuilt from %d summaries", partition, len(replayed))
        return dec


def desired_of(rules: WorkloadRules) -> Desired:
    t = rules.last_tick
    assert t is not None
    last = rules.last_action
    return Desired(rules.namespace, rules.workload, rules.workload_class, t.replicas,
                   rules.desired if rules.desired is not None else t.replicas, rules.metric[0], rules.metric[1],
                   t.end_ns, t.stale is not None, last.id if last is not None else None)


def trigger_id_of(raw: bytes) -> str:
    """The id of a triggers message, for the rebuild's sent-set ("" when it is not one of ours)."""
    try:
        return str(orjson.loads(raw)["id"])
    except Exception:
        return ""


class KafkaTriggerSink:
    """Sends the taken decisions' triggers to ``flopwatch.triggers``, keyed by workload."""

    once_per_id = True  # the runtime leaves out triggers the topic already holds

    def __init__(self, topic: Any) -> None:
        self.topic = topic

    async def send(self, decisions: Sequence[Decision]) -> None:
        for d in decisions:
            if d.outcome == "taken":
                await self.topic.send(key=d.trigger.key, value=encode_trigger(d.trigger))


class ClickHouseDecisions:
    """Writes every decision to ``scale_decisions`` on the worker's ClickHouse thread."""

    def __init__(self, run: Callable[[Callable[[Any], None]], Awaitable[None]]) -> None:
        self._run = run

    async def send(self, decisions: Sequence[Decision]) -> None:
        cols = decision_columns(decisions)
        await self._run(lambda backend: backend.insert("scale_decisions", cols))


def decision_columns(decisions: Sequence[Decision]) -> dict[str, list[Any]]:
    ts = [d.trigger for d in decisions]
    return {
        "ts": [t.ts_ns // 1_000_000 for t in ts], "id": [t.id for t in ts], "outcome": [d.outcome for d in decisions],
        "action": [t.action for t in ts], "namespace": [t.namespace for t in ts], "workload": [t.workload for t in ts],
        "workload_class": [t.workload_class for t in ts], "current": [t.current for t in ts],
        "desired": [t.desired for t in ts], "delta": [t.delta for t in ts], "reasons": [list(t.reasons) for t in ts],
        "gate": [d.gate or "" for d in decisions], "gates": [list(d.gates) for d in decisions],
        "evidence": [orjson.dumps({k: dict(v) for k, v in t.evidence.items()}, option=orjson.OPT_SORT_KEYS).decode()
                     for t in ts],
        "reverses": [t.reverses or "" for t in ts], "idempotency_key": [t.idempotency_key for t in ts],
        "before_replicas": [t.before.replicas for t in ts], "before_desired": [t.before.desired for t in ts],
        "before_action": [t.before.last_action or "" for t in ts],
        "before_action_ts_ns": [t.before.last_action_ts_ns or 0 for t in ts]}


def install(app: faust.App, runtime: DecideRuntime, workloads_topic: Any) -> Any:
    """Declare the agent on ``app``; returns it (tests drive it with ``agent.test_context()``)."""
    return declare(app, workloads_topic, "flopwatch.decide", runtime.handle, runtime.topic, runtime.revoke)
