"""What the NVML collector reads, which catalog sensor each reading feeds, and in what unit.

Pure: no NVML, no files, no clock. ``agents.collect.nvml`` calls the driver and hands
the raw numbers here; the same conversions run in the unit tests.

Mapping (NVML call -> sensor, conversion):

==============================================  ===========================  =====================
NVML                                            sensor                       conversion
==============================================  ===========================  =====================
nvmlDeviceGetUtilizationRates().gpu             gpu_util                     % as is
nvmlDeviceGetMemoryInfo().used                  fb_used                      bytes -> MiB
nvmlDeviceGetPowerUsage                         power                        mW -> W
nvmlDeviceGetTemperature(GPU)                   temperature                  degC as is
nvmlDeviceGetClockInfo(SM)                      sm_clock                     MHz as is
FieldValues PCIE_COUNT_TX_BYTES / RX_BYTES      pcie_tx / pcie_rx            byte counter -> B/s
nvmlDeviceGetPcieThroughput(TX / RX), fallback  pcie_tx / pcie_rx            KB/s -> B/s (KB=1024)
FieldValues NVLINK_THROUGHPUT_DATA_TX / RX      nvlink_tx / nvlink_rx        KiB counter -> B/s
nvmlDeviceGetTotalEccErrors(volatile)           ecc_errors                   corrected + uncorrected
XID critical error events                       xid_errors                   code; 0 when none fired
nvmlDeviceGetComputeRunningProcesses            fb_used of ``<gpu>/pid:<pid>``  bytes -> MiB
==============================================  ===========================  =====================

PCIe: the byte counters (field values, recent drivers) cost nothing to read. The
fallback, ``nvmlDeviceGetPcieThroughput``, measures over a 20 ms window inside the call,
so the collector reads it about once a second per GPU, staggered across GPUs
(``pcie_fallback_due``), to keep a 100 ms tick of 8 GPUs within its interval.

Total energy (nvmlDeviceGetTotalEnergyConsumption) is not read: the catalog has no
energy stream, and the pipeline derives ``energy_j`` from ``power``.

Per-process memory: NVML's ``usedGpuMemory`` is framebuffer memory held by the
process (its CUDA context and whatever its allocator reserved), the same quantity as
the GPU's ``memory.used``, so it is published as ``fb_used``, in MiB. It is *not*
``torch_allocated`` (tensors only) nor ``torch_reserved`` (the caching allocator
only, no context). A process's series gets its own gpu identity ``<gpu>/pid:<pid>``
because the pipeline keys series by (node, gpu, sensor) and keeps one label set per
(node, gpu): sent on the GPU's own id it would be mixed into the GPU's total.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from schemas.catalog import BY_NAME
from schemas.records import Labels, LabelValue

MIB: Final = 1024 * 1024
KIB: Final = 1024  # NVML documents PCIe throughput in "KB/s"; its KB is 1024 bytes
MW_PER_W: Final = 1000.0


@dataclass(frozen=True, slots=True)
class Field:
    """One thing the collector asks NVML for; ``sensors`` are the catalog streams it feeds."""

    name: str
    sensors: tuple[str, ...]


FIELDS: Final[tuple[Field, ...]] = (
    Field("utilization", ("gpu_util",)),
    Field("memory", ("fb_used",)),
    Field("power", ("power",)),
    Field("temperature", ("temperature",)),
    Field("sm_clock", ("sm_clock",)),
    Field("pcie", ("pcie_tx", "pcie_rx")),  # byte counters
    Field("pcie_tx", ("pcie_tx",)),  # the blocking throughput call, when the counters are missing
    Field("pcie_rx", ("pcie_rx",)),
    Field("nvlink", ("nvlink_tx", "nvlink_rx")),
    Field("ecc", ("ecc_errors",)),
    Field("xid", ("xid_errors",)),
    Field("processes", ("fb_used",)),
    Field("mig", ()),  # MIG mode: whether instances are sampled as GPUs of their own
)
FIELD_NAMES: Final = tuple(f.name for f in FIELDS)

for _f in FIELDS:  # a renamed catalog sensor must break here, not on the wire
    for _s in _f.sensors:
        if _s not in BY_NAME:
            raise ImportError(f"nvml_fields: field {_f.name!r} names {_s!r}, which is not in the catalog")


def mw_to_w(milliwatts: float) -> float:
    """Milliwatts (NVML's power unit) to watts.

    >>> mw_to_w(312450)
    312.45
    """
    return milliwatts / MW_PER_W


def bytes_to_mib(n: float) -> float:
    """Bytes to MiB (fb_used's unit).

    >>> bytes_to_mib(3 * 1024 * 1024)
    3.0
    """
    return n / MIB


def kb_per_s_to_b_per_s(kb_per_s: float) -> float:
    """NVML's KB/s to B/s.

    >>> kb_per_s_to_b_per_s(2)
    2048.0
    """
    return float(kb_per_s) * KIB


def ecc_total(corrected: int | None, uncorrected: int | None) -> float | None:
    """Volatile corrected + uncorrected errors; ``None`` when neither was readable.

    >>> ecc_total(3, 1), ecc_total(None, 2), ecc_total(None, None)
    (4.0, 2.0, None)
    """
    if corrected is None and uncorrected is None:
        return None
    return float((corrected or 0) + (uncorrected or 0))


def counter_rate(prev: tuple[int, int] | None, ts_ns: int, count: int, unit_bytes: int = 1) -> float | None:
    """B/s between two readings ``(ts_ns, count)`` of a cumulative counter of ``unit_bytes`` units.

    ``None`` for the first reading, a reading no later than the previous one, or a
    counter that went down (a driver reload or wrap restarts it).

    >>> counter_rate((0, 100), 500_000_000, 600, KIB)
    1024000.0
    >>> counter_rate(None, 1, 5), counter_rate((0, 9), 10, 5)
    (None, None)
    """
    if prev is None:
        return None
    t0, c0 = prev
    if ts_ns <= t0 or count < c0:
        return None
    return (count - c0) * unit_bytes * 1e9 / (ts_ns - t0)


def pcie_fallback_due(tick: int, gpu_index: int, every: int) -> bool:
    """Whether GPU ``gpu_index`` reads the blocking PCIe throughput call on ``tick``: once
    every ``every`` ticks, GPUs staggered so that few block in the same tick.

    >>> [[i for i in range(4) if pcie_fallback_due(t, i, 2)] for t in range(3)]
    [[0, 2], [1, 3], [0, 2]]
    """
    return (tick + gpu_index) % max(1, every) == 0


def in_range(sensor: str, value: float) -> bool:
    """Whether ``value`` is inside the catalog's range for ``sensor`` (a bad reading is
    dropped by the collector rather than dead-lettered downstream).

    >>> in_range("power", 300.0), in_range("temperature", 400.0)
    (True, False)
    """
    spec = BY_NAME[sensor]
    return spec.lo <= value <= spec.hi


class UnsupportedMemo:
    """(gpu, field) pairs NVML refused as unsupported: asked once, never again.

    >>> memo = UnsupportedMemo()
    >>> memo.wanted("GPU-1", "nvlink"), memo.mark("GPU-1", "nvlink"), memo.mark("GPU-1", "nvlink")
    (True, True, False)
    >>> memo.wanted("GPU-1", "nvlink"), memo.wanted("GPU-2", "nvlink")
    (False, True)
    """

    __slots__ = ("_off",)

    def __init__(self) -> None:
        self._off: set[tuple[str, str]] = set()

    def wanted(self, gpu: str, field: str) -> bool:
        return (gpu, field) not in self._off

    def mark(self, gpu: str, field: str) -> bool:
        """Record the refusal; True the first time (the caller logs it then)."""
        key = (gpu, field)
        if key in self._off:
            return False
        self._off.add(key)
        return True

    def off(self, gpu: str) -> list[str]:
        """The fields switched off for ``gpu``, in FIELDS order."""
        return [f for f in FIELD_NAMES if (gpu, f) in self._off]


# --- per-process attribution -------------------------------------------------

@dataclass(frozen=True, slots=True)
class PodRef:
    """The Kubernetes pod (UID) and container a process runs in, from its cgroup path."""

    pod_uid: str
    container_id: str | None = None


_UID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
# systemd driver (cgroup v2 or v1): kubepods-burstable-pod<uid with _>.slice, then
# <runtime>-<id>.scope; cgroupfs driver (v1): /kubepods/<qos>/pod<uid>/<id>.
_SYSTEMD_POD: Final = re.compile(rf"kubepods(?:-[a-z]+)?-pod({_UID})\.slice")
_SYSTEMD_CTR: Final = re.compile(r"(?:cri-containerd|docker|crio|containerd)-([0-9a-fA-F]{12,64})\.scope")
_CGROUPFS: Final = re.compile(rf"/kubepods(?:/[a-z]+)?/pod({_UID})(?:/([0-9a-fA-F]{{12,64}}))?")


def parse_cgroup(text: str) -> PodRef | None:
    """The pod a process belongs to, from the text of ``/proc/<pid>/cgroup``; None outside Kubernetes.

    >>> v2 = ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_0000_4a5b_8c9d_"
    ...       "0123456789ab.slice/cri-containerd-" + "ab" * 32 + ".scope")
    >>> parse_cgroup(v2) == PodRef("1b2c3d4e-0000-4a5b-8c9d-0123456789ab", "ab" * 32)
    True
    >>> v1 = "12:memory:/kubepods/burstable/pod1b2c3d4e-0000-4a5b-8c9d-0123456789ab/" + "cd" * 32
    >>> parse_cgroup(v1).container_id == "cd" * 32
    True
    >>> parse_cgroup("0::/user.slice/user-1000.slice/session-3.scope") is None
    True
    """
    # Hybrid hosts list several hierarchies; the first line naming a pod decides, and
    # lines with a container id win over ones without (the pod slice of a sandbox).
    best: PodRef | None = None
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        ref = _parse_path(path)
        if ref is None:
            continue
        if ref.container_id is not None:
            return ref
        if best is None:
            best = ref
    return best


def _parse_path(path: str) -> PodRef | None:
    m = _SYSTEMD_POD.search(path)
    if m:
        ctr = _SYSTEMD_CTR.search(path, m.end())
        return PodRef(m.group(1).replace("_", "-").lower(), ctr.group(1).lower() if ctr else None)
    m = _CGROUPFS.search(path)
    if m:
        return PodRef(m.group(1).replace("_", "-").lower(), m.group(2).lower() if m.group(2) else None)
    return None


@dataclass(frozen=True, slots=True)
class ProcessUse:
    """One compute process on a GPU: NVML's pid and memory, and its pod if it has one."""

    pid: int
    used_bytes: int | None
    pod: PodRef | None = None


