"""Plays a scenario's leaks (``kind = "leak"``) into the simulator's samples, after the fact, as functions of time.

Each leak rewrites the streams its rule reads, in the way the seeds describe it, and plants a
root cause attribution should name: a pipeline stall is CPU-bound preprocessing (``host_cpu_util``
pinned 3 s before the dataloader blocks), a batching collapse starts with the request rate falling
below the batch window, a slow AllReduce and a retransmit storm come with NVLink traffic
collapsing, a checkpoint storm blocks the GPUs while ``disk_write`` bursts. Look-alikes rewrite
the same streams the way a healthy system moves them.

>>> from streams.sim.scenario import parse_scenario
>>> sc = parse_scenario('version = 1\\n[[event]]\\nkind = "leak"\\nrule = "pipeline_stall"\\nnode = "node-00"\\n'
...                     'gpu = "0"\\nstart_s = 1.0\\nduration_s = 2.0\\n', "x.toml")
>>> fx = LeakEffects(sc.truth(0))
>>> fx.rewrite("dataloader_wait_ms", "node-00", "0", [0, 1_500_000_000, 4_000_000_000], [2.0, 3.0, 2.0], 80.0)
[2.0, 603.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from schemas.catalog import HOST_GPU
from schemas.records import SampleBatch, Times, Values
from streams.sim.scenario import TruthEvent

S: Final = 1_000_000_000
_MIB: Final = 1024.0 * 1024.0
_ACTIVITY: Final = ("gpu_util", "sm_active", "tensor_active")
_CAUSE_LEAD_NS: Final = 3 * S  # a planted root cause starts this long before the symptom
_BURST_NS: Final = 4 * S  # a checkpoint's write
_RAMP_NS: Final = 60 * S  # a batching collapse reaches its cliff in this long
_SILENT_WHEN_IDLE: Final = frozenset({"queue_depth", "request_rate", "request_latency_ms", "dataloader_wait_ms",
                                      "nccl_allreduce_ms", "nccl_retries"})


@dataclass(frozen=True, slots=True)
class _Leak:
    rule: str
    variant: str
    node: str
    gpu: str
    start: int
    end: int
    magnitude: float
    period: int

    def covers(self, node: str, gpu: str) -> bool:
        if node != self.node and self.node != "*":
            return False
        return gpu == HOST_GPU or self.gpu in ("*", gpu)


class LeakEffects:
    """The leaks of a scenario, applied to batches."""

    def __init__(self, truth: Sequence[TruthEvent]) -> None:
        self._leaks = [_Leak(t.rule, t.variant, t.node, t.gpu, t.start_ns, t.end_ns, t.magnitude,
                             max(S, round(t.period_s * S))) for t in truth if t.kind == "leak"]

    def __bool__(self) -> bool:
        return bool(self._leaks)

    def apply(self, b: SampleBatch, idle_w: float) -> list[SampleBatch]:
        """The batch with every leak that concerns it applied; an unallocated look-alike cuts it at its edges."""
        if not self._leaks:
            return [b]
        if b.sensor in _SILENT_WHEN_IDLE:
            b = self._silence(b)
        values = self.rewrite(b.sensor, b.node, b.gpu, b.ts_ns, b.value, idle_w)
        if values is not b.value:
            b = SampleBatch(b.sensor, b.node, b.gpu, b.ts_ns, values, b.clock, b.labels)
        return self._unallocate(b)

    def rewrite(self, sensor: str, node: str, gpu: str, ts: Times, values: Values,
                idle_w: float) -> list[float]:
        out = list(values)
        touched = False
        for lk in self._leaks:
            if not lk.covers(node, gpu) or not ts or ts[-1] < lk.start - _CAUSE_LEAD_NS:
                continue
            for i, t in enumerate(ts):
                v = _one(lk, sensor, gpu == HOST_GPU, t, out[i], idle_w)
                if v is not None:
                    out[i] = v
                    touched = True
        return out if touched else list(values)

    def _silence(self, b: SampleBatch) -> SampleBatch:
        """A GPU that does nothing (idle, or loading weights) takes no steps and serves no requests."""
        quiet = [(lk.start, lk.end) for lk in self._leaks if lk.rule == "idle_allocated" and lk.covers(b.node, b.gpu)
                 and b.gpu != HOST_GPU]
        if not quiet:
            return b
        keep = [i for i, t in enumerate(b.ts_ns) if not any(lo <= t < hi for lo, hi in quiet)]
        if len(keep) == len(b.ts_ns):
            return b
        return SampleBatch(b.sensor, b.node, b.gpu, [b.ts_ns[i] for i in keep], [b.value[i] for i in keep], b.clock,
                           b.labels)

    def _unallocate(self, b: SampleBatch) -> list[SampleBatch]:
        cut = [lk for lk in self._leaks if lk.variant == "unallocated" and lk.covers(b.node, b.gpu)
               and b.gpu != HOST_GPU and b.ts_ns and lk.start <= b.ts_ns[-1] and b.ts_ns[0] < lk.end]
        if not cut:
            return [b]
        lk = cut[0]
        out = []
        for k in range(3):  # before, during (no pod holds the GPU), after
            idx = [i for i, t in enumerate(b.ts_ns) if _piece(k, t, lk)]
            if idx:
                labels = {**(b.labels or {}), "pod": ""} if k == 1 else b.labels
                out.append(SampleBatch(b.sensor, b.node, b.gpu, [b.ts_ns[i] for i in idx], [b.value[i] for i in idx],
                                       b.clock, labels))
        return out


def _piece(k: int, t: int, lk: _Leak) -> bool:
    return (t < lk.start) if k == 0 else (lk.start <= t < lk.end) if k == 1 else (t >= lk.end)


def _one(lk: _Leak, sensor: str, host: bool, t: int, v: float, idle_w: float) -> float | None:
    """The value of ``sensor`` at ``t`` under leak ``lk`` (None: unchanged)."""
    inside = lk.start <= t < lk.end
    rule, var = lk.rule, lk.variant
    if rule == "checkpoint_io_storm":
        return _checkpoint(lk, sensor, host, t, v, idle_w)
    if host:
        if rule == "pipeline_stall" and var == "leak" and sensor == "host_cpu_util" \
                and lk.start - _CAUSE_LEAD_NS <= t < lk.end:
            return 98.0  # preprocessing pins the CPUs (the seed's lock contention): the root cause
        return None
    if rule == "memory_fragmentation":
        return _memory(lk, sensor, t, v)
    if rule == "nccl_retransmit_storm" and sensor == "nccl_retries" and t >= lk.start:
        # A counter: the extra retransmits stay counted after the storm.
        if var == "leak":
            return v + lk.magnitude * (min(t, lk.end) - lk.start) / S
        return v + 5.0 * ((min(t, lk.end) - lk.start) // (120 * S))  # a cluster of 5 every 2 minutes
    if rule in ("nccl_retransmit_storm", "nccl_slow_allreduce") and var == "leak" \
            and sensor in ("nvlink_tx", "nvlink_rx") and lk.start - _CAUSE_LEAD_NS <= t < lk.end:
        return v * 0.1  # the link flaps or degrades first: the root cause
    if not inside:
        return None
    if rule == "idle_allocated":
        if sensor in _ACTIVITY:
            warm = {"gpu_util": 4.0, "sm_active": 0.04, "tensor_active": 0.01}
            return warm[sensor] if var == "warmup" else 0.0
        if sensor == "power":
            return idle_w + 3.0
        if sensor in ("pcie_rx", "pcie_tx", "nvlink_tx", "nvlink_rx"):
            return 12e9 if var == "warmup" and sensor == "pcie_rx" else 1e6
        return None
    if rule == "pipeline_stall":
        stalled = var == "leak" or (t - lk.start) % (10 * S) < 2 * S
        if not stalled:
            return None
        if sensor == "dataloader_wait_ms":
            return lk.magnitude + v
        return _quiet(sensor, v, 0.05, idle_w)
    if rule == "batching_collapse":
        r = min(1.0, (t - lk.start) / _RAMP_NS)
        if var == "leak":
            if sensor == "queue_depth":
                return v + (lk.magnitude - 2.0) * r
            if sensor == "request_latency_ms":
                return v * (1.0 + 19.0 * r)
            if sensor == "request_rate":
                return v * (1.0 - 0.7 * r)  # traffic below the batch window: batches wait to fill
            return _quiet(sensor, v, 1.0 - 0.95 * r, idle_w)
        if sensor == "queue_depth":
            return v + 20.0 * r
        if sensor == "request_latency_ms":
            return v * (1.0 + 2.0 * r)
        if sensor == "request_rate":
            return v * (1.0 + r)
        if sensor == "gpu_util":
            return min(100.0, max(v, 92.0))  # the GPU keeps up
        return None
    if rule == "nccl_retransmit_storm" and var == "leak":
        return _quiet(sensor, v, 0.85, idle_w)
    if rule == "nccl_slow_allreduce":
        if var == "one_off":
            slow = (t - lk.start) % (30 * S) < 300_000_000
            return v * 12.0 if slow and sensor == "nccl_allreduce_ms" else None
        if sensor == "nccl_allreduce_ms":
            return v * lk.magnitude
        return _quiet(sensor, v, 0.8, idle_w)
    return None


def _quiet(sensor: str, v: float, factor: float, idle_w: float) -> float | None:
    """Activity x ``factor``; power's dynamic part follows it as the generator's physics has it (~ activity^0.6)."""
    if sensor in _ACTIVITY:
        return float(round(v * factor)) if sensor == "gpu_util" else v * factor
    if sensor == "power" and v > idle_w:
        return idle_w + (v - idle_w) * float(factor ** 0.6)
    return None


def _memory(lk: _Leak, sensor: str, t: int, v: float) -> float | None:
    if not lk.start <= t < lk.end:
        return None
    grown = lk.magnitude * (t - lk.start) / (60.0 * S)  # MiB
    if lk.variant == "leak":
        return v + grown if sensor == "fb_used" else None
    if lk.variant == "warmup_growth":  # the allocator fills: every series grows together
        if sensor == "fb_used":
            return v + grown
        if sensor == "torch_reserved":
            return v + grown * _MIB
        if sensor == "torch_allocated":
            return v + 0.8 * grown * _MIB
        return None
    return v * 0.4 if sensor == "torch_allocated" else None  # flat_cache: a large, steady cache


def _checkpoint(lk: _Leak, sensor: str, host: bool, t: int, v: float, idle_w: float) -> float | None:
    if not lk.start <= t < lk.end:
        return None
    k, into = divmod(t - lk.start, lk.period)
    burst = into < _BURST_NS
    if host:
        if sensor != "disk_write":
            return None
        return lk.magnitude / (_BURST_NS / S) if burst else min(v, 2e7)  # the job's own writes are these
    if sensor == "torch_allocated" and lk.variant == "state_changes":
        return v * (1.0 + 0.25 * k)  # the state grows each period: its checkpoints are legitimately full
    if burst and (sensor in _ACTIVITY or sensor == "power"):  # the GPUs wait on the write: idle, at idle power
        return _quiet(sensor, v, 0.03, idle_w)
    return None
