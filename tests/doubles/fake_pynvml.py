"""A stand-in for ``pynvml`` (nvidia-ml-py): the functions the NVML collector calls, their
return shapes and pynvml's exception classes, over configurable fake GPUs.

``FakeNvml(gpus=[FakeGpu(...), ...])`` is module-like: pass it where the collector takes
the ``pynvml`` module. What it copies from pynvml 13.x:

- errors: ``NVMLError(code)`` returns the subclass for the code, as pynvml's
  ``_extractNVMLErrorsAsClasses`` builds them (``NVMLError_NotSupported``,
  ``NVMLError_GpuIsLost``, ``NVMLError_DriverNotLoaded``, ``NVMLError_LibraryNotFound``,
  ``NVMLError_Timeout`` ...), each with ``.value`` the NVML return code, and each
  constructible without arguments;
- strings come back as ``str`` (pynvml's ``convertStrBytes``);
- structs have the attributes of pynvml's ctypes structures (``.gpu``, ``.memory``,
  ``.used``, ``.pid``, ``.usedGpuMemory`` which is None when unavailable, ``.eventData``);
- ``nvmlEventSetWait`` raises ``NVMLError_Timeout`` when no event is waiting;
- ``nvmlDeviceGetFieldValues`` returns per-field results with their own ``nvmlReturn``.

A GPU is lost (every call on it raises ``NVMLError_GpuIsLost``) from its
``lost_at_tick``-th memory read on (the collector reads memory once per tick), or when
``lose()`` is called. ``calls`` counts every call by (gpu uuid, function name).
"""

from __future__ import annotations

import string
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

# Return codes and constants, with pynvml's names and values.
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
nvmlEventTypeXidCriticalError = 0x0000000000000008

_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized", NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found", NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout", NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found", NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """pynvml's base error: ``NVMLError(code)`` is an instance of the code's subclass."""

    _valClassMapping: ClassVar[dict[int, type[NVMLError]]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"NVML error {self.value}")


def _error_classes() -> dict[str, type[NVMLError]]:
    out: dict[str, type[NVMLError]] = {}
    for name, val in list(globals().items()):
        if not name.startswith("NVML_ERROR_"):
            continue
        cls_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace("_", "")

        def gen_new(code: int) -> Any:
            def new(typ: type[NVMLError], *args: Any) -> NVMLError:
                return NVMLError.__new__(typ, code)
            return new

        cls = type(cls_name, (NVMLError,), {"__new__": gen_new(val)})
        NVMLError._valClassMapping[val] = cls
        out[cls_name] = cls
    return out


_ERRORS = _error_classes()
globals().update(_ERRORS)
NVMLError_NotSupported = _ERRORS["NVMLError_NotSupported"]
NVMLError_GpuIsLost = _ERRORS["NVMLError_GpuIsLost"]
NVMLError_DriverNotLoaded = _ERRORS["NVMLError_DriverNotLoaded"]
NVMLError_LibraryNotFound = _ERRORS["NVMLError_LibraryNotFound"]
NVMLError_Timeout = _ERRORS["NVMLError_Timeout"]
NVMLError_NotFound = _ERRORS["NVMLError_NotFound"]
NVMLError_NoPermission = _ERRORS["NVMLError_NoPermission"]
NVMLError_Unknown = _ERRORS["NVMLError_Unknown"]


class Utilization(NamedTuple):
    gpu: int
    memory: int


class Memory(NamedTuple):
    total: int
    free: int
    used: int


class ProcessInfo(NamedTuple):
    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class EventData(NamedTuple):
    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class _FieldUnion(NamedTuple):
    ullVal: int


@dataclass
class FieldValue:
    fieldId: int
    scopeId: int
    nvmlReturn: int
    value: _FieldUnion
    valueType: int = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    timestamp: int = 0
    latencyUsec: int = 0


# What NVML refuses on a MIG device handle: the physical GPU's readings.
MIG_UNSUPPORTED = frozenset({
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetClockInfo", "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetTotalEccErrors", "nvmlDeviceRegisterEvents", "nvmlDeviceGetMigMode",
    "nvmlDeviceGetTotalEnergyConsumption",
})


