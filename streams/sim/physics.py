"""The simulated cluster's physics: parameters, GPU figures, node specs and shared schedules.

Signals that must agree across stream groups (training phases, request bursts, pod
restarts, memory growth) live here, as schedules every reader rebuilds from the same
seed or as closed-form functions of time; the per-source generators read them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from random import Random
from typing import Final

from schemas.records import K8sEvent, Labels

_S: Final = 1_000_000_000
_MIB: Final = 1 << 20
_NEVER: Final = 1 << 62
THROTTLE_C: Final = 80.0  # reported temperature above which the SM clock steps down


@dataclass(frozen=True, slots=True)
class SimParams:
    """What to simulate; times in UTC nanoseconds, periods in nanoseconds.

    >>> SimParams(nodes=4, gpus=8).nodes * SimParams(nodes=4, gpus=8).gpus
    32
    >>> SimParams(nodes=0)
    Traceback (most recent call last):
    ...
    ValueError: nodes and gpus must be >= 1
    """

    nodes: int = 2
    gpus: int = 2  # GPUs per node
    seed: int = 0
    start_ns: int = 1_796_200_000_000_000_000  # event time of the first sample (UTC ns)
    nvml_period_ns: int = 100_000_000  # NVML/DCGM streams (sensors 0..12)
    host_period_ns: int = 1_000_000_000  # host_cpu_util, disk_write (gpu="host")
    step_period_ns: int = 250_000_000  # framework per-step streams: mean step time, jittered per step
    infer_period_ns: int = 1_000_000_000  # inference-server streams
    jitter_ns: int = 2_000_000  # timestamp jitter (+-), deterministic
    gpu_model: str = "H200"  # a label; physics from GPU_PHYSICS (H200 figures for a model not listed)
    region: str = "us-east"
    infer_day_ns: int = 600 * _S  # period of the request-rate cycle: a "day" compressed to 10 min
    leak_mib_per_s: float = 0.0  # > 0: fb_used of (leak_node, leak_gpu) grows until OOMKilled, pod restarts
    leak_node: int = 0
    leak_gpu: int = 0
    fault_scale: float = 1.0  # multiplies the (rare) rates of ECC errors, ECC resets and XID errors
    # True: GPUs work at one steady level (training without comm/stall/checkpoint phases,
    # inference at a constant load), so efficiency changes come only from a scenario's events:
    # what the detection tests, benchmarks and demo measure against.
    steady: bool = False

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus < 1:
            raise ValueError("nodes and gpus must be >= 1")
        if self.jitter_ns < 0 or self.step_period_ns <= 0 or self.infer_day_ns <= 0:
            raise ValueError("jitter_ns must be >= 0, step_period_ns and infer_day_ns > 0")
        for period in (self.nvml_period_ns, self.host_period_ns, self.infer_period_ns):
            if period <= 2 * self.jitter_ns:
                raise ValueError("every sampling period must exceed 2 * jitter_ns")
        if self.leak_mib_per_s < 0 or not math.isfinite(self.leak_mib_per_s):
            raise ValueError("leak_mib_per_s must be finite and >= 0")
        if not 0.0 <= self.fault_scale <= 1000.0:
            raise ValueError("fault_scale must be in [0, 1000]")
        if self.leak_mib_per_s > 0 and not (0 <= self.leak_node < self.nodes and 0 <= self.leak_gpu < self.gpus):
            raise ValueError("leak_node / leak_gpu out of range")


@dataclass(frozen=True, slots=True)
class GpuPhysics:
    """Physical figures of a GPU model as the simulator uses them (not the price book)."""

    tdp_w: float
    idle_w: float
    mem_mib: float
    max_clock_mhz: float
    min_clock_mhz: float


GPU_PHYSICS: Final[dict[str, GpuPhysics]] = {
    "H200": GpuPhysics(700.0, 90.0, 143_771.0, 1980.0, 1410.0),
    "H100": GpuPhysics(700.0, 85.0, 81_559.0, 1980.0, 1410.0),
    "A100": GpuPhysics(400.0, 60.0, 81_920.0, 1410.0, 1095.0),
}


_TRAIN_WARMUP_NS: Final = 8 * _S
_INFER_WARMUP_NS: Final = 5 * _S
_RESTART_GAP_NS: Final = 15 * _S

# Training phase kinds, shared by every reader of a node's schedule.
COMPUTE: Final = 0
COMM: Final = 1
STALL: Final = 2
CKPT: Final = 3


def node_name(i: int) -> str:
    """``node-00``, ``node-01``, ..."""
    return f"node-{i:02d}"


def clip(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else min(x, hi)


class TrainPhases:
    """A training node's phase schedule (compute, communication, stalls, checkpoints), built lazily.

    Every reader owns a copy seeded alike, so all copies hold the same segments.
    """

    __slots__ = ("_next_ckpt", "_rng", "end", "kind", "level")

    def __init__(self, seed: str, start_ns: int) -> None:
        self._rng = Random(seed)
        self._next_ckpt = start_ns + int(self._rng.uniform(30.0, 60.0) * _S)
        self.kind = COMM  # so that the first segment is compute
        self.level = 0.0
        self.end = start_ns
        self._next()

    def seek(self, t_ns: int) -> None:
        while t_ns >= self.end:
            self._next()

    def _next(self) -> None:
        rng = self._rng
        start = self.end
        if self.kind == COMPUTE:
            kind, lo, hi = (STALL, 0.5, 3.0) if rng.random() < 0.15 else (COMM, 0.3, 1.5)
        elif start >= self._next_ckpt:
            kind, lo, hi = CKPT, 3.0, 8.0
        else:
            kind, lo, hi = COMPUTE, 2.0, 8.0
        self.end = start + int(rng.uniform(lo, hi) * _S)
        self.level = rng.uniform(0.6, 0.9) if kind == COMPUTE else rng.uniform(0.5, 1.0)
        if kind == CKPT:
            self._next_ckpt = self.end + int(rng.uniform(30.0, 60.0) * _S)
        self.kind = kind


class Bursts:
    """An inference node's traffic multiplier: calm stretches and short bursts, built lazily."""

    __slots__ = ("_rng", "end", "level")

    def __init__(self, seed: str, start_ns: int) -> None:
        self._rng = Random(seed)
        self.level = 1.5  # marks "in a burst", so the first segment is calm
        self.end = start_ns
        self._next()

    def seek(self, t_ns: int) -> None:
        while t_ns >= self.end:
            self._next()

    def _next(self) -> None:
        rng = self._rng
        if self.level > 1.0:
            self.level, dur = 1.0, rng.uniform(20.0, 120.0)
        else:
            self.level, dur = rng.uniform(1.3, 2.0), rng.uniform(3.0, 20.0)
        self.end += int(dur * _S)


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """A node's pod epochs, periodic and closed-form: warm-up, run, OOM at ``crash_ns``, restart gap."""

    start_ns: int
    warmup_ns: int
    crash_ns: int  # time from epoch start to the OOM kill; _NEVER without a leak
    gap_ns: int

    @property
    def cycle_ns(self) -> int:
        return self.crash_ns + self.gap_ns

    def rel(self, t_ns: int) -> int:
        """Time since the current epoch started, or -1 while the pod is down."""
        d = t_ns - self.start_ns
        if self.crash_ns != _NEVER:
            d %= self.cycle_ns
            if d >= self.crash_ns:
                return -1
        return d

    def next_run(self, t_ns: int) -> int:
        """The first time >= t_ns at which the pod is past its warm-up (maybe in a later epoch)."""
        d = t_ns - self.start_ns
        if self.crash_ns == _NEVER:
            return t_ns if d >= self.warmup_ns else self.start_ns + self.warmup_ns
        k, r = divmod(d, self.cycle_ns)
        if r < self.warmup_ns:
            return t_ns + self.warmup_ns - r
        if r >= self.crash_ns:
            return self.start_ns + (k + 1) * self.cycle_ns + self.warmup_ns
        return t_ns


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Fixed traits of one GPU and its process, drawn once from (seed, node, gpu, "spec")."""

    idle_w: float
    tdp_w: float
    amb_c: float
    k_c_per_w: float
    plateau_b: float  # torch_reserved plateau
    mem_tau_s: float
    overhead_mib: float  # CUDA context, NCCL buffers: fb_used above torch_reserved
    leak_mib_per_s: float
    cap_mib: float
    rate_base: float  # inference: mean requests/s routed to this GPU
    capacity_rps: float
    latency_ms: float
    pid: int

    def memory(self, rel_ns: int) -> tuple[float, float]:
        """(torch_reserved bytes, fb_used MiB) ``rel_ns`` after the process started."""
        s = rel_ns / _S
        reserved = float(int(self.plateau_b * (1.0 - math.exp(-s / self.mem_tau_s))) // (2 * _MIB) * (2 * _MIB))
        fb = float(int(reserved / _MIB + self.overhead_mib + self.leak_mib_per_s * s))
        return reserved, min(fb, self.cap_mib)

    def crash_ns(self) -> int:
        """Time from process start until fb_used reaches the card's memory (_NEVER without a leak)."""
        if self.leak_mib_per_s <= 0.0:
            return _NEVER
        plateau_mib = self.plateau_b / _MIB

        def used(s: float) -> float:
            return self.overhead_mib + plateau_mib * (1.0 - math.exp(-s / self.mem_tau_s)) + self.leak_mib_per_s * s

        lo, hi = 0.0, (self.cap_mib - self.overhead_mib) / self.leak_mib_per_s
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if used(mid) < self.cap_mib else (lo, mid)
        return max(1, math.ceil(hi * _S))


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """Fixed traits of one node: its GPUs, pod lifecycle and the labels its streams carry."""

    name: str
    index: int
    training: bool
    gpus: tuple[GpuSpec, ...]
    life: Lifecycle
    phase_rad: float  # inference: where in its "day" the node's traffic starts
    labels: tuple[Labels, ...]  # per GPU
    host_labels: Labels
    pod: str
    namespace: str
    workload: str


