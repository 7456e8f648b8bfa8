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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import faust
import orjson

from agents.decide.scale_view import Desired, ScaleView
from agents.runtime.give_way import AgentQueues
from agents.runtime.partition_agent import FrameHistory, Rejects, declare
from agents.runtime.partition_runtime import PartitionCounters, PartitionRuntime
from agents.runtime.timebase import SYSTEM_CLOCK, Clock
from schemas.records import Reject, RejectReason
from schemas.triggers import encode_trigger
from schemas.workload_samples import WorkloadSample, WorkloadSampleDecodeError, decode_workload_sample
from streams.decide.engine import Decider, DecisionTally
from streams.decide.params import DecideParams
from streams.decide.rules import Decision, WorkloadRules

log = logging.getLogger(__name__)


class DecisionSink(Protocol):
    async def send(self, decisions: Sequence[Decision]) -> None: ...


@dataclass(slots=True)
class DecideAgentStats(PartitionCounters):
    samples: int = 0
    decisions: DecisionTally = field(default_factory=DecisionTally)  # those sent: replayed and suppressed are not


class DecideRuntime(PartitionRuntime[Decider, WorkloadSample, Decision]):
    """Per-partition deciders, rebuilt on first use after an assignment; shared by the agent and tests."""

    engine_noun = "decider"
    state_noun = "decision"
    input_noun = "summaries"
    output_noun = "decision"
    empty_note = " (no cooldown or window history)"
    stats: DecideAgentStats

    def __init__(self, params: DecideParams, history: FrameHistory, sinks: Sequence[DecisionSink],
                 rejects: Rejects | None, topic: str, view: ScaleView | None = None, replay_s: float = 900.0,
                 on_decision: Callable[[Decision], None] | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__(history, sinks, rejects, topic, replay_s, clock)
        self.params = params
        self.view = view
        self.on_decision = on_decision
        self.stats = DecideAgentStats()

    def _forget(self, partition: int, state: Decider | None) -> None:
        if state is not None and self.view is not None:
            for rules in state.workloads():  # KEDA must not read a stale answer from this worker
                self.view.remove(rules.namespace, rules.workload)

    def _decode(self, value: bytes) -> WorkloadSample | Reject:
        try:
            return decode_workload_sample(value)
        except WorkloadSampleDecodeError as exc:
            code = str(exc).split(":", 1)[0]
            reason = RejectReason(code) if code in {r.value for r in RejectReason} else RejectReason.WRONG_TYPE
            return Reject(reason, f"workloads message: {exc}")

    def _fresh(self, partition: int) -> Decider:
        return Decider(self.params)

    def _apply(self, state: Decider, msg: WorkloadSample) -> list[Decision]:
        return state.on_sample(msg, self.clock.wall_ns())

    def _replay_one(self, partition: int, state: Decider, raw: bytes, sent: dict[str, bytes]) -> None:
        # Only the decisions whose triggers reached the topic count as taken.
        state.on_sample(decode_workload_sample(raw), None, sent.__contains__)

    def _sent_id(self, out: Decision) -> str:
        return out.trigger.id

    def _once(self, out: Decision) -> bool:
        return out.outcome == "taken"  # only a taken decision has a trigger on the topic

    def _processed(self, msg: WorkloadSample) -> None:
        self.stats.samples += 1

    def _count(self, fresh: Sequence[Decision]) -> None:
        self.stats.decisions.count(fresh)
        if self.on_decision is not None:
            for d in fresh:
                self.on_decision(d)

    def _yielded(self, made: list[Decision], fresh: list[Decision]) -> list[Decision]:
        return made

    async def _after(self, partition: int, state: Decider, msg: WorkloadSample) -> None:
        if self.view is not None:
            rules = state.rules_of(msg.namespace, msg.workload)
            if rules is not None and rules.last_tick is not None:
                self.view.update(desired_of(rules))


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


def install(app: faust.App, runtime: DecideRuntime, workloads_topic: Any, queues: AgentQueues | None = None) -> Any:
    """Declare the agent on ``app``; returns it (tests drive it with ``agent.test_context()``)."""
    return declare(app, workloads_topic, "flopwatch.decide", runtime.handle, runtime.topic, runtime.revoke, queues)