@dataclass
class FakeGpu:
    """One fake device (physical or a MIG instance); it is also its own NVML handle."""

    uuid: str
    name: str = "NVIDIA H200"
    util: int = 57
    mem_total: int = 141 * 1024**3
    mem_used: int = 20 * 1024**3
    power_mw: int = 312_450
    temperature: int = 61
    sm_clock: int = 1980
    pcie_tx_kb: int = 2_000  # what the (blocking) throughput call answers
    pcie_rx_kb: int = 3_000
    nvlink_tx_kib: int = 1_000_000  # cumulative counters, advanced on every read
    nvlink_rx_kib: int = 2_000_000
    nvlink_kib_per_read: int = 10_240
    pcie_tx_bytes: int = 10**9  # cumulative counters, advanced on every read
    pcie_rx_bytes: int = 2 * 10**9
    pcie_bytes_per_read: int = 1_000_000
    unsupported_fields: set[int] = field(default_factory=set)  # field ids answered NOT_SUPPORTED
    ecc_corrected: int = 2
    ecc_uncorrected: int = 1
    energy_mj: int = 123_456_789
    unsupported: set[str] = field(default_factory=set)  # NVML function names refused with NotSupported
    processes: list[ProcessInfo] = field(default_factory=list)
    xids: list[int] = field(default_factory=list)  # XID codes waiting to be delivered as events
    lost_at_tick: int | None = None
    mig: list[FakeGpu] | None = None  # MIG instances: MIG mode is on when this is a list
    memory_reads: int = 0
    lost: bool = False

    def lose(self) -> None:
        self.lost = True


def mig_instance(uuid: str, name: str = "NVIDIA H200 MIG 1g.18gb", mem_used: int = 4 * 1024**3,
                 processes: list[ProcessInfo] | None = None) -> FakeGpu:
    """A MIG instance: memory and processes only, like NVML on a MIG device handle."""
    return FakeGpu(uuid, name, mem_total=18 * 1024**3, mem_used=mem_used, unsupported=set(MIG_UNSUPPORTED),
                   processes=list(processes or []))


@dataclass
class _EventSet:
    devices: list[FakeGpu] = field(default_factory=list)


