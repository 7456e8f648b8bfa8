"""The 23 sensor streams: the single source of truth for names, units and ranges.

Validation, the ClickHouse DDL, the simulator and the docs are all derived from
``CATALOG``; nothing else spells out a sensor's name, unit or valid range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

Kind = Literal["gauge", "counter", "event"]
Scope = Literal["gpu", "host"]
# When a stream delivers: on a sampling clock, or once per training step (or collective), so that it
# pauses whenever the job does (warm-up, checkpoint, restart). The aligner's holds rule tells them apart.
Cadence = Literal["clock", "step"]
# How a grid cell summarises its samples. ``increase`` handles counter resets;
# ``last_nonzero``/``count`` keep an event stream's latest code and how many fired.
Agg = Literal["mean", "max", "last", "increase", "last_nonzero", "count"]

HOST_GPU: Final = "host"


@dataclass(frozen=True, slots=True)
class Sensor:
    """One sensor stream: Kafka topic ``sensors.<name>``, one column family in ``gpu_frames``."""

    index: int
    name: str
    unit: str
    kind: Kind
    source: str
    aggs: tuple[Agg, ...]
    lo: float
    hi: float
    scope: Scope = "gpu"
    cadence: Cadence = "clock"

    @property
    def topic(self) -> str:
        return f"sensors.{self.name}"

    def column(self, agg: Agg) -> str:
        """Column name in ``gpu_frames``: the first aggregation carries the bare name."""
        return self.name if agg == self.aggs[0] else f"{self.name}_{agg}"

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self.column(a) for a in self.aggs)

    @property
    def count_column(self) -> str:
        return f"n_{self.name}"


_TIB: Final = 1024.0**4
_MAX_BYTES_PER_S: Final = 1e13  # 10 TB/s: above any NVLink generation shipped so far
_HOUR_MS: Final = 3_600_000.0


def _s(index: int, name: str, unit: str, kind: Kind, source: str, aggs: tuple[Agg, ...],
       lo: float, hi: float, scope: Scope = "gpu", cadence: Cadence = "clock") -> Sensor:
    return Sensor(index, name, unit, kind, source, aggs, lo, hi, scope, cadence)


CATALOG: Final[tuple[Sensor, ...]] = (
    _s(0, "gpu_util", "%", "gauge", "NVML utilization.gpu / DCGM_FI_DEV_GPU_UTIL", ("mean", "max"), 0, 100),
    _s(1, "sm_active", "ratio", "gauge", "DCGM_FI_PROF_SM_ACTIVE", ("mean",), 0, 1),
    _s(2, "tensor_active", "ratio", "gauge", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", ("mean",), 0, 1),
    _s(3, "fb_used", "MiB", "gauge", "NVML memory.used / DCGM_FI_DEV_FB_USED", ("last", "max"), 0, 4 * 1024 * 1024),
    _s(4, "power", "W", "gauge", "NVML power.draw / DCGM_FI_DEV_POWER_USAGE", ("mean",), 0, 5000),
    _s(5, "temperature", "degC", "gauge", "DCGM_FI_DEV_GPU_TEMP", ("max",), -40, 150),
    _s(6, "sm_clock", "MHz", "gauge", "DCGM_FI_DEV_SM_CLOCK", ("mean",), 0, 5000),
    _s(7, "pcie_tx", "B/s", "gauge", "DCGM_FI_PROF_PCIE_TX_BYTES", ("mean",), 0, _MAX_BYTES_PER_S),
    _s(8, "pcie_rx", "B/s", "gauge", "DCGM_FI_PROF_PCIE_RX_BYTES", ("mean",), 0, _MAX_BYTES_PER_S),
    _s(9, "nvlink_tx", "B/s", "gauge", "DCGM_FI_PROF_NVLINK_TX_BYTES", ("mean",), 0, _MAX_BYTES_PER_S),
    _s(10, "nvlink_rx", "B/s", "gauge", "DCGM_FI_PROF_NVLINK_RX_BYTES", ("mean",), 0, _MAX_BYTES_PER_S),
    _s(11, "ecc_errors", "count", "counter", "DCGM_FI_DEV_ECC_SBE/DBE_VOL_TOTAL", ("increase", "last"), 0, 2.0**53),
    _s(12, "xid_errors", "code", "event", "DCGM_FI_DEV_XID_ERRORS", ("last_nonzero", "count"), 0, 65535),
    _s(13, "torch_allocated", "B", "gauge", "torch.cuda.memory_allocated (per rank)", ("last",), 0, 4 * _TIB,
       cadence="step"),
    _s(14, "torch_reserved", "B", "gauge", "torch.cuda.memory_reserved (per rank)", ("last",), 0, 4 * _TIB,
       cadence="step"),
    _s(15, "nccl_allreduce_ms", "ms", "gauge", "NCCL / profiler, per collective", ("mean", "max"), 0, _HOUR_MS,
       cadence="step"),
    _s(16, "nccl_retries", "count", "counter", "NCCL retransmits", ("increase", "last"), 0, 2.0**53,
       cadence="step"),
    _s(17, "dataloader_wait_ms", "ms", "gauge", "framework, per step", ("mean",), 0, _HOUR_MS, cadence="step"),
    _s(18, "queue_depth", "requests", "gauge", "inference server (e.g. Triton)", ("max",), 0, 1e9),
    _s(19, "request_rate", "req/s", "gauge", "inference server", ("mean",), 0, 1e9),
    _s(20, "request_latency_ms", "ms", "gauge", "inference server (p99)", ("max",), 0, _HOUR_MS),
    _s(21, "host_cpu_util", "%", "gauge", "host /proc/stat", ("mean",), 0, 100, "host"),
    _s(22, "disk_write", "B/s", "gauge", "host /proc/diskstats (checkpoint I/O)", ("mean", "max"),
       0, _MAX_BYTES_PER_S, "host"),
)

BY_NAME: Final[dict[str, Sensor]] = {s.name: s for s in CATALOG}

# How finely ClickHouse keeps each gauge's values: the binary exponent of its resolution (-4: 1/16 of
# the unit). Finer than the sensor can tell is noise that no codec compresses; these are at or below
# what the source reports (NVML power in mW but accurate to watts, utilisation in whole %, clocks in
# MHz, PCIe/NVLink counters in bytes over a sampling window). Counters and events are kept exactly.
# Frames on Kafka keep every bit; see schemas.resolution.
STORAGE_RESOLUTION: Final[dict[str, int]] = {
    "gpu_util": -6, "sm_active": -12, "tensor_active": -12, "fb_used": -4, "power": -4, "temperature": -4,
    "sm_clock": -2, "pcie_tx": 20, "pcie_rx": 20, "nvlink_tx": 20, "nvlink_rx": 20,  # 1 MiB/s
    "torch_allocated": 20, "torch_reserved": 20, "nccl_allreduce_ms": -10, "dataloader_wait_ms": -10,  # ~1 us
    "queue_depth": -4, "request_rate": -6, "request_latency_ms": -10, "host_cpu_util": -6, "disk_write": 20,
}

# Label keys a sample may carry, mapped to their gpu_frames column.
LABEL_COLUMNS: Final[dict[str, str]] = {
    "pod": "pod",
    "namespace": "namespace",
    "workload": "workload",
    "class": "workload_class",
    "rank": "rank",
    "pid": "pid",
    "gpu_model": "gpu_model",
    "region": "region",
    # Which peak TFLOP/s a frame's activity is measured against (schemas.gpus.PRECISIONS);
    # frames without it count as bf16.
    "precision": "precision",
}
INT_LABELS: Final = frozenset({"rank", "pid"})


def value_columns() -> list[tuple[Sensor, Agg, str]]:
    """Every aggregated value column of ``gpu_frames``, in catalog order."""
    return [(s, a, s.column(a)) for s in CATALOG for a in s.aggs]
