"""What the live page shows, kept by the worker in bounded memory: each GPU's recent efficiency and cost from
the frames the detection agent reads, the alerts that fire and resolve, recent decisions, and the ingest's
throughput and lag. Pure bookkeeping: every clock reading is an argument.

>>> s = LiveState(points=3)
>>> s.on_flush(samples=0, lag=0, frames_written=0, rejects=0, now_s=10.0)
>>> s.on_flush(samples=5_000, lag=7, frames_written=40, rejects=1, now_s=12.0)
>>> s.ingest()["samples_per_s"], s.ingest()["lag"]
(2500.0, 7)
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from schemas.alerts import Alert
from schemas.frame_messages import FrameMessage, GpuFrame
from streams.decide.rules import Decision

__all__ = ["LiveDecisions", "LiveState", "alert_json", "decision_json"]

MAX_GPUS: Final = 4096  # beyond it the GPU seen least recently is forgotten (memory stays bounded)
MAX_FIRING: Final = 1024
RATE_WINDOW_S: Final = 10.0


def _num(v: float | None) -> float | None:
    """A JSON-safe number: NaN and infinities become null (JSON has neither)."""
    return v if v is not None and math.isfinite(v) else None


@dataclass(slots=True)
class _Gpu:
    tick_ns: int
    grid_ns: int
    frame: GpuFrame | None  # the latest (frames are immutable: kept, not copied; this runs once per GPU-tick)
    # (tick_ns, flops_per_watt, cost_per_tflops): what the two charts draw
    points: deque[tuple[int, float | None, float | None]] = field(default_factory=deque)


class LiveState:
    """The page's view of the worker. ``points``: ticks kept per GPU for the charts (120 at a 1 s grid is two
    minutes; at 4,096 GPUs that is about 70 MB at most)."""

    def __init__(self, points: int = 120, chart_gpus: int = 16, recent: int = 20) -> None:
        if points < 1 or chart_gpus < 1 or recent < 1:
            raise ValueError("points, chart_gpus and recent must be >= 1")
        self.points, self.chart_gpus = points, chart_gpus
        self._gpus: OrderedDict[tuple[str, str], _Gpu] = OrderedDict()
        self._firing: OrderedDict[str, Alert] = OrderedDict()
        self.alerts: deque[Alert] = deque(maxlen=recent)
        self.decisions: deque[Decision] = deque(maxlen=recent)
        self._flushes: deque[tuple[float, int]] = deque(maxlen=64)
        self._ingest: dict[str, int | None] = {"samples": 0, "lag": None, "frames_written": 0, "rejects": 0}

    # -- what the worker feeds it ----------------------------------------------------------------------
    def on_frame(self, m: FrameMessage) -> None:
        for g in m.gpus:
            if g.gpu != "host":
                self._gpu_frame(m, g)

    def _gpu_frame(self, m: FrameMessage, g: GpuFrame) -> None:
        key = (m.node, g.gpu)
        gpu = self._gpus.get(key)
        if gpu is None:
            gpu = self._gpus[key] = _Gpu(0, m.grid_ns, None, deque(maxlen=self.points))
            if len(self._gpus) > MAX_GPUS:
                self._gpus.popitem(last=False)
        else:
            self._gpus.move_to_end(key)
        if m.tick_ns < gpu.tick_ns:
            return  # a replayed older frame: the charts only move forward
        d = g.derived
        gpu.tick_ns, gpu.grid_ns, gpu.frame = m.tick_ns, m.grid_ns, g
        if gpu.points and gpu.points[-1][0] == m.tick_ns:
            gpu.points.pop()  # the same tick again (a replay): its latest values
        gpu.points.append((m.tick_ns, _num(d.get("flops_per_watt")), _num(d.get("cost_per_tflops"))))

    async def send(self, alerts: Sequence[Alert]) -> None:
        """An alert sink beside Kafka and ClickHouse: firing until its resolved message comes."""
        for a in alerts:
            self._recent(a)
            if a.state == "firing":
                self._firing[a.id] = a  # a firing with causes replaces the plain one
                self._firing.move_to_end(a.id)
                if len(self._firing) > MAX_FIRING:
                    self._firing.popitem(last=False)
            else:
                self._firing.pop(a.id, None)

    def _recent(self, a: Alert) -> None:
        # The attribution's follow-up of a firing (same id and state, with causes) takes the firing's place.
        for i, old in enumerate(self.alerts):
            if old.id == a.id and old.state == a.state:
                self.alerts[i] = a
                return
        self.alerts.append(a)

    def on_decisions(self, decisions: Sequence[Decision]) -> None:
        self.decisions.extend(decisions)

    def on_flush(self, samples: int, lag: int | None, frames_written: int, rejects: int, now_s: float) -> None:
        self._flushes.append((now_s, samples))
        self._ingest = {"samples": samples, "lag": lag, "frames_written": frames_written, "rejects": rejects}

    # -- what the page reads ---------------------------------------------------------------------------
    def ingest(self) -> dict[str, Any]:
        """Totals, lag and the sample rate over the flushes of the last ``RATE_WINDOW_S``."""
        rate = None
        if self._flushes:
            t1, s1 = self._flushes[-1]
            older = [(t, s) for t, s in self._flushes if t1 - t <= RATE_WINDOW_S and t < t1]
            if older:
                t0, s0 = older[0]
                rate = (s1 - s0) / (t1 - t0)
        return {**self._ingest, "samples_per_s": rate}

    def gpus(self) -> list[dict[str, Any]]:
        """Each GPU's latest frame, ordered by node and GPU."""
        rows = []
        for (node, gpu), g in sorted(self._gpus.items()):
            if g.frame is None:
                continue
            d, labels = g.frame.derived, g.frame.labels
            cost = d.get("cost_usd")
            rows.append({"node": node, "gpu": gpu, "namespace": labels.get("namespace", ""),
                         "workload": labels.get("workload", ""), "model": labels.get("gpu_model", ""),
                         "region": labels.get("region", ""), "tick_ns": g.tick_ns,
                         "flops_per_watt": _num(d.get("flops_per_watt")),
                         "cost_per_tflops": _num(d.get("cost_per_tflops")), "tflops": _num(d.get("tflops")),
                         "cost_usd_per_h": None if _num(cost) is None else cost * 3600e9 / g.grid_ns,  # type: ignore[operator]
                         "idle": _num(d.get("idle"))})
        return rows

    def series(self) -> dict[str, Any]:
        """The charts' data for the first ``chart_gpus`` GPUs: one time axis (seconds) over every tick any of
        them has, and per GPU its values on that axis (null where it has no frame), as uPlot takes them."""
        chosen = sorted(self._gpus)[: self.chart_gpus]
        ticks = sorted({p[0] for k in chosen for p in self._gpus[k].points})
        at = {t: i for i, t in enumerate(ticks)}
        fpw: list[list[float | None]] = []
        cpt: list[list[float | None]] = []
        for k in chosen:
            a: list[float | None] = [None] * len(ticks)
            b: list[float | None] = [None] * len(ticks)
            for t, f, c in self._gpus[k].points:
                a[at[t]], b[at[t]] = f, c
            fpw.append(a)
            cpt.append(b)
        return {"t": [t / 1e9 for t in ticks], "tick_ns": ticks, "keys": [f"{n}/{g}" for n, g in chosen],
                "flops_per_watt": fpw, "cost_per_tflops": cpt}

    def newest_tick_ns(self) -> int | None:
        """The newest tick any GPU's frame was seen for; None before the first."""
        return max((g.tick_ns for g in self._gpus.values() if g.frame is not None), default=None)

    def firing(self) -> list[Alert]:
        return sorted(self._firing.values(), key=lambda a: (a.ts_ns, a.id), reverse=True)

    def snapshot(self, now_ns: int) -> dict[str, Any]:
        """Everything the page polls for, as one JSON-ready object."""
        return {"v": 1, "now_ns": now_ns, "gpus": self.gpus(), "series": self.series(),
                "firing": [alert_json(a) for a in self.firing()],
                "alerts": [alert_json(a) for a in reversed(self.alerts)],
                "decisions": [decision_json(d) for d in reversed(self.decisions)], "ingest": self.ingest()}


def alert_json(a: Alert) -> dict[str, Any]:
    usd = a.evidence.get("cost_usd_per_h")
    return {"id": a.id, "rule": a.rule, "severity": a.severity, "state": a.state, "node": a.node, "gpu": a.gpu,
            "namespace": a.namespace, "workload": a.workload, "value": _num(a.value),
            "threshold": _num(a.threshold), "baseline": _num(a.baseline), "onset_ts_ns": a.onset_ts_ns,
            "ts_ns": a.ts_ns, "usd_per_h": _num(usd) if isinstance(usd, int | float) else None,
            "cause": a.causes[0].cause if a.causes else None}


def decision_json(d: Decision) -> dict[str, Any]:
    t = d.trigger
    return {"id": t.id, "ts_ns": t.ts_ns, "outcome": d.outcome, "gate": d.gate, "action": t.action,
            "namespace": t.namespace, "workload": t.workload, "current": t.current, "desired": t.desired,
            "reasons": list(t.reasons)}


class LiveDecisions:
    """A decision sink (``agents.decide``) that hands decisions to the page's state."""

    def __init__(self, state: LiveState) -> None:
        self.state = state

    async def send(self, decisions: Sequence[Decision]) -> None:
        self.state.on_decisions(decisions)
