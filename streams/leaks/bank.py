"""The leak detectors of the nodes one detection agent sees, per GPU and per node, bounded in number.

``LeakBank.on_message`` takes one node's frames for one tick and returns what the leak
detectors made of them: their events per GPU (the node's ``"host"`` for checkpoint storms),
and which GPUs' workload changed (their baselines start again, their open episodes end).

>>> from schemas.frame_messages import FrameMessage, GpuFrame
>>> S = 1_000_000_000
>>> bank = LeakBank(LeakParams(), grid_ns=S)
>>> idle = GpuFrame("0", {"pod": "p"}, {"gpu_util": 0.0}, {"idle": 1.0}, "")
>>> out = [bank.on_message(FrameMessage("n", t * S, S, (idle,))) for t in range(601)]
>>> [(t, ev.rule) for t, res in enumerate(out) for _, ev in res.events]
[(599, 'idle_allocated')]
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

from schemas.catalog import HOST_GPU
from schemas.frame_messages import FrameMessage, GpuFrame
from schemas.gpus import spec_for
from streams.leaks.checkpoint import CheckpointStorm
from streams.leaks.episode import LeakEvent, price_per_h, value
from streams.leaks.idle import IdleAllocated
from streams.leaks.memory import Fragmentation
from streams.leaks.nccl import RetransmitStorm, SlowAllreduce
from streams.leaks.params import LeakParams
from streams.leaks.pipeline import PipelineStall
from streams.leaks.serving import BatchingCollapse


class GpuDetector(Protocol):
    rule: str

    def update(self, t_ns: int, g: GpuFrame, price: float | None) -> LeakEvent | None: ...


@dataclass(slots=True)
class LeakResult:
    events: list[tuple[str, LeakEvent]] = field(default_factory=list)  # (gpu, event)
    reset: list[str] = field(default_factory=list)  # GPUs whose workload changed before this tick's events


@dataclass(slots=True)
class _Gpu:
    context: tuple[object, object, object]
    detectors: list[GpuDetector]
    waiting: list[tuple[str, Callable[[], GpuDetector]]]  # made when their first input shows (a stream a GPU
    # never has, as an inference GPU's dataloader, costs nothing per tick)


_ORDER: Final = {rule: i for i, rule in enumerate(("idle_allocated", "pipeline_stall", "batching_collapse",
                                                  "nccl_retransmit_storm", "nccl_slow_allreduce",
                                                  "memory_fragmentation"))}


class LeakBank:
    def __init__(self, params: LeakParams, grid_ns: int, max_entities: int = 1_600_000) -> None:
        self.params, self.grid_ns, self.max_entities = params, grid_ns, max_entities
        self._gpus: OrderedDict[tuple[str, str], _Gpu] = OrderedDict()
        self._nodes: OrderedDict[str, CheckpointStorm] = OrderedDict()

    def on_message(self, m: FrameMessage) -> LeakResult:
        out = LeakResult()
        host: GpuFrame | None = None
        prices: list[float | None] = []
        for g in m.gpus:
            if g.gpu == HOST_GPU:
                host = g
                continue
            key = (m.node, g.gpu)
            ctx = _context(g)
            st = self._gpus.get(key)
            if st is None or st.context != ctx:
                if st is not None:
                    out.reset.append(g.gpu)
                st = self._gpus[key] = _Gpu(ctx, *self._detectors(g))
                if len(self._gpus) > self.max_entities:
                    self._gpus.popitem(last=False)
            self._gpus.move_to_end(key)
            if st.waiting:
                values = g.values
                ready = [w for w in st.waiting if w[0] in values]
                if ready:
                    st.detectors.extend(make() for _, make in ready)
                    # One order whenever each was made: a rebuild from a later tick emits a tick's events alike.
                    st.detectors.sort(key=lambda d: _ORDER[d.rule])
                    st.waiting = [w for w in st.waiting if w[0] not in values]
            price = price_per_h(g, self.grid_ns)  # once for all the GPU's detectors and the node's
            prices.append(price)
            for d in st.detectors:
                ev = d.update(m.tick_ns, g, price)
                if ev is not None:
                    out.events.append((g.gpu, ev))
        if self.params.checkpoint_io_storm.enabled:
            ev = self._node(m, host, prices)
            if ev is not None:
                out.events.append((HOST_GPU, ev))
        return out

    def _detectors(self, g: GpuFrame) -> tuple[list[GpuDetector], list[tuple[str, Callable[[], GpuDetector]]]]:
        """The GPU's detectors: those that run from its first tick, and those waiting for their first input."""
        p, grid = self.params, self.grid_ns
        spec = spec_for(str(g.labels.get("gpu_model") or ""))
        memory_mib = spec.memory_gib * 1024.0 if spec is not None else None
        now: list[GpuDetector] = [IdleAllocated(p.idle_allocated, grid)] if p.idle_allocated.enabled else []
        later: list[tuple[bool, str, Callable[[], GpuDetector]]] = [
            (p.pipeline_stall.enabled, "dataloader_wait_ms", lambda: PipelineStall(p.pipeline_stall, grid)),
            (p.batching_collapse.enabled, "queue_depth", lambda: BatchingCollapse(p.batching_collapse, grid)),
            (p.nccl_retransmit_storm.enabled, "nccl_retries", lambda: RetransmitStorm(p.nccl_retransmit_storm, grid)),
            (p.nccl_slow_allreduce.enabled, "nccl_allreduce_ms", lambda: SlowAllreduce(p.nccl_slow_allreduce, grid)),
            (p.memory_fragmentation.enabled, "torch_reserved",
             lambda: Fragmentation(p.memory_fragmentation, grid, memory_mib)),
        ]
        return now, [(needs, make) for on, needs, make in later if on]

    def _node(self, m: FrameMessage, host: GpuFrame | None, gpu_prices: list[float | None]) -> LeakEvent | None:
        det = self._nodes.get(m.node)
        if det is None:
            if host is None:
                return None
            det = self._nodes[m.node] = CheckpointStorm(self.params.checkpoint_io_storm, self.grid_ns)
            if len(self._nodes) > self.max_entities:
                self._nodes.popitem(last=False)
        self._nodes.move_to_end(m.node)
        gpus = [g for g in m.gpus if g.gpu != HOST_GPU]
        disk = value(host, "disk_write") if host is not None else None
        utils = [u for g in gpus if (u := value(g, "gpu_util")) is not None]
        states = [value(g, "torch_allocated") for g in gpus]
        prices = [p for p in gpu_prices if p is not None]
        state = math.fsum(s for s in states if s is not None) if states and None not in states else None
        return det.update(m.tick_ns, disk, sum(utils) / len(utils) if utils else None, state,
                          math.fsum(prices) if prices else None)


def _context(g: GpuFrame) -> tuple[object, object, object]:
    """The workload holding the GPU: a new one starts the GPU's detectors again."""
    lab = g.labels
    return lab.get("namespace") or "", lab.get("workload") or "", lab.get("pod") or ""  # absent, None, "": alike
