"""``flopwatch collect nvml``: samples every GPU of the node through NVML and publishes them.

The NVML module is injected (``pynvml`` in production, ``tests.doubles.fake_pynvml`` in
tests); which readings feed which sensor, and the unit conversions, are in
``streams.formats.nvml_fields``. Samples are stamped with the host's ``CLOCK_MONOTONIC``
(``time.monotonic_ns``) in the domain ``nvml:<node>``, and a ``clock.sync`` beacon of
that domain goes out about once a second and once more at the end, so the pipeline can
place every sample (a domain sample waits for a beacon read after it).

Errors: no driver -> ``NoDriver`` (the command exits 2); a field NVML calls
unsupported (or not permitted, or missing from an old driver) is logged once per (gpu,
field) and never asked again; a lost GPU is logged and dropped, the others go on; other
NVML errors skip that reading for the tick, logged once per (gpu, field, error).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from agents.collect.nvml_devices import CollectStats, Gpu, GpuLost, NoDriver, NvmlDevices
from agents.runtime.timebase import SYSTEM_CLOCK, Clock
from schemas.records import Labels
from streams.formats import nvml_fields as nf

__all__ = ["CollectStats", "NoDriver", "NvmlCollector", "Sink"]

log = logging.getLogger(__name__)
_NS = 1_000_000_000
_MAX_EVENTS_PER_TICK = 64  # an XID storm must not stall sampling


class Sink(Protocol):
    """Where samples go: ``agents.collect.sdk.Publisher`` or a test double."""

    def send(self, sensor: str, node: str, gpu: str, ts_ns: int, value: float, labels: Labels | None = None,
             clock: str = "utc") -> bool: ...

    def beacon(self, node: str, clock: str, domain_ns: int, utc_before_ns: int, utc_after_ns: int) -> bool: ...

    def poll(self) -> None: ...

    def send_pending(self) -> None: ...


class NvmlCollector(NvmlDevices):
    """Reads NVML every tick and sends samples to ``sink``; see the module docstring."""

    def __init__(self, nvml: Any, sink: Sink, node: str, region: str = "", proc_root: str | Path = "/proc",
                 processes: bool = True, pcie_fallback_ticks: int = 10,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        NvmlDevices.__init__(self, nvml, region)
        self.sink = sink
        self.node = node
        self.proc_root = Path(proc_root)
        self.processes = processes
        self.pcie_fallback_ticks = pcie_fallback_ticks  # ticks between blocking PCIe throughput reads
        self.clock = f"nvml:{node}"
        self._clock = clock  # its monotonic time is the domain clock, its wall time UTC
        self._pods: dict[int, nf.PodRef | None] = {}  # pid -> pod, while the pid is listed
        # Field ids by value where an older nvidia-ml-py lacks the name (nvml.h's numbers).
        self._fi_pcie = [getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197),
                         getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198)]
        # Scope UINT_MAX asks for the sum over all links.
        self._fi_nvlink = [(getattr(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138), 0xFFFFFFFF),
                           (getattr(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139), 0xFFFFFFFF)]

    def close(self) -> None:
        """A last beacon (after every sample sent), then NVML's shutdown."""
        self.beacon()
        self.shutdown()

    # --- sampling --------------------------------------------------------------
    def beacon(self) -> None:
        """Send what waits in batches, then one reading of the domain clock between two UTC ones
        (read after every sample sent, so all of them can be placed)."""
        self.sink.send_pending()
        before = self._clock.wall_ns()
        reading = self._clock.mono_ns()
        after = self._clock.wall_ns()
        if self.sink.beacon(self.node, self.clock, reading, before, after):
            self.stats.beacons += 1

    def tick(self) -> None:
        """Sample every GPU once."""
        self.stats.ticks += 1
        lost: list[Gpu] = []
        listed: set[int] = set()
        for gpu in self.gpus:
            try:
                self._sample(gpu, listed)
            except GpuLost:
                lost.append(gpu)
        for gpu in lost:
            self._drop(gpu)
        if self.processes:  # forget pods of processes no GPU lists any more (pids get reused)
            for pid in self._pods.keys() - listed:
                del self._pods[pid]
        self.sink.poll()

    def _sample(self, gpu: Gpu, listed: set[int]) -> None:
        nv, call = self.nv, self._call
        ts = self._clock.mono_ns()
        procs: list[nf.ProcessUse] = []
        if self.processes and not gpu.has_mig:
            raw = call(gpu, "processes", nv.nvmlDeviceGetComputeRunningProcesses)
            if raw is not None:
                procs = self._attribute(raw, listed)
        labels = nf.gpu_labels(gpu.base_labels, procs)
        send = self._send
        mem = call(gpu, "memory", nv.nvmlDeviceGetMemoryInfo)
        if mem is not None:
            send("fb_used", gpu.id, ts, nf.bytes_to_mib(mem.used), labels)
        util = call(gpu, "utilization", nv.nvmlDeviceGetUtilizationRates)
        if util is not None:
            send("gpu_util", gpu.id, ts, float(util.gpu), labels)
        mw = call(gpu, "power", nv.nvmlDeviceGetPowerUsage)
        if mw is not None:
            send("power", gpu.id, ts, nf.mw_to_w(mw), labels)
        temp = call(gpu, "temperature", nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        if temp is not None:
            send("temperature", gpu.id, ts, float(temp), labels)
        clk = call(gpu, "sm_clock", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)
        if clk is not None:
            send("sm_clock", gpu.id, ts, float(clk), labels)
        if self.memo.wanted(gpu.id, "pcie"):
            self._counters(gpu, "pcie", self._fi_pcie, 1, ts, labels)
        elif nf.pcie_fallback_due(self.stats.ticks, gpu.slot, self.pcie_fallback_ticks):
            tx = call(gpu, "pcie_tx", nv.nvmlDeviceGetPcieThroughput, nv.NVML_PCIE_UTIL_TX_BYTES)
            if tx is not None:
                send("pcie_tx", gpu.id, ts, nf.kb_per_s_to_b_per_s(tx), labels)
            rx = call(gpu, "pcie_rx", nv.nvmlDeviceGetPcieThroughput, nv.NVML_PCIE_UTIL_RX_BYTES)
            if rx is not None:
                send("pcie_rx", gpu.id, ts, nf.kb_per_s_to_b_per_s(rx), labels)
        if self.memo.wanted(gpu.id, "nvlink"):
            self._counters(gpu, "nvlink", self._fi_nvlink, nf.KIB, ts, labels)
        if self.memo.wanted(gpu.id, "ecc"):
            ecc = call(gpu, "ecc", self._ecc)
            if ecc is not None:
                send("ecc_errors", gpu.id, ts, ecc, labels)
        if gpu.events is not None:
            self._xids(gpu, ts, labels)
        for p in procs:
            if p.used_bytes is not None:
                send("fb_used", nf.process_gpu_id(gpu.id, p.pid), ts, nf.bytes_to_mib(p.used_bytes),
                     nf.process_labels(gpu.base_labels, p))

    def _send(self, sensor: str, gpu: str, ts: int, value: float, labels: Labels) -> None:
        if not nf.in_range(sensor, value):
            self.stats.out_of_range += 1
            self._log_once(gpu, sensor, "range", "%s: %s=%r outside the catalog's range; such readings are skipped",
                           gpu, sensor, value)
            return
        self.sink.send(sensor, self.node, gpu, ts, value, labels, self.clock)
        self.stats.samples += 1

    def _ecc(self, handle: Any) -> float | None:
        nv = self.nv
        corrected = nv.nvmlDeviceGetTotalEccErrors(handle, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)
        uncorrected = nv.nvmlDeviceGetTotalEccErrors(handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                      nv.NVML_VOLATILE_ECC)
        return nf.ecc_total(corrected, uncorrected)

    def _counters(self, gpu: Gpu, name: str, ids: list[Any], unit_bytes: int, ts: int, labels: Labels) -> None:
        """TX and RX rates from two cumulative NVML field values (``<name>_tx``, ``<name>_rx``)."""
        values = self._call(gpu, name, self.nv.nvmlDeviceGetFieldValues, ids)
        if values is None:
            return
        if all(v.nvmlReturn != 0 for v in values):  # e.g. no NVLink on a PCIe card, an older driver
            if self.memo.mark(gpu.id, name):
                log.info("%s: %s counters not available (NVML return %d); not asked again",
                         gpu.id, name, values[0].nvmlReturn)
            return
        for sensor, v in zip((f"{name}_tx", f"{name}_rx"), values, strict=True):
            if v.nvmlReturn != 0:
                continue
            count = int(v.value.ullVal)
            rate = nf.counter_rate(gpu.counters.get(sensor), ts, count, unit_bytes)
            gpu.counters[sensor] = (ts, count)
            if rate is not None:
                self._send(sensor, gpu.id, ts, rate, labels)

    def _xids(self, gpu: Gpu, ts: int, labels: Labels) -> None:
        codes: list[int] = []
        for _ in range(_MAX_EVENTS_PER_TICK):
            try:
                event = self.nv.nvmlEventSetWait(gpu.events, 0)
            except self._e_timeout:
                break
            except self._e_lost:
                raise GpuLost from None
            except self._e_any as exc:
                self._log_once(gpu.id, "xid", type(exc).__name__, "%s: reading XID events: %s", gpu.id, exc)
                break
            codes.append(int(event.eventData))
        # A sample every tick (0 when none fired), so the stream keeps up with the others.
        for code in codes or [0]:
            self._send("xid_errors", gpu.id, ts, float(code), labels)
        if codes:
            log.warning("%s: XID %s", gpu.id, ", ".join(map(str, codes)))

    def _attribute(self, raw: list[Any], listed: set[int]) -> list[nf.ProcessUse]:
        out = []
        for pid, used in nf.merge_processes((int(p.pid), p.usedGpuMemory) for p in raw):
            listed.add(pid)
            if pid not in self._pods:
                self._pods[pid] = self._pod_of(pid)
            out.append(nf.ProcessUse(pid, None if used is None else int(used), self._pods[pid]))
        return out

    def _pod_of(self, pid: int) -> nf.PodRef | None:
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None  # gone already, or another PID namespace (run with hostPID)
        return nf.parse_cgroup(text)

    # --- the loop ----------------------------------------------------------------
    def run(self, interval_s: float, duration_s: float | None = None, stop: threading.Event | None = None,
            beacon_every_s: float = 1.0, report: Callable[[], None] | None = None,
            report_every_s: float = 10.0) -> CollectStats:
        """Tick every ``interval_s`` (on a fixed schedule, skipping missed ticks) until ``stop``
        is set or ``duration_s`` has passed; a beacon before the first tick and then every
        ``beacon_every_s``."""
        stop = stop or threading.Event()
        start = time.monotonic()
        end = math.inf if duration_s is None else start + duration_s
        next_tick = next_beacon = next_report = start
        while not stop.is_set():
            now = time.monotonic()
            if now >= end:
                break
            if now >= next_beacon:
                self.beacon()
                next_beacon += beacon_every_s * (1 + (now - next_beacon) // beacon_every_s)
            if not self.gpus:
                log.error("no GPU left to sample")
                break
            self.tick()
            if report is not None and now >= next_report:
                report()
                next_report = now + report_every_s
            next_tick += interval_s
            now = time.monotonic()
            if next_tick < now:  # a tick took longer than the interval: skip, don't burst
                next_tick += interval_s * (1 + (now - next_tick) // interval_s)
            stop.wait(max(0.0, min(next_tick, end) - now))
        return self.stats
