"""Cluster simulator: deterministic, correlated signal generators for the 23 sensor streams.

Pure: the start time and every parameter are arguments, randomness comes from local
``random.Random`` instances. Each (node, gpu, stream group) owns a generator seeded
from ``(seed, node, gpu, group)`` that produces its samples one by one in time order
and carries its state across ``advance`` calls, so the output does not depend on
where a run is cut. Signals that must agree across groups (training phases, request
bursts, pod restarts, memory growth) come from schedules that every reader rebuilds
from the same seed, or from closed-form functions of time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from random import Random
from typing import Final

from schemas.catalog import HOST_GPU
from schemas.records import UTC_CLOCK, K8sEvent, Labels, SampleBatch

_S: Final = 1_000_000_000
_MIB: Final = 1 << 20
_GB: Final = 1e9
_NEVER: Final = 1 << 62
_THROTTLE_C: Final = 80.0  # reported temperature above which the SM clock steps down


@dataclass(frozen=True, slots=True)
class SimParams:
    """What to simulate; times in UTC nanoseconds, periods in nanoseconds."""

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

NVML_SENSORS: Final = ("gpu_util", "sm_active", "tensor_active", "fb_used", "power", "temperature", "sm_clock",
                       "pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx", "ecc_errors", "xid_errors")
STEP_SENSORS: Final = ("torch_allocated", "torch_reserved", "nccl_allreduce_ms", "nccl_retries",
                       "dataloader_wait_ms")
INFER_SENSORS: Final = ("queue_depth", "request_rate", "request_latency_ms", "torch_allocated", "torch_reserved")
HOST_SENSORS: Final = ("host_cpu_util", "disk_write")
XID_CODES: Final = (13, 13, 31, 31, 43, 48, 63, 79, 94)

_TRAIN_WARMUP_NS: Final = 8 * _S
_INFER_WARMUP_NS: Final = 5 * _S
_RESTART_GAP_NS: Final = 15 * _S

# Training phase kinds, shared by every reader of a node's schedule.
_COMPUTE: Final = 0
_COMM: Final = 1
_STALL: Final = 2
_CKPT: Final = 3


def node_name(i: int) -> str:
    """``node-00``, ``node-01``, ..."""
    return f"node-{i:02d}"


def _clip(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else min(x, hi)


class _TrainPhases:
    """A training node's phase schedule (compute, communication, stalls, checkpoints), built lazily.

    Every reader owns a copy seeded alike, so all copies hold the same segments.
    """

    __slots__ = ("_next_ckpt", "_rng", "end", "kind", "level")

    def __init__(self, seed: str, start_ns: int) -> None:
        self._rng = Random(seed)
        self._next_ckpt = start_ns + int(self._rng.uniform(30.0, 60.0) * _S)
        self.kind = _COMM  # so that the first segment is compute
        self.level = 0.0
        self.end = start_ns
        self._next()

    def seek(self, t_ns: int) -> None:
        while t_ns >= self.end:
            self._next()

    def _next(self) -> None:
        rng = self._rng
        start = self.end
        if self.kind == _COMPUTE:
            kind, lo, hi = (_STALL, 0.5, 3.0) if rng.random() < 0.15 else (_COMM, 0.3, 1.5)
        elif start >= self._next_ckpt:
            kind, lo, hi = _CKPT, 3.0, 8.0
        else:
            kind, lo, hi = _COMPUTE, 2.0, 8.0
        self.end = start + int(rng.uniform(lo, hi) * _S)
        self.level = rng.uniform(0.6, 0.9) if kind == _COMPUTE else rng.uniform(0.5, 1.0)
        if kind == _CKPT:
            self._next_ckpt = self.end + int(rng.uniform(30.0, 60.0) * _S)
        self.kind = kind


class _Bursts:
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
class _Lifecycle:
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
class _Gpu:
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
class _Node:
    name: str
    index: int
    training: bool
    gpus: tuple[_Gpu, ...]
    life: _Lifecycle
    phase_rad: float  # inference: where in its "day" the node's traffic starts
    labels: tuple[Labels, ...]  # per GPU
    host_labels: Labels
    pod: str
    namespace: str
    workload: str


def _make_node(p: SimParams, i: int) -> _Node:
    phys = GPU_PHYSICS.get(p.gpu_model, GPU_PHYSICS["H200"])
    training = i % 2 == 0
    nrng = Random(f"{p.seed}:{i}:node:spec")
    phase_rad = nrng.uniform(0.0, 2 * math.pi)
    node_rate = nrng.uniform(280.0, 420.0)
    pid0 = nrng.randrange(40, 400)
    gpus: list[_Gpu] = []
    for g in range(p.gpus):
        r = Random(f"{p.seed}:{i}:{g}:spec")
        amb = r.uniform(27.0, 33.0)
        # The last slot sits downstream of the others in the airflow: it runs hot and may throttle.
        t_at_tdp = r.uniform(96.0, 100.0) if g == p.gpus - 1 else r.uniform(76.0, 86.0)
        leak = p.leak_mib_per_s if (i, g) == (p.leak_node, p.leak_gpu) else 0.0
        gpus.append(_Gpu(
            idle_w=phys.idle_w * r.uniform(0.95, 1.05), tdp_w=phys.tdp_w, amb_c=amb,
            k_c_per_w=(t_at_tdp - amb) / phys.tdp_w,
            plateau_b=phys.mem_mib * _MIB * (r.uniform(0.70, 0.86) if training else r.uniform(0.80, 0.90)),
            mem_tau_s=r.uniform(15.0, 30.0) if training else r.uniform(1.5, 3.0),
            overhead_mib=r.uniform(600.0, 1100.0), leak_mib_per_s=leak, cap_mib=phys.mem_mib,
            rate_base=node_rate * r.uniform(0.9, 1.1), capacity_rps=r.uniform(600.0, 750.0),
            latency_ms=r.uniform(15.0, 30.0), pid=pid0 + g))
    crash = min(gpu.crash_ns() for gpu in gpus)
    life = _Lifecycle(p.start_ns, _TRAIN_WARMUP_NS if training else _INFER_WARMUP_NS, crash, _RESTART_GAP_NS)
    k = i // 2
    if training:
        pod, ns, wl = f"llm-pretrain-worker-{k}", "ml", "llm-pretrain"
    else:
        pod, ns, wl = f"llm-serve-{k}", "serving", "llm-serve"
    host_labels: Labels = {"gpu_model": p.gpu_model, "region": p.region}
    labels = tuple({**host_labels, "namespace": ns, "pod": pod, "workload": wl,
                    "class": "training" if training else "inference",
                    "rank": k * p.gpus + g if training else g, "pid": gpu.pid} for g, gpu in enumerate(gpus))
    return _Node(node_name(i), i, training, tuple(gpus), life, phase_rad, labels, host_labels, pod, ns, wl)


def _rate(node: _Node, gpu: _Gpu, t_ns: int, p: SimParams, burst: float) -> float:
    """Requests/s routed to ``gpu``: a compressed daily cycle, a faster ripple, bursts."""
    x = 2 * math.pi * ((t_ns - p.start_ns) % p.infer_day_ns) / p.infer_day_ns + node.phase_rad
    return gpu.rate_base * (1.0 + 0.45 * math.sin(x) + 0.08 * math.sin(7.0 * x + 1.3)) * burst


def _emit(out: list[SampleBatch], names: tuple[str, ...], node: str, gpu: str, ts: list[int],
          columns: tuple[list[float], ...], labels: Labels) -> None:
    if not ts:
        return
    for k, (name, values) in enumerate(zip(names, columns, strict=True)):
        out.append(SampleBatch(name, node, gpu, ts if k == 0 else ts.copy(), values, UTC_CLOCK, dict(labels)))


class _Periodic:
    """Shared clock of the fixed-period groups: first sample within one period of start, jittered."""

    __slots__ = ("_jitter", "_nominal", "_period", "next_ts", "rng")

    def __init__(self, seed: str, start_ns: int, period_ns: int, jitter_ns: int) -> None:
        self.rng = Random(seed)
        self._period = period_ns
        self._jitter = jitter_ns
        self._nominal = start_ns + jitter_ns + self.rng.randrange(period_ns - 2 * jitter_ns)
        self.next_ts = 0
        self.tick()

    def tick(self) -> None:
        """Move to the next sample time."""
        self.next_ts = self._nominal + int((2.0 * self.rng.random() - 1.0) * self._jitter)
        self._nominal += self._period


class _NvmlGen(_Periodic):
    """Sensors 0..12 of one GPU."""

    __slots__ = ("_a_power", "_a_temp", "_bursts", "_clock", "_ecc", "_gpu", "_node", "_p", "_p_ecc",
                 "_p_reset", "_p_xid", "_phases", "_phys", "_power", "_temp")

    def __init__(self, p: SimParams, node: _Node, g: int) -> None:
        super().__init__(f"{p.seed}:{node.index}:{g}:nvml", p.start_ns, p.nvml_period_ns, p.jitter_ns)
        self._p, self._node, self._gpu = p, node, node.gpus[g]
        self._phys = GPU_PHYSICS.get(p.gpu_model, GPU_PHYSICS["H200"])
        self._phases = _TrainPhases(f"{p.seed}:{node.index}:phases", p.start_ns)
        self._bursts = _Bursts(f"{p.seed}:{node.index}:bursts", p.start_ns)
        dt = p.nvml_period_ns / _S
        self._a_power = 1.0 - math.exp(-dt / 0.5)  # power settles within ~1 s
        self._a_temp = 1.0 - math.exp(-dt / 25.0)  # the heat sink takes ~1 min
        gpu = self._gpu
        self._power = gpu.idle_w
        self._temp = gpu.amb_c + gpu.k_c_per_w * gpu.idle_w + 8.0
        self._clock = self._phys.max_clock_mhz
        self._ecc = 0.0
        # Per-sample probabilities, cumulative: an ECC error every ~1.4 h of a GPU's 100 ms samples,
        # an XID every ~2.8 h, a driver reload (counter reset) every ~140 h.
        self._p_ecc = 2e-5 * p.fault_scale
        self._p_reset = self._p_ecc + 2e-7 * p.fault_scale
        self._p_xid = self._p_reset + 1e-5 * p.fault_scale

    def run(self, until_ns: int, out: list[SampleBatch], gid: str) -> None:
        if self.next_ts >= until_ns:
            return
        ts: list[int] = []
        cols: tuple[list[float], ...] = tuple([] for _ in NVML_SENSORS)
        gu, sm, te, fb, pw, tc, ck, ptx, prx, ntx, nrx, ecc, xid = cols
        rng = self.rng
        rnd, gauss = rng.random, rng.gauss
        p, node, gpu, phys = self._p, self._node, self._gpu, self._phys
        life, phases, bursts, training = node.life, self._phases, self._bursts, node.training
        idle, span, tdp = gpu.idle_w, gpu.tdp_w - gpu.idle_w, gpu.tdp_w
        max_clk, min_clk = phys.max_clock_mhz, phys.min_clock_mhz
        a_p, a_t, amb, k_c = self._a_power, self._a_temp, gpu.amb_c, gpu.k_c_per_w
        power, temp, clock, ecc_n = self._power, self._temp, self._clock, self._ecc
        p_ecc, p_reset, p_xid = self._p_ecc, self._p_reset, self._p_xid
        t = self.next_ts
        while t < until_ns:
            rel = life.rel(t)
            if rel < 0:  # pod down: nothing on the GPU
                tensor, smv, fbv = 0.0, 0.0, 0.0
                ptxv, prxv, nvl = 2e5 * rnd(), 2e5 * rnd(), 0.0
            else:
                fbv = gpu.memory(rel)[1]
                if rel < life.warmup_ns:  # loading weights: host-to-device copies, little compute
                    tensor, smv = 0.01 * rnd(), 0.03 + 0.05 * rnd()
                    prxv, ptxv, nvl = (8.0 + 12.0 * rnd()) * _GB, 0.3 * _GB * rnd(), (1.0 + 4.0 * rnd()) * _GB
                elif training:
                    phases.seek(t)
                    kind, lvl = phases.kind, phases.level
                    if kind == _COMPUTE:
                        tensor = lvl + 0.04 * gauss()
                        smv = tensor + 0.06 + 0.06 * rnd()
                        prxv, ptxv, nvl = (1.0 + 3.0 * rnd()) * _GB, (0.2 + 0.8 * rnd()) * _GB, (10 + 30 * rnd()) * _GB
                    elif kind == _COMM:
                        tensor, smv = 0.05 + 0.15 * rnd(), 0.30 + 0.15 * rnd()
                        prxv = ptxv = lvl * (15.0 + 25.0 * rnd()) * _GB
                        nvl = lvl * (250.0 + 150.0 * rnd()) * _GB
                    elif kind == _STALL:
                        tensor = 0.03 * rnd()
                        smv = tensor + 0.02 + 0.05 * rnd()
                        prxv, ptxv, nvl = (0.5 + 1.5 * rnd()) * _GB, 0.1 * _GB * rnd(), (0.1 + 0.9 * rnd()) * _GB
                    else:  # checkpoint: device-to-host copies of the weights
                        tensor, smv = 0.02 * rnd(), 0.05 + 0.05 * rnd()
                        ptxv, prxv, nvl = lvl * (15.0 + 30.0 * rnd()) * _GB, 0.2 * _GB * rnd(), _GB * rnd()
                else:
                    bursts.seek(t)
                    load = _rate(node, gpu, t, p, bursts.level) / gpu.capacity_rps
                    load = min(load, 1.0)
                    tensor = 0.85 * load + 0.03 * gauss()
                    smv = tensor + 0.08 + 0.07 * load * rnd()
                    prxv, ptxv = (0.2 + 1.3 * rnd()) * load * _GB, (0.1 + 0.6 * rnd()) * load * _GB
                    nvl = (20.0 + 40.0 * rnd()) * load * _GB
            tensor = _clip(tensor, 0.0, 1.0)
            smv = _clip(smv, tensor, 1.0)
            f = clock / max_clk
            # Dynamic power rises steeply at low activity and flattens near TDP; it scales ~f^2 with the clock.
            target = idle + span * (0.4 * smv + 0.6 * tensor) ** 0.6 * f * f + 6.0 * gauss()
            power += (target - power) * a_p
            temp += (amb + k_c * power - temp) * a_t
            temp_rep = float(round(temp))
            clock = max_clk if temp_rep <= _THROTTLE_C else max(min_clk, max_clk - 45.0 * (temp_rep - _THROTTLE_C))
            u = rnd()
            xid_code = 0.0
            if u < p_ecc:
                ecc_n += 1.0
            elif u < p_reset:
                ecc_n = 0.0  # driver reload resets the volatile counters
            elif u < p_xid:
                xid_code = float(XID_CODES[int(rnd() * len(XID_CODES))])
                if xid_code in (48.0, 94.0):
                    ecc_n += 1.0
            ts.append(t)
            gu.append(_clip(float(round(110.0 * smv + 1.5 * gauss())), 0.0, 100.0))
            sm.append(smv)
            te.append(tensor)
            fb.append(fbv)
            pw.append(_clip(power + 2.0 * gauss(), 0.5 * idle, 1.05 * tdp))
            tc.append(_clip(temp_rep, -40.0, 150.0))
            ck.append(clock)
            ptx.append(ptxv)
            prx.append(prxv)
            ntx.append(nvl)
            nrx.append(nvl * (0.9 + 0.2 * rnd()))
            ecc.append(ecc_n)
            xid.append(xid_code)
            self.tick()
            t = self.next_ts
        self._power, self._temp, self._clock, self._ecc = power, temp, clock, ecc_n
        _emit(out, NVML_SENSORS, node.name, gid, ts, cols, node.labels[int(gid)])


class _StepGen:
    """Framework per-step streams of one training rank; steps pause during warm-up, checkpoints, restarts."""

    __slots__ = ("_gpu", "_jitter", "_node", "_period", "_phases", "_retries", "next_ts", "rng")

    def __init__(self, p: SimParams, node: _Node, g: int) -> None:
        self.rng = Random(f"{p.seed}:{node.index}:{g}:step")
        self._node, self._gpu = node, node.gpus[g]
        self._period, self._jitter = p.step_period_ns, max(p.jitter_ns, 1)
        self._phases = _TrainPhases(f"{p.seed}:{node.index}:phases", p.start_ns)
        self._retries = 0.0
        self.next_ts = p.start_ns + self.rng.randrange(p.step_period_ns)

    def run(self, until_ns: int, out: list[SampleBatch], gid: str) -> None:
        if self.next_ts >= until_ns:
            return
        ts: list[int] = []
        cols: tuple[list[float], ...] = tuple([] for _ in STEP_SENSORS)
        alloc_c, res_c, ar_c, retry_c, wait_c = cols
        rnd, gauss, rint = self.rng.random, self.rng.gauss, self.rng.randrange
        life, phases, gpu, period, jitter = self._node.life, self._phases, self._gpu, self._period, self._jitter
        retries = self._retries
        t = self.next_ts
        while t < until_ns:
            rel = life.rel(t)
            if rel < life.warmup_ns:  # warming up or down
                t = life.next_run(t) + rint(jitter)
                continue
            phases.seek(t)
            kind, lvl = phases.kind, phases.level
            if kind == _CKPT:  # the loop blocks on the checkpoint write
                t = phases.end + rint(jitter)
                continue
            reserved = gpu.memory(rel)[0]
            if kind == _COMM:
                ar_ms, p_retry = math.exp(2.3 + 0.25 * gauss()), 0.02
            else:
                ar_ms, p_retry = math.exp(1.5 + 0.35 * gauss()), 0.002
            if rnd() < 0.01:  # a slow collective: congestion, a straggler
                ar_ms *= 4.0 + 11.0 * rnd()
                p_retry = 0.2
            if rnd() < p_retry:
                retries += float(1 + rint(4))
            wait_ms = lvl * (150.0 + 750.0 * rnd()) if kind == _STALL else -2.0 * math.log(1.0 - rnd())
            ts.append(t)
            alloc_c.append(float(int(reserved * (0.62 + 0.3 * rnd())) & ~511))
            res_c.append(reserved)
            ar_c.append(ar_ms)
            retry_c.append(retries)
            wait_c.append(wait_ms)
            t += int(period * (0.9 + 0.2 * rnd()) + (wait_ms + max(0.0, ar_ms - 8.0)) * 1e6)
        self.next_ts, self._retries = t, retries
        _emit(out, STEP_SENSORS, self._node.name, gid, ts, cols, self._node.labels[int(gid)])


class _InferGen(_Periodic):
    """Inference-server streams of one GPU; silent while the server is down or loading."""

    __slots__ = ("_backlog", "_bursts", "_dt_s", "_gpu", "_node", "_p")

    def __init__(self, p: SimParams, node: _Node, g: int) -> None:
        super().__init__(f"{p.seed}:{node.index}:{g}:infer", p.start_ns, p.infer_period_ns, p.jitter_ns)
        self._p, self._node, self._gpu = p, node, node.gpus[g]
        self._bursts = _Bursts(f"{p.seed}:{node.index}:bursts", p.start_ns)
        self._dt_s = p.infer_period_ns / _S
        self._backlog = 0.0

    def run(self, until_ns: int, out: list[SampleBatch], gid: str) -> None:
        if self.next_ts >= until_ns:
            return
        ts: list[int] = []
        cols: tuple[list[float], ...] = tuple([] for _ in INFER_SENSORS)
        q_c, rate_c, lat_c, alloc_c, res_c = cols
        rnd, gauss = self.rng.random, self.rng.gauss
        p, node, gpu, bursts, life, dt = self._p, self._node, self._gpu, self._bursts, self._node.life, self._dt_s
        cap = gpu.capacity_rps
        backlog = self._backlog
        t = self.next_ts
        while t < until_ns:
            rel = life.rel(t)
            if rel < life.warmup_ns:
                backlog = 0.0
                self.tick()
                t = self.next_ts
                continue
            bursts.seek(t)
            rate = _rate(node, gpu, t, p, bursts.level)
            # Requests above capacity queue up; a full queue sheds load.
            backlog = _clip(backlog + (rate - cap) * dt, 0.0, 8.0 * cap)
            load = min(1.0, rate / cap)
            reserved = gpu.memory(rel)[0]
            ts.append(t)
            q_c.append(float(round(backlog + rate * 0.03 * (0.7 + 0.6 * rnd()))))
            rate_c.append(max(0.0, rate * (1.0 + 0.04 * gauss())))
            lat_c.append(gpu.latency_ms * (1.0 + 3.0 * load ** 3) + 1000.0 * backlog / cap + 2.0 * abs(gauss()))
            alloc_c.append(float(int(reserved * (0.55 + 0.4 * load) * (0.97 + 0.03 * rnd())) & ~511))
            res_c.append(reserved)
            self.tick()
            t = self.next_ts
        self._backlog = backlog
        _emit(out, INFER_SENSORS, node.name, gid, ts, cols, node.labels[int(gid)])


class _HostGen(_Periodic):
    """host_cpu_util and disk_write of one node: dataloader stalls load the CPU, checkpoints the disk."""

    __slots__ = ("_bursts", "_node", "_p", "_phases")

    def __init__(self, p: SimParams, node: _Node) -> None:
        super().__init__(f"{p.seed}:{node.index}:host:host", p.start_ns, p.host_period_ns, p.jitter_ns)
        self._p, self._node = p, node
        self._phases = _TrainPhases(f"{p.seed}:{node.index}:phases", p.start_ns)
        self._bursts = _Bursts(f"{p.seed}:{node.index}:bursts", p.start_ns)

    def run(self, until_ns: int, out: list[SampleBatch]) -> None:
        if self.next_ts >= until_ns:
            return
        ts: list[int] = []
        cpu_c: list[float] = []
        disk_c: list[float] = []
        rnd, gauss = self.rng.random, self.rng.gauss
        p, node, phases, bursts = self._p, self._node, self._phases, self._bursts
        life, gpu0 = node.life, node.gpus[0]
        t = self.next_ts
        while t < until_ns:
            rel = life.rel(t)
            disk = (0.5 + 19.5 * rnd()) * 1e6  # logs, metrics
            if rel < 0:
                cpu, disk = 2.0 + 3.0 * rnd(), disk * 0.1
            elif rel < life.warmup_ns:
                cpu = 50.0 + 20.0 * rnd()
            elif node.training:
                phases.seek(t)
                kind = phases.kind
                if kind == _STALL:
                    cpu = 85.0 + 13.0 * rnd()
                elif kind == _CKPT:
                    cpu, disk = 40.0 + 20.0 * rnd(), phases.level * (2.0 + 4.0 * rnd()) * _GB
                else:
                    cpu = 22.0 + 16.0 * rnd()
            else:
                bursts.seek(t)
                cpu = 8.0 + 40.0 * min(1.0, _rate(node, gpu0, t, p, bursts.level) / gpu0.capacity_rps)
            ts.append(t)
            cpu_c.append(_clip(round(cpu + 1.5 * gauss(), 1), 0.0, 100.0))
            disk_c.append(disk)
            self.tick()
            t = self.next_ts
        _emit(out, HOST_SENSORS, node.name, HOST_GPU, ts, (cpu_c, disk_c), node.host_labels)


def _pod_events(node: _Node, lo_ns: int, hi_ns: int) -> list[K8sEvent]:
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


class ClusterSimulator:
    """Every sample of a simulated cluster, in event-time slices.

    Even nodes train (phases of compute, communication, dataloader stalls,
    checkpoints), odd nodes serve inference (a daily request cycle with bursts).
    The output is the same whatever the slicing.

    Examples
    --------
    >>> sim = ClusterSimulator(SimParams(nodes=2, gpus=1, seed=7))
    >>> batches = sim.advance(sim.params.start_ns + 20_000_000_000)
    >>> len({b.sensor for b in batches})
    23
    >>> [e.reason for e in sim.k8s_events()]
    ['Scheduled', 'Scheduled', 'Started', 'Started']
    """

    def __init__(self, params: SimParams) -> None:
        self.params = params
        self._now = params.start_ns
        self._nodes = [_make_node(params, i) for i in range(params.nodes)]
        self._gpu_gens: list[tuple[str, _NvmlGen | _StepGen | _InferGen]] = []
        self._host_gens: list[_HostGen] = []
        for node in self._nodes:
            for g in range(params.gpus):
                self._gpu_gens.append((str(g), _NvmlGen(params, node, g)))
                side = _StepGen(params, node, g) if node.training else _InferGen(params, node, g)
                self._gpu_gens.append((str(g), side))
            self._host_gens.append(_HostGen(params, node))
        self._events: list[K8sEvent] = []

    @property
    def now_ns(self) -> int:
        """Where the last ``advance`` stopped (exclusive): the next sample's time is >= this."""
        return self._now

    def advance(self, until_ns: int) -> list[SampleBatch]:
        """Every sample with event time in [previous until, until_ns), one batch per (sensor, node, gpu)."""
        if until_ns < self._now:
            raise ValueError(f"advance to {until_ns} is before {self._now}")
        out: list[SampleBatch] = []
        for gid, gen in self._gpu_gens:
            gen.run(until_ns, out, gid)
        for host in self._host_gens:
            host.run(until_ns, out)
        events = [e for node in self._nodes for e in _pod_events(node, self._now, until_ns)]
        events.sort(key=lambda e: (e.ts_ns, e.node))
        self._events = events
        self._now = until_ns
        return out

    def k8s_events(self) -> list[K8sEvent]:
        """Kubernetes events with time in the interval of the last ``advance``, by time."""
        return list(self._events)
