"""From one node's frames message to per-workload summaries (``schemas.workload_samples``).

A GPU belongs to the workload its ``namespace`` and ``workload`` labels name (no
namespace: ``default``); GPUs without a workload label, and the ``host`` pseudo-GPU, are
nobody's. The tap remembers which workloads each node held on its previous tick, so
that a workload leaving a node is said (``present = false``) rather than looking like a
node whose collector stopped.

>>> from schemas.frame_messages import FrameMessage, GpuFrame
>>> tap = WorkloadTap({"gpu_util": 95.0}, lambda model: 64e9)
>>> g = GpuFrame("0", {"workload": "chat", "pod": "chat-0", "class": "inference"},
...              {"sm_active": 0.8, "pcie_tx": 32e9, "request_rate": 500.0}, {"gpu_util_p99": 97.0}, "")
>>> [(s.workload, s.sm_active, s.pcie_util, s.qps, s.spike) for s in
...  tap.summarise(FrameMessage("n1", 0, 1_000_000_000, (g,)), drifting=frozenset())]
[('chat', 0.8, 0.5, 500.0, True)]
>>> [(s.workload, s.present) for s in tap.summarise(FrameMessage("n1", 1_000_000_000, 1_000_000_000, ()),
...                                                  drifting=frozenset())]
[('chat', False)]
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from schemas.frame_messages import FrameMessage, GpuFrame
from schemas.workload_samples import DriftDetail, WorkloadSample
from streams.detect.spike_rule import spike_flags, tick_peaks

DEFAULT_NAMESPACE = "default"
DEFAULT_CLASS = "default"


@dataclass(slots=True)
class _Acc:
    workload_class: str
    gpus: int = 0
    pods: set[str] = field(default_factory=set)
    sm: list[float] = field(default_factory=list)
    pcie: list[float] = field(default_factory=list)
    nccl: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    qps: list[float] = field(default_factory=list)
    power: list[float] = field(default_factory=list)
    spike: bool = False
    drift: list[str] = field(default_factory=list)  # the GPUs with a drift open
    details: list[DriftDetail] = field(default_factory=list)  # the figures of those the caller gave


class WorkloadTap:
    """Stateful only in which workloads each node held last (bounded by ``max_nodes``)."""

    def __init__(self, spike_thresholds: Mapping[str, float], link_bytes_s: Callable[[str], float | None],
                 max_nodes: int = 100_000) -> None:
        self.spike_thresholds = dict(spike_thresholds)
        self.link_bytes_s = link_bytes_s
        self.max_nodes = max_nodes
        self._held: OrderedDict[str, dict[tuple[str, str], str]] = OrderedDict()

    def summarise(self, m: FrameMessage, drifting: Mapping[str, DriftDetail] | Iterable[str]) -> list[WorkloadSample]:
        """The summaries of one frames message; ``drifting``: the node's GPUs with an efficiency drift open
        (with their figures, or just their names)."""
        drift: Mapping[str, DriftDetail | None] = (
            drifting if isinstance(drifting, Mapping) else dict.fromkeys(drifting))
        accs: dict[tuple[str, str], _Acc] = {}
        for g in m.gpus:
            name = g.labels.get("workload")
            if g.gpu == "host" or not name:
                continue
            key = (str(g.labels.get("namespace") or DEFAULT_NAMESPACE), str(name))
            acc = accs.get(key)
            if acc is None:
                acc = accs[key] = _Acc(str(g.labels.get("class") or DEFAULT_CLASS))
            if g.gpu in drift:
                acc.drift.append(g.gpu)
                if (detail := drift[g.gpu]) is not None:
                    acc.details.append(detail)
            self._add(acc, g)
        out = [self._sample(m, key, acc) for key, acc in sorted(accs.items())]
        before = self._held.pop(m.node, {})
        for key in sorted(before.keys() - accs.keys()):
            out.append(WorkloadSample(key[0], key[1], before[key], m.node, m.tick_ns, m.grid_ns, 0, (), None, None,
                                      None, None, None, False, (), present=False))
        if accs:
            self._held[m.node] = {k: a.workload_class for k, a in accs.items()}
            if len(self._held) > self.max_nodes:
                self._held.popitem(last=False)
        return out

    def _add(self, acc: _Acc, g: GpuFrame) -> None:
        v = g.values
        acc.gpus += 1
        pod = g.labels.get("pod")
        if pod:
            acc.pods.add(str(pod))
        if (sm := v.get("sm_active")) is not None:
            acc.sm.append(sm)
        tx, rx = v.get("pcie_tx"), v.get("pcie_rx")
        link = self.link_bytes_s(str(g.labels.get("gpu_model", "")))
        if link and (tx is not None or rx is not None):
            acc.pcie.append(max(tx or 0.0, rx or 0.0) / link)
        if (nccl := v.get("nccl_allreduce_ms")) is not None:
            acc.nccl.append(nccl)
        if (lat := v.get("request_latency_ms")) is not None:
            acc.latency.append(lat)
        if (qps := v.get("request_rate")) is not None:
            acc.qps.append(qps)
        if (power := v.get("power")) is not None and math.isfinite(power):
            acc.power.append(power)
        if any(spike_flags(peak, limit) for _, peak, limit in tick_peaks(g.derived, self.spike_thresholds)):
            acc.spike = True

    @staticmethod
    def _sample(m: FrameMessage, key: tuple[str, str], a: _Acc) -> WorkloadSample:
        return WorkloadSample(key[0], key[1], a.workload_class, m.node, m.tick_ns, m.grid_ns, a.gpus,
                              tuple(sorted(a.pods)), _mean(a.sm), _mean(a.pcie), max(a.nccl, default=None),
                              max(a.latency, default=None), sum(a.qps) if a.qps else None, a.spike,
                              tuple(sorted(a.drift)), power_w=_mean(a.power),
                              drift_detail=tuple(sorted(a.details, key=lambda d: d.gpu)))


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None
