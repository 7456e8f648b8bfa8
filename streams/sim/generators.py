"""Per-source signal generators of the simulated cluster: NVML, framework steps, inference server, host.

Each (node, gpu, stream group) owns a generator seeded from ``(seed, node, gpu, group)``
that produces its samples one by one in time order and carries its state across
``run`` calls, so the output does not depend on where a run is cut.

>>> from streams.sim.physics import make_node
>>> p = SimParams(nodes=1, gpus=1)
>>> out: list[SampleBatch] = []
>>> NvmlGen(p, make_node(p, 0), 0).run(p.start_ns + 1_000_000_000, out, "0")
>>> [b.sensor for b in out] == list(NVML_SENSORS), len(out[0])
(True, 10)
"""

from __future__ import annotations

import math
from random import Random
from typing import Final

from schemas.catalog import HOST_GPU
from schemas.records import UTC_CLOCK, Labels, SampleBatch
from streams.sim.physics import (
    CKPT,
    COMM,
    COMPUTE,
    GPU_PHYSICS,
    STALL,
    THROTTLE_C,
    Bursts,
    NodeSpec,
    SimParams,
    TrainPhases,
    clip,
    request_rate,
)

_S: Final = 1_000_000_000
_GB: Final = 1e9

NVML_SENSORS: Final = ("gpu_util", "sm_active", "tensor_active", "fb_used", "power", "temperature", "sm_clock",
                       "pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx", "ecc_errors", "xid_errors")
STEP_SENSORS: Final = ("torch_allocated", "torch_reserved", "nccl_allreduce_ms", "nccl_retries",
                       "dataloader_wait_ms")
INFER_SENSORS: Final = ("queue_depth", "request_rate", "request_latency_ms", "torch_allocated", "torch_reserved")
HOST_SENSORS: Final = ("host_cpu_util", "disk_write")
XID_CODES: Final = (13, 13, 31, 31, 43, 48, 63, 79, 94)


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


class NvmlGen(_Periodic):
    """Sensors 0..12 of one GPU."""

    __slots__ = ("_a_power", "_a_temp", "_bursts", "_clock", "_ecc", "_gpu", "_node", "_p", "_p_ecc",
                 "_p_reset", "_p_xid", "_phases", "_phys", "_power", "_temp")

    def __init__(self, p: SimParams, node: NodeSpec, g: int) -> None:
        super().__init__(f"{p.seed}:{node.index}:{g}:nvml", p.start_ns, p.nvml_period_ns, p.jitter_ns)
        self._p, self._node, self._gpu = p, node, node.gpus[g]
        self._phys = GPU_PHYSICS.get(p.gpu_model, GPU_PHYSICS["H200"])
        self._phases = TrainPhases(f"{p.seed}:{node.index}:phases", p.start_ns)
        self._bursts = Bursts(f"{p.seed}:{node.index}:bursts", p.start_ns)
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
                    if p.steady:
                        kind, lvl = COMPUTE, 0.6  # gpu_util ~75%: clear of the 95% spike rule
                    else:
                        phases.seek(t)
                        kind, lvl = phases.kind, phases.level
                    if kind == COMPUTE:
                        tensor = lvl + 0.04 * gauss()
                        smv = tensor + 0.06 + 0.06 * rnd()
                        prxv, ptxv, nvl = (1.0 + 3.0 * rnd()) * _GB, (0.2 + 0.8 * rnd()) * _GB, (10 + 30 * rnd()) * _GB
                    elif kind == COMM:
                        tensor, smv = 0.05 + 0.15 * rnd(), 0.30 + 0.15 * rnd()
                        prxv = ptxv = lvl * (15.0 + 25.0 * rnd()) * _GB
                        nvl = lvl * (250.0 + 150.0 * rnd()) * _GB
                    elif kind == STALL:
                        tensor = 0.03 * rnd()
                        smv = tensor + 0.02 + 0.05 * rnd()
                        prxv, ptxv, nvl = (0.5 + 1.5 * rnd()) * _GB, 0.1 * _GB * rnd(), (0.1 + 0.9 * rnd()) * _GB
                    else:  # checkpoint: device-to-host copies of the weights
                        tensor, smv = 0.02 * rnd(), 0.05 + 0.05 * rnd()
                        ptxv, prxv, nvl = lvl * (15.0 + 30.0 * rnd()) * _GB, 0.2 * _GB * rnd(), _GB * rnd()
                else:
                    bursts.seek(t)
                    load = 0.65 if p.steady else request_rate(node, gpu, t, p, bursts.level) / gpu.capacity_rps
                    load = min(load, 1.0)
                    tensor = 0.85 * load + 0.03 * gauss()
                    smv = tensor + 0.08 + 0.07 * load * rnd()
                    prxv, ptxv = (0.2 + 1.3 * rnd()) * load * _GB, (0.1 + 0.6 * rnd()) * load * _GB
                    nvl = (20.0 + 40.0 * rnd()) * load * _GB
            tensor = clip(tensor, 0.0, 1.0)
            smv = clip(smv, tensor, 1.0)
            f = clock / max_clk
            # Dynamic power rises steeply at low activity and flattens near TDP; it scales ~f^2 with the clock.
            target = idle + span * (0.4 * smv + 0.6 * tensor) ** 0.6 * f * f + 6.0 * gauss()
            power += (target - power) * a_p
            temp += (amb + k_c * power - temp) * a_t
            temp_rep = float(round(temp))
            clock = max_clk if temp_rep <= THROTTLE_C else max(min_clk, max_clk - 45.0 * (temp_rep - THROTTLE_C))
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
            gu.append(clip(float(round(110.0 * smv + 1.5 * gauss())), 0.0, 100.0))
            sm.append(smv)
            te.append(tensor)
            fb.append(fbv)
            pw.append(clip(power + 2.0 * gauss(), 0.5 * idle, 1.05 * tdp))
            tc.append(clip(temp_rep, -40.0, 150.0))
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


