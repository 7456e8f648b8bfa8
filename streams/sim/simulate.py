"""Cluster simulator: deterministic, correlated signal generators for the 23 sensor streams.

Pure: the start time and every parameter are arguments, randomness comes from local
``random.Random`` instances. The physics and shared schedules are in
``streams.sim.physics``, the per-source generators in ``streams.sim.generators``; this
module runs them together and re-exports the public names.
"""

from __future__ import annotations

from schemas.records import K8sEvent, SampleBatch
from streams.sim.generators import (
    HOST_SENSORS,
    INFER_SENSORS,
    NVML_SENSORS,
    STEP_SENSORS,
    XID_CODES,
    HostGen,
    InferGen,
    NvmlGen,
    StepGen,
)
from streams.sim.physics import GPU_PHYSICS, GpuPhysics, SimParams, make_node, node_name, pod_events
from streams.sim.play import ScenarioPlayer
from streams.sim.scenario import Scenario, TruthEvent

__all__ = [
    "GPU_PHYSICS",
    "HOST_SENSORS",
    "INFER_SENSORS",
    "NVML_SENSORS",
    "STEP_SENSORS",
    "XID_CODES",
    "ClusterSimulator",
    "GpuPhysics",
    "Scenario",
    "SimParams",
    "TruthEvent",
    "node_name",
]


class ClusterSimulator:
    """Every sample of a simulated cluster, in event-time slices.

    Even nodes train (phases of compute, communication, dataloader stalls,
    checkpoints), odd nodes serve inference (a daily request cycle with bursts).
    The output is the same whatever the slicing. A ``scenario`` adds its labelled
    events (``streams.sim.scenario``); its node and GPU names are checked against the
    cluster here (``ScenarioError``).

    Examples
    --------
    >>> sim = ClusterSimulator(SimParams(nodes=2, gpus=1, seed=7))
    >>> batches = sim.advance(sim.params.start_ns + 20_000_000_000)
    >>> len({b.sensor for b in batches})
    23
    >>> [e.reason for e in sim.k8s_events()]
    ['Scheduled', 'Scheduled', 'Started', 'Started']
    """

    def __init__(self, params: SimParams, scenario: Scenario | None = None) -> None:
        self.params = params
        self._now = params.start_ns
        self._nodes = [make_node(params, i) for i in range(params.nodes)]
        self._gpu_gens: list[tuple[str, NvmlGen | StepGen | InferGen]] = []
        self._host_gens: list[HostGen] = []
        for node in self._nodes:
            for g in range(params.gpus):
                self._gpu_gens.append((str(g), NvmlGen(params, node, g)))
                side = StepGen(params, node, g) if node.training else InferGen(params, node, g)
                self._gpu_gens.append((str(g), side))
            self._host_gens.append(HostGen(params, node))
        self._events: list[K8sEvent] = []
        self.scenario = scenario
        self._player = None if scenario is None else ScenarioPlayer(scenario, params, self._nodes)

    @property
    def now_ns(self) -> int:
        """Where the last ``advance`` stopped (exclusive): the next sample's time is >= this."""
        return self._now

    def truth(self) -> list[TruthEvent]:
        """The scenario's events at this run's absolute times (none without a scenario)."""
        return [] if self.scenario is None else self.scenario.truth(self.params.start_ns)

    def advance(self, until_ns: int) -> list[SampleBatch]:
        """Every sample with event time in [previous until, until_ns), one batch per (sensor, node, gpu)
        (a scenario's workload change cuts a GPU's batches in two at the change)."""
        if until_ns < self._now:
            raise ValueError(f"advance to {until_ns} is before {self._now}")
        out: list[SampleBatch] = []
        for gid, gen in self._gpu_gens:
            gen.run(until_ns, out, gid)
        for host in self._host_gens:
            host.run(until_ns, out)
        events = [e for node in self._nodes for e in pod_events(node, self._now, until_ns)]
        if self._player is not None:
            out = self._player.apply(out)
            events += self._player.k8s_events(self._now, until_ns)
        events.sort(key=lambda e: (e.ts_ns, e.node))
        self._events = events
        self._now = until_ns
        return out

    def k8s_events(self) -> list[K8sEvent]:
        """Kubernetes events with time in the interval of the last ``advance``, by time."""
        return list(self._events)