def make_node(p: SimParams, i: int) -> NodeSpec:
    """Node ``i``, drawn from ``(seed, i)``: even nodes train, odd nodes serve inference."""
    phys = GPU_PHYSICS.get(p.gpu_model, GPU_PHYSICS["H200"])
    training = i % 2 == 0
    nrng = Random(f"{p.seed}:{i}:node:spec")
    phase_rad = nrng.uniform(0.0, 2 * math.pi)
    node_rate = nrng.uniform(280.0, 420.0)
    pid0 = nrng.randrange(40, 400)
    gpus: list[GpuSpec] = []
    for g in range(p.gpus):
        r = Random(f"{p.seed}:{i}:{g}:spec")
        amb = r.uniform(27.0, 33.0)
        # The last slot sits downstream of the others in the airflow: it runs hot and may throttle.
        t_at_tdp = r.uniform(96.0, 100.0) if g == p.gpus - 1 else r.uniform(76.0, 86.0)
        leak = p.leak_mib_per_s if (i, g) == (p.leak_node, p.leak_gpu) else 0.0
        gpus.append(GpuSpec(
            idle_w=phys.idle_w * r.uniform(0.95, 1.05), tdp_w=phys.tdp_w, amb_c=amb,
            k_c_per_w=(t_at_tdp - amb) / phys.tdp_w,
            plateau_b=phys.mem_mib * _MIB * (r.uniform(0.70, 0.86) if training else r.uniform(0.80, 0.90)),
            mem_tau_s=r.uniform(15.0, 30.0) if training else r.uniform(1.5, 3.0),
            overhead_mib=r.uniform(600.0, 1100.0), leak_mib_per_s=leak, cap_mib=phys.mem_mib,
            rate_base=node_rate * r.uniform(0.9, 1.1), capacity_rps=r.uniform(600.0, 750.0),
            latency_ms=r.uniform(15.0, 30.0), pid=pid0 + g))
    crash = min(gpu.crash_ns() for gpu in gpus)
    life = Lifecycle(p.start_ns, _TRAIN_WARMUP_NS if training else _INFER_WARMUP_NS, crash, _RESTART_GAP_NS)
    k = i // 2
    if training:
        pod, ns, wl = f"llm-pretrain-worker-{k}", "ml", "llm-pretrain"
    else:
        pod, ns, wl = f"llm-serve-{k}", "serving", "llm-serve"
    host_labels: Labels = {"gpu_model": p.gpu_model, "region": p.region}
    labels = tuple({**host_labels, "namespace": ns, "pod": pod, "workload": wl,
                    "class": "training" if training else "inference",
                    "rank": k * p.gpus + g if training else g, "pid": gpu.pid} for g, gpu in enumerate(gpus))
    return NodeSpec(node_name(i), i, training, tuple(gpus), life, phase_rad, labels, host_labels, pod, ns, wl)