def process_gpu_id(gpu: str, pid: int) -> str:
    """The gpu identity of a process's series (see the module docstring for why).

    >>> process_gpu_id("GPU-8f1c", 4711)
    'GPU-8f1c/pid:4711'
    """
    return f"{gpu}/pid:{pid}"


def process_labels(base: Mapping[str, LabelValue], proc: ProcessUse) -> Labels:
    """The labels of one process's series: the GPU's, plus pid and pod (the pod UID: the
    collector never learns pod names; the Kubernetes collector maps UIDs to names).

    >>> process_labels({"gpu_model": "H200"}, ProcessUse(7, 1, PodRef("uid-1")))
    {'gpu_model': 'H200', 'pid': 7, 'pod': 'uid-1'}
    """
    out: Labels = {**base, "pid": proc.pid}
    if proc.pod is not None:
        out["pod"] = proc.pod.pod_uid
    return out


def gpu_labels(base: Mapping[str, LabelValue], procs: Sequence[ProcessUse]) -> Labels:
    """The GPU series' own labels: the pid when one process alone uses it, the pod when
    one pod alone does.

    A shared (time-sliced) GPU belongs to no single pod; its processes' own series carry
    their pods instead.

    >>> a, b = ProcessUse(1, 10, PodRef("p")), ProcessUse(2, 10, PodRef("p"))
    >>> gpu_labels({"region": "eu"}, [a]), gpu_labels({"region": "eu"}, [a, b])
    ({'region': 'eu', 'pid': 1, 'pod': 'p'}, {'region': 'eu', 'pod': 'p'})
    >>> gpu_labels({}, [a, ProcessUse(3, 10, PodRef("q"))]), gpu_labels({}, [ProcessUse(4, 1)])
    ({}, {'pid': 4})
    """
    out: Labels = dict(base)
    if len(procs) == 1:
        out["pid"] = procs[0].pid
    pods = {p.pod.pod_uid if p.pod is not None else None for p in procs}
    if len(pods) == 1:
        pod = next(iter(pods))
        if pod is not None:
            out["pod"] = pod
    return out


def label_key(labels: Labels | None) -> tuple[tuple[str, str | int], ...]:
    """A hashable, order-free form of a label set.

    >>> label_key({"b": 1, "a": "x"}) == label_key({"a": "x", "b": 1})
    True
    """
    return tuple(sorted(labels.items())) if labels else ()


def merge_processes(procs: Iterable[tuple[int, int | None]]) -> list[tuple[int, int | None]]:
    """(pid, bytes) pairs with one entry per pid, memory summed, in first-seen order.

    NVML lists a process once per context (a process on two MIG compute instances of one
    GPU appears twice); an unknown amount (None, as NVML reports under some drivers or
    without permission) stays unknown.

    >>> merge_processes([(3, 10), (1, None), (3, 5), (1, 4)])
    [(3, 15), (1, None)]
    """
    out: dict[int, int | None] = {}
    seen: set[int] = set()
    for pid, used in procs:
        if pid not in seen:
            seen.add(pid)
            out[pid] = used
        else:
            prev = out[pid]
            out[pid] = None if prev is None or used is None else prev + used
    return list(out.items())
