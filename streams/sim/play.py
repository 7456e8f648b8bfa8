"""Plays a scenario's events into the simulator's output.

Events are applied to the generated batches after the fact, as functions of each
sample's time, so the generators' random streams and state are untouched: power,
temperature and clocks are exactly what they would have been without the event (an
efficiency drop costs FLOPs, not watts), the output stays independent of where
``advance`` cuts, and a run without a scenario is byte-identical to one before
scenarios existed. A load change is the one event that costs watts: the dynamic part of
the power (above the GPU's idle) follows the activity as the generator's physics has
it (~ activity^0.6), settling with the same 0.5 s time constant, so FLOPS/W falls with
the load as on a real GPU.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Final, Literal

from schemas.records import K8sEvent, SampleBatch, Times
from streams.sim.leak_effects import LeakEffects
from streams.sim.physics import NodeSpec, SimParams
from streams.sim.scenario import LoadProfile, Scenario, TruthEvent

# The columns an efficiency drop or a spike rewrites; every other stream keeps its values.
_ACTIVITY: Final = frozenset({"gpu_util", "sm_active", "tensor_active"})
_POWER_TAU_NS: Final = 500_000_000  # as streams.sim.generators: power settles within ~1 s
_SETTLED_NS: Final = 10 * _POWER_TAU_NS


@dataclasses.dataclass(frozen=True, slots=True)
class _Load:
    """A load change on one GPU: the activity factor at a time, and the (lagging) power factor."""

    start: int
    end: int
    profile: LoadProfile
    level: float
    period: int

    def factor(self, t: int) -> float:
        if not self.start <= t < self.end:
            return 1.0
        x, lo = t - self.start, self.level
        if self.profile == "step":
            return lo
        if self.profile == "square":
            return lo if x % self.period < self.period / 2 else 1.0
        span = self.period if self.profile == "sine" else self.end - self.start
        return 1.0 - (1.0 - lo) * math.sin(math.pi * x / span) ** 2

    def power_factor(self, t: int) -> float:
        if self.profile in ("sine", "diurnal"):  # smooth: a first-order lag is a delay of its time constant
            return self.factor(t - _POWER_TAU_NS)
        sw = self._last_switch(t)
        if sw is None:
            return 1.0
        now, before = self.factor(t), self.factor(sw - 1)
        return now + (before - now) * math.exp(-(t - sw) / _POWER_TAU_NS)

    def _last_switch(self, t: int) -> int | None:
        if t < self.start:
            return None
        if t >= self.end:
            return self.end
        if self.profile == "step":
            return self.start
        half = self.period // 2
        return self.start + (t - self.start) // half * half


@dataclasses.dataclass(slots=True)
class _GpuEffects:
    """What the scenario does to one GPU, in absolute times (windows [start, end))."""

    drops: list[tuple[int, int, float]] = dataclasses.field(default_factory=list)  # (start, end, 1 - depth)
    spikes: list[tuple[int, int, float]] = dataclasses.field(default_factory=list)  # (start, end, level)
    changes: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # (from, workload), by time
    loads: list[_Load] = dataclasses.field(default_factory=list)
    idle_w: float = 0.0


class ScenarioPlayer:
    """Applies a scenario to a cluster's batches and adds the K8s events of its workload changes.

    Examples
    --------
    >>> from streams.sim.scenario import parse_scenario
    >>> from streams.sim.physics import make_node
    >>> sc = parse_scenario('version = 1\\n[[event]]\\nkind = "spike"\\nnode = "node-00"\\ngpu = "0"\\n'
    ...                     'start_s = 1.0\\nlevel = 0.9\\n')
    >>> p = SimParams(nodes=1, gpus=1, start_ns=0)
    >>> player = ScenarioPlayer(sc, p, [make_node(p, 0)])
    >>> b = SampleBatch("sm_active", "node-00", "0", [900_000_000, 1_000_000_000, 1_100_000_000, 1_200_000_000],
    ...                 [0.1, 0.1, 0.1, 0.1])
    >>> list(player.apply([b])[0].value)
    [0.1, 0.9, 0.9, 0.1]
    """

    def __init__(self, scenario: Scenario, params: SimParams, nodes: Sequence[NodeSpec]) -> None:
        scenario.check_cluster(params.nodes, params.gpus)
        self._effects: dict[tuple[str, str], _GpuEffects] = {}
        self._events: list[K8sEvent] = []
        gpu_ids = [str(g) for g in range(params.gpus)]
        truth = scenario.truth(params.start_ns)
        self._leaks = LeakEffects(truth)
        self._idle_w = {(node.name, str(i)): g.idle_w for node in nodes for i, g in enumerate(node.gpus)}
        for t in truth:  # by time, so each GPU's changes come in order
            if t.kind == "leak":
                continue  # played by LeakEffects
            for node in nodes:
                hit = tuple(g for g in gpu_ids if t.covers(node.name, g))
                if not hit:
                    continue
                renamed: dict[tuple[str, str], list[str]] = {}  # (old, new) -> GPUs
                for g in hit:
                    fx = self._effects.setdefault((node.name, g), _GpuEffects(idle_w=node.gpus[int(g)].idle_w))
                    if t.kind == "load_change":
                        fx.loads.append(_load(t))
                    elif t.kind == "efficiency_drop":
                        fx.drops.append((t.start_ns, t.end_ns, 1.0 - t.depth))
                    elif t.kind == "spike":
                        fx.spikes.append((t.start_ns, t.end_ns, t.level))
                    else:
                        old = fx.changes[-1][1] if fx.changes else node.workload
                        # Unnamed changes get a version suffix counted per GPU: llm-serve-v2, llm-serve-v3, ...
                        new = t.new_workload or f"{node.workload}-v{len(fx.changes) + 2}"
                        fx.changes.append((t.start_ns, new))
                        renamed.setdefault((old, new), []).append(g)
                for (old, new), gpus in renamed.items():
                    # Published like the pod events: a pod of the new workload lands on those GPUs.
                    self._events.append(K8sEvent(
                        node.name, t.start_ns, "Normal", "Scheduled", "Pod", node.namespace, node.pod, new,
                        tuple(gpus), f"Successfully assigned {node.namespace}/{node.pod} to {node.name}: "
                        f"workload {old} -> {new} on GPU {','.join(gpus)}"))

    def apply(self, batches: list[SampleBatch]) -> list[SampleBatch]:
        """The batches with the scenario applied; a batch that spans a workload change is cut there."""
        if self._leaks:
            batches = [piece for b in batches for piece in self._leaks.apply(b, self._idle_w.get((b.node, b.gpu), 0.0))]
        out: list[SampleBatch] = []
        for b in batches:
            fx = self._effects.get((b.node, b.gpu))
            if fx is None:
                out.append(b)
                continue
            if b.sensor in _ACTIVITY and (fx.drops or fx.spikes or fx.loads):
                b = dataclasses.replace(b, value=_activity(b, fx))
            elif b.sensor == "power" and fx.loads:
                b = dataclasses.replace(b, value=_power(b, fx))
            out.extend(_relabel(b, fx.changes) if fx.changes else (b,))
        return out

    def k8s_events(self, lo_ns: int, hi_ns: int) -> list[K8sEvent]:
        """K8s events of the scenario with time in [lo_ns, hi_ns)."""
        return [e for e in self._events if lo_ns <= e.ts_ns < hi_ns]


def _activity(b: SampleBatch, fx: _GpuEffects) -> list[float]:
    values = list(b.value)
    ts = b.ts_ns
    for ld in fx.loads:  # the workload's own load first: drops and spikes happen to whatever it runs
        top = 100.0 if b.sensor == "gpu_util" else 1.0
        for i in range(bisect.bisect_left(ts, ld.start), bisect.bisect_left(ts, ld.end)):
            v = min(values[i] * ld.factor(ts[i]), top)
            values[i] = float(round(v)) if b.sensor == "gpu_util" else v
    # Drops first, then spikes: a spike inside a drop still reaches its level.
    if b.sensor != "gpu_util":  # utilisation counts busy time, which a less efficient kernel still fills
        for start, end, factor in fx.drops:
            _rewrite(values, ts, start, end, "scale", factor)
    for start, end, level in fx.spikes:
        if b.sensor == "gpu_util":
            _rewrite(values, ts, start, end, "set", float(round(level * 100.0)))  # whole percent, as NVML reports
        elif b.sensor == "sm_active":
            _rewrite(values, ts, start, end, "set", level)
        else:  # tensor_active: a GPU's tensor cores cannot be busier than its SMs
            _rewrite(values, ts, start, end, "cap", level)
    return values


def _power(b: SampleBatch, fx: _GpuEffects) -> list[float]:
    values, ts, idle = list(b.value), b.ts_ns, fx.idle_w
    for ld in fx.loads:
        for i in range(bisect.bisect_left(ts, ld.start), bisect.bisect_left(ts, ld.end + _SETTLED_NS)):
            v = values[i]
            values[i] = idle + (v - idle) * ld.power_factor(ts[i]) ** 0.6 if v > idle else v
    return values


def _load(t: TruthEvent) -> _Load:
    return _Load(t.start_ns, t.end_ns, t.profile, t.level, round(t.period_s * 1e9))


def _rewrite(values: list[float], ts: Times, start: int, end: int, op: Literal["scale", "set", "cap"],
             x: float) -> None:
    for i in range(bisect.bisect_left(ts, start), bisect.bisect_left(ts, end)):
        v = values[i]
        values[i] = v * x if op == "scale" else x if op == "set" else min(v, x)


def _relabel(b: SampleBatch, changes: list[tuple[int, str]]) -> list[SampleBatch]:
    """The batch cut at each workload change inside it, each piece labelled with the workload of its time."""
    ts = b.ts_ns
    if not ts or changes[0][0] > ts[-1]:  # all before the GPU's first change: the batch as generated
        return [b]
    before = [w for at, w in changes if at <= ts[0]]
    cuts = [0, *(bisect.bisect_left(ts, at) for at, _ in changes if ts[0] < at <= ts[-1]), len(ts)]
    names = [before[-1] if before else None, *(w for at, w in changes if ts[0] < at <= ts[-1])]
    pieces: list[SampleBatch] = []
    for (lo, hi), name in zip(itertools.pairwise(cuts), names, strict=True):
        if lo == hi:
            continue
        # Before the GPU's first change the labels stay as generated.
        labels = b.labels if name is None else {**(b.labels or {}), "workload": name}
        pieces.append(SampleBatch(b.sensor, b.node, b.gpu, list(ts[lo:hi]), list(b.value[lo:hi]), b.clock, labels))
    return pieces