def request_rate(node: NodeSpec, gpu: GpuSpec, t_ns: int, p: SimParams, burst: float) -> float:
    """Requests/s routed to ``gpu``: a compressed daily cycle, a faster ripple, bursts."""
    x = 2 * math.pi * ((t_ns - p.start_ns) % p.infer_day_ns) / p.infer_day_ns + node.phase_rad
    return gpu.rate_base * (1.0 + 0.45 * math.sin(x) + 0.08 * math.sin(7.0 * x + 1.3)) * burst


def pod_events(node: NodeSpec, lo_ns: int, hi_ns: int) -> list[K8sEvent]:
    """The pod's Scheduled / Started / OOMKilled / BackOff events with time in [lo_ns, hi_ns)."""
    life = node.life
    gpus = tuple(str(g) for g in range(len(node.gpus)))
    found: list[K8sEvent] = []

    def add(ts: int, typ: str, reason: str, message: str) -> None:
        if lo_ns <= ts < hi_ns:
            found.append(K8sEvent(node.name, ts, typ, reason, "Pod", node.namespace, node.pod, node.workload,
                                  gpus, message))

    add(life.start_ns, "Normal", "Scheduled", f"Successfully assigned {node.namespace}/{node.pod} to {node.name}")
    if life.crash_ns == _NEVER:
        add(life.start_ns + _S, "Normal", "Started", f"Started container {node.workload}")
        return found
    # Every event of epoch k lies in [s_k, s_k + crash + 1 s], before the next epoch starts.
    leaker = max(range(len(node.gpus)), key=lambda g: node.gpus[g].leak_mib_per_s)
    cycle = life.cycle_ns
    s = life.start_ns + max(0, (lo_ns - life.start_ns) // cycle) * cycle
    while s < hi_ns:
        crash = s + life.crash_ns
        add(s + _S, "Normal", "Started", f"Started container {node.workload}")
        add(crash, "Warning", "OOMKilled", f"CUDA out of memory on GPU {leaker}: fb_used reached "
            f"{node.gpus[leaker].cap_mib:.0f} MiB; container {node.workload} killed")
        add(crash + _S, "Warning", "BackOff", f"Back-off restarting failed container {node.workload}")
        s += cycle
    return found
