"""Plays a scenario's events into the simulator's output.

Events are applied to the generated batches after the fact, as functions of each
sample's time, so the generators' random streams and state are untouched: power,
temperature and clocks are exactly what they would have been without the event (an
efficiency drop costs FLOPs, not watts), the output stays independent of where
``advance`` cuts, and a run without a scenario is byte-identical to one before
scenarios existed.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Sequence
from typing import Final, Literal

from schemas.records import K8sEvent, SampleBatch
from streams.sim.physics import NodeSpec, SimParams
from streams.sim.scenario import Scenario

# The columns an efficiency drop or a spike rewrites; every other stream keeps its values.
_ACTIVITY: Final = frozenset({"gpu_util", "sm_active", "tensor_active"})


@dataclasses.dataclass(slots=True)
class _GpuEffects:
    """What the scenario does to one GPU, in absolute times (windows [start, end))."""

    drops: list[tuple[int, int, float]] = dataclasses.field(default_factory=list)  # (start, end, 1 - depth)
    spikes: list[tuple[int, int, float]] = dataclasses.field(default_factory=list)  # (start, end, level)
    changes: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # (from, workload), by time


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
        for t in scenario.truth(params.start_ns):  # by time, so each GPU's changes come in order
            for node in nodes:
                hit = tuple(g for g in gpu_ids if t.covers(node.name, g))
                if not hit:
                    continue
                renamed: dict[tuple[str, str], list[str]] = {}  # (old, new) -> GPUs
                for g in hit:
                    fx = self._effects.setdefault((node.name, g), _GpuEffects())
                    if t.kind == "efficiency_drop":
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
        out: list[SampleBatch] = []
        for b in batches:
            fx = self._effects.get((b.node, b.gpu))
            if fx is None:
                out.append(b)
                continue
            if b.sensor in _ACTIVITY and (fx.drops or fx.spikes):
                b = dataclasses.replace(b, value=_activity(b, fx))
            out.extend(_relabel(b, fx.changes) if fx.changes else (b,))
        return out

    def k8s_events(self, lo_ns: int, hi_ns: int) -> list[K8sEvent]:
        """K8s events of the scenario with time in [lo_ns, hi_ns)."""
        return [e for e in self._events if lo_ns <= e.ts_ns < hi_ns]


def _activity(b: SampleBatch, fx: _GpuEffects) -> list[float]:
    values = list(b.value)
    ts = b.ts_ns
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


def _rewrite(values: list[float], ts: Sequence[int], start: int, end: int, op: Literal["scale", "set", "cap"],
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