class FakeNvml:
    """Module-like double of pynvml over ``gpus``; ``driver`` is "ok", "not_loaded" or "missing"."""

    def __init__(self, gpus: list[FakeGpu], driver: str = "ok") -> None:
        self.gpus = gpus
        self.driver = driver
        self.initialized = False
        self.calls: Counter[tuple[str, str]] = Counter()
        for name, val in globals().items():
            if name.startswith(("NVML_", "nvmlEventType", "NVMLError")):
                setattr(self, name, val)

    # --- library ---------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.driver == "missing":
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        if self.driver == "not_loaded":
            raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._ready()
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._ready()
        return "565.57.01"

    def nvmlDeviceGetCount(self) -> int:
        self._ready()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._ready()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    # --- identity and MIG ------------------------------------------------
    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        self._call(h, "nvmlDeviceGetUUID")
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        self._call(h, "nvmlDeviceGetName")
        return h.name

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> list[int]:
        self._call(h, "nvmlDeviceGetMigMode")
        mode = NVML_DEVICE_MIG_ENABLE if h.mig is not None else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        self._call(h, "nvmlDeviceGetMaxMigDeviceCount")
        return 7 if h.mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, index: int) -> FakeGpu:
        self._call(h, "nvmlDeviceGetMigDeviceHandleByIndex")
        if h.mig is None or not 0 <= index < len(h.mig):
            raise NVMLError(NVML_ERROR_NOT_FOUND)  # an empty slot, as on a real GPU
        return h.mig[index]

    # --- readings --------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Utilization:
        self._call(h, "nvmlDeviceGetUtilizationRates")
        return Utilization(h.util, 30)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Memory:
        h.memory_reads += 1
        if h.lost_at_tick is not None and h.memory_reads >= h.lost_at_tick:
            h.lost = True
        self._call(h, "nvmlDeviceGetMemoryInfo")
        return Memory(h.mem_total, h.mem_total - h.mem_used, h.mem_used)

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        self._call(h, "nvmlDeviceGetPowerUsage")
        return h.power_mw

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        self._call(h, "nvmlDeviceGetTemperature")
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return h.temperature

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock_type: int) -> int:
        self._call(h, "nvmlDeviceGetClockInfo")
        if clock_type != NVML_CLOCK_SM:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return h.sm_clock

    def nvmlDeviceGetPcieThroughput(self, h: FakeGpu, counter: int) -> int:
        self._call(h, "nvmlDeviceGetPcieThroughput")
        return h.pcie_tx_kb if counter == NVML_PCIE_UTIL_TX_BYTES else h.pcie_rx_kb

    def nvmlDeviceGetFieldValues(self, h: FakeGpu, field_ids: list[Any]) -> list[FieldValue]:
        self._call(h, "nvmlDeviceGetFieldValues")
        out = []
        for fid in field_ids:
            fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
            if fid in h.unsupported_fields:
                out.append(FieldValue(fid, scope, NVML_ERROR_NOT_SUPPORTED, _FieldUnion(0)))
            elif fid == NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
                h.pcie_tx_bytes += h.pcie_bytes_per_read
                out.append(FieldValue(fid, scope, NVML_SUCCESS, _FieldUnion(h.pcie_tx_bytes)))
            elif fid == NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
                h.pcie_rx_bytes += 2 * h.pcie_bytes_per_read
                out.append(FieldValue(fid, scope, NVML_SUCCESS, _FieldUnion(h.pcie_rx_bytes)))
            elif fid == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
                h.nvlink_tx_kib += h.nvlink_kib_per_read
                out.append(FieldValue(fid, scope, NVML_SUCCESS, _FieldUnion(h.nvlink_tx_kib)))
            elif fid == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
                h.nvlink_rx_kib += h.nvlink_kib_per_read
                out.append(FieldValue(fid, scope, NVML_SUCCESS, _FieldUnion(h.nvlink_rx_kib)))
            else:
                out.append(FieldValue(fid, scope, NVML_ERROR_NOT_SUPPORTED, _FieldUnion(0)))
        return out

    def nvmlDeviceGetTotalEccErrors(self, h: FakeGpu, error_type: int, counter_type: int) -> int:
        self._call(h, "nvmlDeviceGetTotalEccErrors")
        return h.ecc_corrected if error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED else h.ecc_uncorrected

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        self._call(h, "nvmlDeviceGetTotalEnergyConsumption")
        return h.energy_mj

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[ProcessInfo]:
        self._call(h, "nvmlDeviceGetComputeRunningProcesses")
        return list(h.processes)

    # --- events ----------------------------------------------------------
    def nvmlEventSetCreate(self) -> _EventSet:
        self._ready()
        return _EventSet()

    def nvmlDeviceRegisterEvents(self, h: FakeGpu, event_types: int, event_set: _EventSet) -> None:
        self._call(h, "nvmlDeviceRegisterEvents")
        if event_types & nvmlEventTypeXidCriticalError:
            event_set.devices.append(h)

    def nvmlEventSetWait(self, event_set: _EventSet, timeout_ms: int) -> EventData:
        self._ready()
        for h in event_set.devices:
            if h.xids:
                return EventData(h, nvmlEventTypeXidCriticalError, h.xids.pop(0))
        raise NVMLError(NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._ready()
        event_set.devices.clear()

    # --- helpers ---------------------------------------------------------
    def _ready(self) -> None:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _call(self, h: FakeGpu, fn: str) -> None:
        self._ready()
        self.calls[(h.uuid, fn)] += 1
        if h.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn in h.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def gpus(count: int, model: str = "NVIDIA H200", **kw: Any) -> list[FakeGpu]:
    """``count`` GPUs with UUIDs ``GPU-00000000-...-<index>``."""
    return [FakeGpu(f"GPU-{i:08x}-0000-4000-8000-{i:012x}", model, **kw) for i in range(count)]
