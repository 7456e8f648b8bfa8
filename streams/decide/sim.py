"""Decision scenarios: a simulated online service whose replicas follow the triggers, frame by frame.

Each scenario drives one workload's total load (requests/s) over time on a small cluster;
every replica is one pod on one GPU. A replica serves up to ``capacity_qps``: its SM
activity is proportional to its share of the load, and its latency climbs steeply as
it nears capacity. The loop is closed: a taken ``scale_up``/``scale_down``/``rollback``
changes the replica count ``actuation_s`` later, as an autoscaler acting on the trigger
would, so the engine sees the consequences of its own decisions.

Power follows the load as on a real GPU (200 W static plus 450 W at full SM activity, a
tick's mean lagging a load change by ~0.5 s), and FLOPS/W is the tensor work over it, so
the detection agent's drift rule runs on the frames as it does in the worker: a load
change moves FLOPS/W but is no drift; ``drift`` makes the replicas do less tensor work at
the same power, which is one.

``run_scenario`` returns the frames (what the Kafka tests publish) and the decisions
the engine made in-process (what they must see again); ``SCENARIOS`` names them, with the
decisions each one expects.

>>> run = run_scenario(SCENARIOS["steady"])
>>> len(run.frames) > 0, [d.trigger.action for d in run.decisions]
(True, [])
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from schemas.frame_messages import FrameMessage, GpuFrame
from schemas.frames import peak_column
from streams.decide.engine import Decider
from streams.decide.params import DecideParams, NamespacePolicy, S
from streams.decide.rules import Decision
from streams.detect.detectors import Detectors, DetectParams
from streams.detect.spike_rule import SPIKE_THRESHOLDS
from streams.detect.workload_tap import WorkloadTap

Load = Callable[[float], float]  # seconds since the start -> total requests/s


@dataclass(frozen=True, slots=True)
class Expect:
    """A decision the scenario must (count >= 1) or must not (count == 0) produce within [from_s, to_s)."""

    action: str
    outcome: str = "taken"
    gate: str | None = None
    from_s: float = 0.0
    to_s: float = math.inf
    count: int | None = None  # exact count; None = at least one


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    duration_s: float
    load: Load
    replicas: int = 4
    nodes: int = 2
    gpus_per_node: int = 8
    workload_class: str = "inference"
    namespace: str = "serving"
    workload: str = "chat"
    capacity_qps: float = 1000.0
    actuation_s: float = 10.0
    spikes_at: tuple[float, ...] = ()  # seconds: a 200 ms L1 spike on every replica
    stopped: tuple[tuple[str, float, float], ...] = ()  # (node, from_s, to_s): that node's collector is down
    lagged: tuple[tuple[float, float, float], ...] = ()  # (from_s, to_s, lag_s): the worker reads that late
    drift: tuple[tuple[float, float, float], ...] = ()  # (from_s, to_s, depth): less tensor work, same power
    params: DecideParams = field(default_factory=DecideParams)
    expect: tuple[Expect, ...] = ()
    node_offset: int = 0  # first node's number: scenarios run side by side on distinct nodes
    start_ns: int = 1_796_200_000_000_000_000


@dataclass(slots=True)
class Run:
    frames: list[FrameMessage]
    decisions: list[Decision]
    replicas: list[tuple[float, int]]  # (seconds, replicas) at each change


def node_name(i: int) -> str:
    return f"node-{i:02d}"


def run_scenario(sc: Scenario, grid_s: float = 1.0) -> Run:
    grid = int(grid_s * S)
    tap = WorkloadTap(SPIKE_THRESHOLDS, lambda _model: 32e9)
    detectors = Detectors(DetectParams(), grid)
    rng = random.Random(sc.name)
    decider = Decider(sc.params)
    replicas = sc.replicas
    changes: list[tuple[float, int]] = [(0.0, replicas)]
    pending: list[tuple[float, int]] = []
    frames: list[FrameMessage] = []
    decisions: list[Decision] = []
    for k in range(int(sc.duration_s / grid_s)):
        t_s = k * grid_s
        while pending and pending[0][0] <= t_s:
            replicas = pending.pop(0)[1]
            changes.append((t_s, replicas))
        tick = sc.start_ns + k * grid
        lag = max([lag for a, b, lag in sc.lagged if a <= t_s < b], default=0.0)
        now = tick + grid + int((2.0 + lag) * S)  # the allowed lateness, plus any consumer lag
        for n in range(sc.nodes):
            node = node_name(n + sc.node_offset)
            if any(node == s and a <= t_s < b for s, a, b in sc.stopped):
                continue
            m = _frame(sc, node, n, tick, grid, replicas, t_s, rng)
            frames.append(m)
            detectors.on_message(m)
            for s in tap.summarise(m, detectors.drifting(node)):
                for d in decider.on_sample(s, now):
                    decisions.append(d)
                    if d.outcome == "taken" and d.trigger.action != "rebalance":
                        pending.append((t_s + sc.actuation_s, d.trigger.desired))
                        pending.sort()
    return Run(frames, decisions, changes)


UTIL_PEAK = peak_column("gpu_util")


STATIC_W, DYNAMIC_W, TAU_S = 200.0, 450.0, 0.5
PEAK_FLOPS = 989.5e12  # an H100-SXM's dense bf16 peak


def _frame(sc: Scenario, node: str, n: int, tick: int, grid: int, replicas: int, t_s: float,
           rng: random.Random) -> FrameMessage:
    grid_s = grid / S
    share = sc.load(t_s) / max(replicas, 1)
    util = min(share / sc.capacity_qps, 1.0)
    before = min(sc.load(max(t_s - grid_s, 0.0)) / max(replicas, 1) / sc.capacity_qps, 1.0)
    # A tick's mean power after a load change at its start: the new level plus the decaying rest of the old one.
    lag = TAU_S / grid_s * (1 - math.exp(-grid_s / TAU_S))
    power = STATIC_W + DYNAMIC_W * 0.9 * (util + (before - util) * lag)
    depth = max([d for a, b, d in sc.drift if a <= t_s < b], default=0.0)
    latency = 40.0 + 100.0 * util**4
    spike = any(a <= t_s < a + 1 for a in sc.spikes_at)
    gpus = []
    for g in range(sc.gpus_per_node):
        replica = g * sc.nodes + n  # replicas spread over the nodes
        if replica >= replicas:
            gpus.append(GpuFrame(str(g), {"gpu_model": "H100-SXM"}, {"sm_active": 0.0}, {UTIL_PEAK: 0.0}, ""))
            continue
        labels = {"namespace": sc.namespace, "workload": sc.workload, "class": sc.workload_class,
                  "pod": f"{sc.workload}-{replica}", "gpu_model": "H100-SXM"}
        p = power * (1 + rng.gauss(0.0, 0.003))  # NVML's power reading is good to a few watts
        values = {"sm_active": 0.9 * util, "request_rate": share, "request_latency_ms": latency, "power": p}
        tensor = 0.8 * 0.9 * util * (1 - depth) * (1 + rng.gauss(0.0, 0.01))
        derived = {UTIL_PEAK: 99.0 if spike else 90.0 * util, "flops_per_watt": PEAK_FLOPS * tensor / p}
        gpus.append(GpuFrame(str(g), labels, values, derived, ""))
    return FrameMessage(node, tick, grid, tuple(gpus))


def check(sc: Scenario, run: Run) -> list[str]:
    """What ``run`` got wrong against ``sc.expect`` (empty: as expected)."""
    faults = []
    for e in sc.expect:
        hits = [d for d in run.decisions
                if d.trigger.action == e.action and d.outcome == e.outcome and (e.gate is None or d.gate == e.gate)
                and e.from_s <= (d.trigger.ts_ns - sc.start_ns) / S < e.to_s]
        if (e.count is None and not hits) or (e.count is not None and len(hits) != e.count):
            want = "at least 1" if e.count is None else str(e.count)
            faults.append(f"{sc.name}: {e} matched {len(hits)}, want {want}")
    return faults


def flaps(run: Run, window_s: float) -> int:
    """Direction changes (a scale-up after a scale-down or the reverse, rollbacks excepted) within ``window_s``."""
    taken = [d.trigger for d in run.decisions if d.outcome == "taken" and d.trigger.action in ("scale_up",
                                                                                               "scale_down")]
    return sum(1 for a, b in itertools.pairwise(taken)
               if a.action != b.action and b.ts_ns - a.ts_ns < window_s * S)


def _quota() -> DecideParams:
    return DecideParams(namespaces={"serving": NamespacePolicy(min_replicas=3, max_replicas=6)})


def _wave(lo: float, hi: float, period_s: float) -> Load:
    return lambda t: lo + (hi - lo) * math.sin(math.pi * t / period_s) ** 2


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("steady", "steady half load: no decision at all", 900, lambda t: 2000.0,
             expect=(Expect("scale_up", count=0), Expect("scale_down", count=0),
                     Expect("scale_down", "withheld", count=0), Expect("scale_up", "withheld", count=0))),
    Scenario("diurnal", "load rises from 1,500 to 6,000 requests/s and falls back over 40 min", 2400,
             _wave(1500.0, 6000.0, 2400.0), replicas=3,
             expect=(Expect("scale_up", to_s=1200), Expect("scale_down", from_s=1200),
                     Expect("scale_down", to_s=900, count=0), Expect("rebalance", count=0))),
    Scenario("flapping", "load flips every 70 s between 90% and 20% of 4 replicas' capacity: one scale-up in "
             "the first hot phase, then no change of direction", 1500,
             lambda t: 3600.0 if int(t // 70) % 2 == 0 else 800.0,
             expect=(Expect("scale_up", to_s=70, count=1), Expect("scale_up", from_s=70, count=0),
                     Expect("scale_down", count=0), Expect("scale_down", "withheld", gate="stabilisation"),
                     Expect("rebalance", count=0))),
    Scenario("spikes", "idle batch work with 200 ms load spikes every 45 s: never shrinks", 900, lambda t: 600.0,
             workload_class="batch", workload="etl", namespace="jobs",
             spikes_at=tuple(float(x) for x in range(20, 900, 45)),
             expect=(Expect("scale_down", count=0), Expect("scale_down", "withheld", gate="spike"))),
    Scenario("stale", "overload, but node-01's collector is down from 40 s to 150 s and the worker lags "
             "45 s behind from 400 s to 500 s", 600, lambda t: 6500.0 if t < 400 else 13000.0,
             stopped=(("node-01", 40.0, 150.0),), lagged=((400.0, 500.0, 45.0),),
             expect=(Expect("scale_up", to_s=40, count=1), Expect("scale_up", from_s=40, to_s=150, count=0),
                     Expect("scale_up", "withheld", gate="stale_node", from_s=40, to_s=150),
                     Expect("scale_up", from_s=150, to_s=153, count=1),
                     Expect("scale_up", from_s=400, to_s=500, count=0),
                     Expect("scale_up", "withheld", gate="stale_data", from_s=400, to_s=500))),
    Scenario("sla_breach", "quiet until a scale-down, then a surge breaks the latency SLA: rolled back", 900,
             lambda t: 1000.0 if t < 480 else 2900.0, replicas=4,
             expect=(Expect("scale_down", to_s=480, count=1), Expect("rollback", from_s=480, count=1))),
    Scenario("quota", "a surge beyond the namespace's max of 6, then idle down to its min of 3", 2400,
             lambda t: 9000.0 if t < 500 else 300.0, replicas=4, params=_quota(),
             expect=(Expect("scale_up", "withheld", gate="quota_max"), Expect("scale_down", "withheld",
                                                                              gate="quota_min"))),
    Scenario("oscillating", "SM activity alternates between 60% and 15% every 25 s, then every 60 s: FLOPS/W "
             "falls in every low phase, which is physics, not a drift", 900,
             lambda t: (2700.0 if int(t // 25) % 2 == 0 else 700.0) if t < 450 else
             (2700.0 if int(t // 60) % 2 == 0 else 700.0), replicas=4, node_offset=10,
             expect=(Expect("rebalance", count=0), Expect("rebalance", "withheld", count=0))),
    Scenario("load_step", "the load steps down from 65% to 20% SM activity at 300 s and stays there", 900,
             lambda t: 2900.0 if t < 300 else 900.0, replicas=4, node_offset=12,
             expect=(Expect("rebalance", count=0), Expect("rebalance", "withheld", count=0))),
    Scenario("drift", "a steady load; from 400 s the replicas do 25% less tensor work at the same power, twice "
             "within the cooldown: exactly one rebalance", 900, lambda t: 2400.0, replicas=4, node_offset=14,
             drift=((400.0, 460.0, 0.25), (520.0, 560.0, 0.25)),
             expect=(Expect("rebalance", from_s=400, to_s=406, count=1), Expect("rebalance", count=1),
                     Expect("rebalance", "withheld", gate="cooldown", from_s=520, to_s=526, count=1))),
)}
