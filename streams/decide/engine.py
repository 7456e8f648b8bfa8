"""From per-workload summaries to scaling decisions: the engine behind ``flopwatch.triggers``.

``Decider.on_sample`` takes one (workload, node, tick) summary (``schemas.workload_samples``)
in the order of the ``flopwatch.workloads`` topic and returns the decisions it causes.
Everything is a function of that sequence (and of ``now_ns`` for the age check), so the
decide agent rebuilds its state after a crash by replaying the topic, and the decisions
come out with the same ids.

A workload's tick is evaluated once every node the workload runs on sent it, or once another
node is ``tick_grace_s`` ahead of it. Staleness (seed 001 §2.5): a tick that misses
a node the workload is on, or whose end is more than ``max_age_s`` older than ``now_ns``,
is still used to update the rule windows, but nothing is taken on it: what would have
been taken is ``withheld`` with gate ``stale_node`` or ``stale_data``. A node that left the
workload (``present = false``) is no longer waited for; one silent for ``forget_node_s``
is taken as gone. The rules themselves: ``streams.decide.rules``.

>>> from schemas.workload_samples import WorkloadSample
>>> from streams.decide.params import DecideParams, Rules
>>> d = Decider(DecideParams(rules=Rules(sm_active_up_s=3)))
>>> def busy(t):
...     return WorkloadSample("ml", "train", "training", "n1", t * 10**9, 10**9, 8, ("p0", "p1"),
...                           0.9, None, None, None, None, False, ())
>>> out = [x for t in range(5) for x in d.on_sample(busy(t), now_ns=None)]
>>> [(x.outcome, x.trigger.action, x.trigger.current, x.trigger.desired, x.trigger.ts_ns) for x in out]
[('taken', 'scale_up', 2, 3, 3000000000)]
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from schemas.workload_samples import WorkloadSample
from streams.decide.params import DecideParams, S
from streams.decide.rules import Decision, WorkloadRules, WorkloadTick
from streams.decide.window import TokenBucket


@dataclass(slots=True)
class DecisionTally:
    """Decisions by (action, outcome, gate): the one count behind the engine's stats, the agent's
    progress line and ``flopwatch_decisions_total``.

    >>> t = DecisionTally()
    >>> t.add("scale_up", "taken", None); t.add("scale_down", "withheld", "l1_spike")
    >>> (t.total("taken"), t.total("withheld"), t.by_kind[("scale_down", "withheld", "l1_spike")])
    (1, 1, 1)
    """

    by_kind: dict[tuple[str, str, str], int] = field(default_factory=dict)  # gate "" when none held it

    def add(self, action: str, outcome: str, gate: str | None) -> None:
        k = (action, outcome, gate or "")
        self.by_kind[k] = self.by_kind.get(k, 0) + 1

    def count(self, decisions: Iterable[Decision]) -> None:
        for d in decisions:
            self.add(d.trigger.action, d.outcome, d.gate)

    def total(self, outcome: str) -> int:
        return sum(n for (_, o, _), n in self.by_kind.items() if o == outcome)


@dataclass(slots=True)
class DecideStats:
    samples: int = 0
    duplicates: int = 0  # a (workload, node, tick) seen before: a replayed summary
    late: int = 0  # arrived after its tick was evaluated
    ticks: int = 0
    stale_ticks: int = 0
    decisions: DecisionTally = field(default_factory=DecisionTally)


@dataclass(slots=True)
class _Workload:
    rules: WorkloadRules
    nodes: dict[str, int] = field(default_factory=dict)  # node -> newest tick it sent
    pending: dict[int, list[WorkloadSample]] = field(default_factory=dict)
    evaluated: int = -1  # newest tick evaluated


class Decider:
    """Decision state for the workloads one agent sees; bounded (least recently seen go first)."""

    def __init__(self, params: DecideParams) -> None:
        self.params = params
        r = params.rules
        self.bucket = TokenBucket(r.rate_per_min / (60 * S), r.rate_burst)
        self.stats = DecideStats()
        self._workloads: OrderedDict[tuple[str, str], _Workload] = OrderedDict()

    def workloads(self) -> Iterable[WorkloadRules]:
        return (w.rules for w in self._workloads.values())

    def rules_of(self, namespace: str, workload: str) -> WorkloadRules | None:
        w = self._workloads.get((namespace, workload))
        return None if w is None else w.rules

    def on_sample(self, s: WorkloadSample, now_ns: int | None,
                  was_sent: Callable[[str], bool] | None = None) -> list[Decision]:
        """One summary; ``now_ns`` (wall clock) for the age check. Replaying history after a restart:
        ``now_ns`` None and ``was_sent`` says which triggers reached the topic; a decision whose trigger
        did not was not taken then (the age guard held it, or it was lost) and is not taken now."""
        self.stats.samples += 1
        key = (s.namespace, s.workload)
        w = self._workloads.get(key)
        if w is None:
            w = _Workload(WorkloadRules(self.params, s.namespace, s.workload, s.workload_class, s.grid_ns))
            self._workloads[key] = w
            if len(self._workloads) > self.params.max_workloads:
                self._workloads.popitem(last=False)
        self._workloads.move_to_end(key)
        w.rules.workload_class = s.workload_class
        w.rules.was_sent = was_sent
        if s.tick_ns <= w.nodes.get(s.node, -1):
            self.stats.duplicates += 1
            return []
        if not s.present:
            w.nodes.pop(s.node, None)
        else:
            w.nodes[s.node] = s.tick_ns
            if s.tick_ns <= w.evaluated:
                self.stats.late += 1
            else:
                w.pending.setdefault(s.tick_ns, []).append(s)
        return self._ready(w, now_ns)

    def _ready(self, w: _Workload, now_ns: int | None) -> list[Decision]:
        r = self.params.rules
        out: list[Decision] = []
        newest = max(w.nodes.values(), default=-1)
        for tick in sorted(w.pending):
            # Wait for every node the workload runs on, however far behind: partitions read at
            # different speeds (a catch-up) look like this, and so does a collector that stopped.
            complete = all(last >= tick for last in w.nodes.values())
            if not complete and newest - tick < int(r.tick_grace_s * S):
                break
            out += self._evaluate(w, tick, w.pending.pop(tick), now_ns)
        forget = newest - int(r.forget_node_s * S)
        for n in [n for n, last in w.nodes.items() if last < forget]:
            del w.nodes[n]
        return out

    def _evaluate(self, w: _Workload, tick: int, samples: list[WorkloadSample], now_ns: int | None) -> list[Decision]:
        r = self.params.rules
        w.evaluated = tick
        grid = samples[0].grid_ns
        sent = {s.node for s in samples}
        stale = None
        if any(n not in sent for n in w.nodes):  # a node of the workload did not send this tick
            stale = "stale_node"
        elif now_ns is not None and now_ns - (tick + grid) > int(r.max_age_s * S):
            stale = "stale_data"
        t = _aggregate(tick, grid, samples, stale)
        self.stats.ticks += 1
        self.stats.stale_ticks += stale is not None
        decisions = w.rules.step(t, self.bucket)
        self.stats.decisions.count(decisions)
        return decisions


def _aggregate(tick: int, grid: int, samples: list[WorkloadSample], stale: str | None) -> WorkloadTick:
    gpus = sum(s.gpus for s in samples)
    pods = {p for s in samples for p in s.pods}

    def weighted(name: str) -> float | None:
        pairs = [(getattr(s, name), s.gpus) for s in samples if getattr(s, name) is not None]
        total = sum(n for _, n in pairs)
        return sum(v * n for v, n in pairs) / total if total else None

    def pick(name: str, how: Callable[[list[float]], float]) -> float | None:
        xs: list[float] = [getattr(s, name) for s in samples if getattr(s, name) is not None]
        return float(how(xs)) if xs else None

    return WorkloadTick(tick, grid, len(pods) if pods else len(samples), gpus, weighted("sm_active"),
                        weighted("pcie_util"), pick("nccl_ms", max), pick("latency_ms", max), pick("qps", sum),
                        any(s.spike for s in samples), tuple(sorted({g for s in samples for g in s.drift})), stale,
                        weighted("power_w"), tuple(sorted(((s.node, d) for s in samples for d in s.drift_detail),
                                                          key=lambda nd: (nd[0], nd[1].gpu))))