class StepGen:
    """Framework per-step streams of one training rank; steps pause during warm-up, checkpoints, restarts."""

    __slots__ = ("_gpu", "_jitter", "_node", "_period", "_phases", "_retries", "next_ts", "rng")

    def __init__(self, p: SimParams, node: NodeSpec, g: int) -> None:
        self.rng = Random(f"{p.seed}:{node.index}:{g}:step")
        self._node, self._gpu = node, node.gpus[g]
        self._period, self._jitter = p.step_period_ns, max(p.jitter_ns, 1)
        self._phases = TrainPhases(f"{p.seed}:{node.index}:phases", p.start_ns)
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
            if kind == CKPT:  # the loop blocks on the checkpoint write
                t = phases.end + rint(jitter)
                continue
            reserved = gpu.memory(rel)[0]
            if kind == COMM:
                ar_ms, p_retry = math.exp(2.3 + 0.25 * gauss()), 0.02
            else:
                ar_ms, p_retry = math.exp(1.5 + 0.35 * gauss()), 0.002
            if rnd() < 0.01:  # a slow collective: congestion, a straggler
                ar_ms *= 4.0 + 11.0 * rnd()
                p_retry = 0.2
            if rnd() < p_retry:
                retries += float(1 + rint(4))
            wait_ms = lvl * (150.0 + 750.0 * rnd()) if kind == STALL else -2.0 * math.log(1.0 - rnd())
            ts.append(t)
            alloc_c.append(float(int(reserved * (0.62 + 0.3 * rnd())) & ~511))
            res_c.append(reserved)
            ar_c.append(ar_ms)
            retry_c.append(retries)
            wait_c.append(wait_ms)
            t += int(period * (0.9 + 0.2 * rnd()) + (wait_ms + max(0.0, ar_ms - 8.0)) * 1e6)
        self.next_ts, self._retries = t, retries
        _emit(out, STEP_SENSORS, self._node.name, gid, ts, cols, self._node.labels[int(gid)])


class InferGen(_Periodic):
    """Inference-server streams of one GPU; silent while the server is down or loading."""

    __slots__ = ("_backlog", "_bursts", "_dt_s", "_gpu", "_node", "_p")

    def __init__(self, p: SimParams, node: NodeSpec, g: int) -> None:
        super().__init__(f"{p.seed}:{node.index}:{g}:infer", p.start_ns, p.infer_period_ns, p.jitter_ns)
        self._p, self._node, self._gpu = p, node, node.gpus[g]
        self._bursts = Bursts(f"{p.seed}:{node.index}:bursts", p.start_ns)
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
            rate = request_rate(node, gpu, t, p, bursts.level)
            # Requests above capacity queue up; a full queue sheds load.
            backlog = clip(backlog + (rate - cap) * dt, 0.0, 8.0 * cap)
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


class HostGen(_Periodic):
    """host_cpu_util and disk_write of one node: dataloader stalls load the CPU, checkpoints the disk."""

    __slots__ = ("_bursts", "_node", "_p", "_phases")

    def __init__(self, p: SimParams, node: NodeSpec) -> None:
        super().__init__(f"{p.seed}:{node.index}:host:host", p.start_ns, p.host_period_ns, p.jitter_ns)
        self._p, self._node = p, node
        self._phases = TrainPhases(f"{p.seed}:{node.index}:phases", p.start_ns)
        self._bursts = Bursts(f"{p.seed}:{node.index}:bursts", p.start_ns)

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
                if kind == STALL:
                    cpu = 85.0 + 13.0 * rnd()
                elif kind == CKPT:
                    cpu, disk = 40.0 + 20.0 * rnd(), phases.level * (2.0 + 4.0 * rnd()) * _GB
                else:
                    cpu = 22.0 + 16.0 * rnd()
            else:
                bursts.seek(t)
                cpu = 8.0 + 40.0 * min(1.0, request_rate(node, gpu0, t, p, bursts.level) / gpu0.capacity_rps)
            ts.append(t)
            cpu_c.append(clip(round(cpu + 1.5 * gauss(), 1), 0.0, 100.0))
            disk_c.append(disk)
            self.tick()
            t = self.next_ts
        _emit(out, HOST_SENSORS, node.name, HOST_GPU, ts, (cpu_c, disk_c), node.host_labels)
