"""The NVML collector's device lifecycle: start NVML, find the GPUs (MIG instances as their own),
drop a lost one, free and shut down; and the error rules every NVML call goes through
(see ``agents.collect.nvml``, which samples the devices found here).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from schemas.counters import Counters
from schemas.records import Labels
from streams.formats import nvml_fields as nf

log = logging.getLogger("agents.collect.nvml")  # one logger for the collector, whichever module says it


class NoDriver(RuntimeError):
    """NVML could not start: no library or no loaded driver on this machine."""


class GpuLost(Exception):
    """Raised inside the collector when NVML says a GPU is lost."""


class _Never(Exception):
    """Stands in for an error class the NVML module does not define."""


@dataclass(slots=True)
class Gpu:
    id: str  # UUID, or the MIG instance's UUID
    handle: Any
    base_labels: Labels
    parent: str | None = None  # the physical GPU's id, for a MIG instance
    has_mig: bool = False  # a physical GPU in MIG mode: its instances report the processes
    events: Any = None  # an NVML event set for XID errors
    slot: int = 0  # position among the sampled GPUs at start (staggers the PCIe fallback)
    counters: dict[str, tuple[int, int]] = field(default_factory=dict)  # sensor -> last (ts, raw count)


@dataclass(slots=True)
class CollectStats(Counters):
    ticks: int = 0
    samples: int = 0
    beacons: int = 0
    gpus_lost: int = 0
    errors: int = 0  # readings skipped for a transient NVML error
    out_of_range: int = 0


class NvmlDevices:
    """The GPUs NVML shows, with the error rules of ``agents.collect.nvml``'s docstring."""

    def __init__(self, nvml: Any, region: str = "") -> None:
        self.nv = nvml
        self.region = region
        self.memo = nf.UnsupportedMemo()
        self.stats = CollectStats()
        self.gpus: list[Gpu] = []
        self._logged: set[tuple[str, str, str]] = set()
        self._e_lost = getattr(nvml, "NVMLError_GpuIsLost", _Never)
        self._e_timeout = getattr(nvml, "NVMLError_Timeout", _Never)
        self._e_any = getattr(nvml, "NVMLError", _Never)
        self._e_unavailable = tuple(getattr(nvml, name, _Never) for name in (
            "NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission"))

    # --- start and stop ------------------------------------------------------
    def open(self) -> list[str]:
        """Start NVML and find the GPUs (MIG instances as their own); returns their ids."""
        no_driver = tuple(getattr(self.nv, n, _Never) for n in ("NVMLError_LibraryNotFound",
                                                                 "NVMLError_DriverNotLoaded"))
        try:
            self.nv.nvmlInit()
        except no_driver as exc:
            raise NoDriver(f"NVML cannot start on this machine ({exc}): is the NVIDIA driver installed and "
                           f"loaded, and is libnvidia-ml.so.1 visible to this process?") from None
        except self._e_any as exc:
            raise NoDriver(f"NVML cannot start: {exc}") from None
        for index in range(self.nv.nvmlDeviceGetCount()):
            try:
                self.gpus += self._devices(self.nv.nvmlDeviceGetHandleByIndex(index), index)
            except (self._e_lost, GpuLost):
                log.error("GPU %d is lost at start; not sampled", index)
                self.stats.gpus_lost += 1
        for slot, gpu in enumerate(self.gpus):
            gpu.slot = slot
        return [g.id for g in self.gpus]

    def _devices(self, handle: Any, index: int) -> list[Gpu]:
        """The physical GPU at ``index``, then its MIG instances if MIG is on."""
        gpu = self._device(handle, None)
        out = [gpu]
        mode = self._call(gpu, "mig", self.nv.nvmlDeviceGetMigMode)
        if mode is None or mode[0] != getattr(self.nv, "NVML_DEVICE_MIG_ENABLE", 1):
            return out
        # MIG on: each instance is a GPU of its own (memory, processes); the physical GPU
        # keeps what only it reports (power, temperature, clocks, PCIe, ECC, XID).
        gpu.has_mig = True
        for slot in range(self.nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                child = self.nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except self._e_lost:
                raise
            except self._e_any:
                continue  # an empty slot
            out.append(self._device(child, gpu.id))
        log.info("GPU %d (%s): MIG on, %d instances", index, gpu.id, len(out) - 1)
        return out

    def _device(self, handle: Any, parent: str | None) -> Gpu:
        labels: Labels = {"gpu_model": _text(self.nv.nvmlDeviceGetName(handle))}
        if self.region:
            labels["region"] = self.region
        gpu = Gpu(_text(self.nv.nvmlDeviceGetUUID(handle)), handle, labels, parent)
        if parent is None:
            gpu.events = self._call(gpu, "xid", self._xid_events)
        return gpu

    def _xid_events(self, handle: Any) -> Any:
        event_set = self.nv.nvmlEventSetCreate()
        try:
            self.nv.nvmlDeviceRegisterEvents(handle, self.nv.nvmlEventTypeXidCriticalError, event_set)
        except BaseException:
            self.nv.nvmlEventSetFree(event_set)
            raise
        return event_set

    def shutdown(self) -> None:
        """Free the XID event sets, then NVML's shutdown."""
        for gpu in self.gpus:
            if gpu.events is not None:
                with contextlib.suppress(self._e_any):
                    self.nv.nvmlEventSetFree(gpu.events)
        try:
            self.nv.nvmlShutdown()
        except self._e_any as exc:
            log.debug("nvmlShutdown: %s", exc)

    def _drop(self, gpu: Gpu) -> None:
        gone = [g for g in self.gpus if g is gpu or g.parent == gpu.id]
        if not gone:
            return  # a MIG instance whose physical GPU was dropped in the same tick
        log.error("GPU %s is lost (NVML: GPU is lost); dropped from sampling%s", gpu.id,
                  f" with its {len(gone) - 1} MIG instances" if len(gone) > 1 else "")
        self.gpus = [g for g in self.gpus if g not in gone]
        self.stats.gpus_lost += len(gone)

    def _call(self, gpu: Gpu, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(handle, *args)`` with the error rules of the module docstring; None when skipped."""
        if not self.memo.wanted(gpu.id, name):
            return None
        try:
            return fn(gpu.handle, *args)
        except self._e_lost:
            raise GpuLost from None
        except self._e_unavailable as exc:
            if self.memo.mark(gpu.id, name):
                log.info("%s: %s not available (%s); not asked again", gpu.id, name, exc)
            return None
        except self._e_any as exc:
            self.stats.errors += 1
            self._log_once(gpu.id, name, type(exc).__name__, "%s: reading %s failed: %s (skipped this tick)",
                           gpu.id, name, exc)
            return None

    def _log_once(self, gpu: str, what: str, kind: str, msg: str, *args: Any) -> None:
        key = (gpu, what, kind)
        if key not in self._logged:
            self._logged.add(key)
            log.warning(msg, *args)


def _text(val: str | bytes) -> str:
    """pynvml returns str on Python 3 (``convertStrBytes``); older releases returned bytes."""
    return val.decode("utf-8", "replace") if isinstance(val, bytes) else str(val)
