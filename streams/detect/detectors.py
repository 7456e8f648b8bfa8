"""From frames messages to alerts: the detectors of one set of nodes, as plain deterministic objects.

``Detectors.on_message`` takes one node's frames for one tick and returns the alert
messages they cause. Everything here is a function of the frame sequence: the same
messages in the same order give the same alerts with the same ids, which is what lets
the Faust agent rebuild its state after a crash or a rebalance by replaying recent
frames, instead of trusting Faust's changelog tables (see ``agents.detect.agent``).

Rules:

- ``efficiency_drift`` (per GPU): FLOPS/Watt below its baseline by more than the
  configured drop for the configured hold (``streams.detect.drift``). A frame is suspect (its
  value does not move the baseline) when its clock correction is more uncertain than
  ``max_uncertainty_us``. The workload context is namespace/workload/pod/precision: when
  it changes, the baseline is learnt again and nothing fires meanwhile.
- the seven leak and trap rules of ``streams.leaks`` (``idle_allocated``, ``pipeline_stall``,
  ``batching_collapse``, ``nccl_retransmit_storm``, ``nccl_slow_allreduce``,
  ``memory_fragmentation`` per GPU; ``checkpoint_io_storm`` per node, on its ``"host"``), each
  with the money it burns in ``evidence.cost_usd_per_h``. When a GPU's workload changes, its
  open leak episodes resolve and the detectors learn again.
- ``util_spike`` / ``sm_spike`` (per GPU): the L1 engine's sliding-window P99 of
  gpu_util / sm_active within the tick (``gpu_util_p99`` / ``sm_active_p99``, computed by
  the ingest from the sub-second samples) above its threshold. It fires once per episode
  and resolves at the first tick below.

A message whose tick is not newer than the node's last one is a replayed duplicate and
is ignored, so at-least-once delivery of frames never doubles an alert.

>>> from schemas.frame_messages import FrameMessage, GpuFrame
>>> d = Detectors(DetectParams(), grid_ns=1_000_000_000)
>>> spike = GpuFrame("0", {}, {}, {"gpu_util_p99": 99.0}, "")
>>> [a.rule for a in d.on_message(FrameMessage("n", 1_000_000_000, 1_000_000_000, (spike,)))]
['util_spike']
>>> d.on_message(FrameMessage("n", 1_000_000_000, 1_000_000_000, (spike,)))  # a replayed duplicate
[]
>>> calm = GpuFrame("0", {}, {}, {"gpu_util_p99": 40.0}, "")
>>> [a.state for a in d.on_message(FrameMessage("n", 2_000_000_000, 1_000_000_000, (calm,)))]
['resolved']
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from schemas.alerts import Alert, Cause, Severity, make_alert
from schemas.frame_messages import FrameMessage, GpuFrame
from schemas.workload_samples import DriftDetail
from streams.attribution.context import EventBook, Happening
from streams.attribution.rank import RULE_CAUSES, SYMPTOM, AttributionParams, context_causes, rank, series_witnesses
from streams.attribution.window import SeriesWindow
from streams.detect.drift import DriftEvent
from streams.detect.drift_bank import DriftBank
from streams.detect.drift_params import DriftParams
from streams.detect.spike_rule import (
    SPIKE_RULES,
    SPIKE_THRESHOLDS,
    SpikeParams,
    spike_ended,
    spike_evidence,
    spike_flags,
    tick_peaks,
)
from streams.leaks.bank import LeakBank
from streams.leaks.episode import LeakEvent
from streams.leaks.params import RULES as LEAK_RULES
from streams.leaks.params import LeakParams

DRIFT_RULE: Final = "efficiency_drift"


@dataclass(frozen=True, slots=True)
class DetectParams:
    drift: DriftParams = field(default_factory=DriftParams)
    spike_thresholds: Mapping[str, float] = field(default_factory=lambda: dict(SPIKE_THRESHOLDS))
    spike: SpikeParams = field(default_factory=SpikeParams)  # how the ingest measured the peaks (alert evidence)
    max_uncertainty_us: float = 100_000.0  # a frame timed worse than this does not teach the baseline
    drift_severity: Severity = "warning"
    leak_severity: Severity = "warning"
    spike_severity: Severity = "info"
    max_nodes: int = 100_000
    leaks: LeakParams = field(default_factory=LeakParams)
    attribution: AttributionParams = field(default_factory=AttributionParams)


@dataclass(slots=True)
class AlertTally:
    """Alert messages by rule: the one count behind the engine's stats, the agent's progress line and
    ``flopwatch_alerts_sent_total``."""

    by_rule: dict[str, int] = field(default_factory=dict)

    def count(self, alerts: Iterable[Alert]) -> None:
        for a in alerts:
            self.by_rule[a.rule] = self.by_rule.get(a.rule, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.by_rule.values())


def context_of(labels: Mapping[str, Any]) -> str:
    """The workload identity a baseline belongs to."""
    return "/".join(str(labels.get(k, "")) for k in ("namespace", "workload", "pod", "precision"))


class Detectors:
    """Detector state for the nodes one agent sees; bounded (least recently seen nodes go first)."""

    def __init__(self, params: DetectParams, grid_ns: int, events: EventBook | None = None) -> None:
        self.params = params
        self.grid_ns = grid_ns
        self.events = events if events is not None else EventBook()  # Kubernetes events, fed by the agent
        self._happened = EventBook(per_node=256, max_nodes=params.max_nodes)  # our own alerts, label changes
        self._windows: OrderedDict[tuple[str, str], SeriesWindow] = OrderedDict()
        self._labels: dict[tuple[str, str], tuple[str, str]] = {}
        self._first_gpu: dict[str, str] = {}  # bounded with the nodes of _last_tick
        self._pending: list[tuple[int, tuple[str, str, str], str]] = []  # (due tick, open key, alert id)
        self.drift = DriftBank(params.drift, grid_ns, max_entities=params.max_nodes * 16)
        self._last_tick: OrderedDict[str, int] = OrderedDict()
        self.leaks = LeakBank(params.leaks, grid_ns, max_entities=params.max_nodes * 16)
        self._leaks_on = params.leaks.any_enabled
        self._open: dict[tuple[str, str, str], Alert] = {}  # (rule, node, gpu) -> its firing message
        self.stats = AlertTally()

    def on_message(self, m: FrameMessage) -> list[Alert]:
        last = self._last_tick.get(m.node)
        if last is not None and m.tick_ns <= last:
            return []
        self._last_tick[m.node] = m.tick_ns
        self._last_tick.move_to_end(m.node)
        if len(self._last_tick) > self.params.max_nodes:
            gone, _ = self._last_tick.popitem(last=False)
            self._open = {k: a for k, a in self._open.items() if k[1] != gone}
            self._first_gpu.pop(gone, None)
        out: list[Alert] = []
        if self.params.attribution.enabled:
            out += self._attribute_due(m)
            self._remember(m)
        for g in m.gpus:
            if g.gpu == "host":
                continue
            out += self._spikes(m, g)
            out += self._drift(m, g)
        out += self._leaks(m)
        if self.params.attribution.enabled:
            self._note_firings(m, out)
        self.stats.count(out)
        return out

    # -- attribution --------------------------------------------------------------------------------------------
    def _remember(self, m: FrameMessage) -> None:
        """The tick's series into each GPU's window; label changes into the node's book."""
        host = next((g.values for g in m.gpus if g.gpu == "host"), {})
        ticks = self.params.attribution.ticks(self.grid_ns)
        first = next((g.gpu for g in m.gpus if g.gpu != "host"), None)
        if first is not None:
            self._first_gpu[m.node] = first
        for g in m.gpus:
            if g.gpu == "host":
                continue
            key = (m.node, g.gpu)
            w = self._windows.get(key)
            if w is None:
                w = self._windows[key] = SeriesWindow(ticks)
                if len(self._windows) > self.params.max_nodes * 16:
                    gone, _ = self._windows.popitem(last=False)
                    self._labels.pop(gone, None)
            else:
                self._windows.move_to_end(key)
            w.push(m.tick_ns, g.values, host, g.derived.get("flops_per_watt"))
            now = (str(g.labels.get("workload") or ""), str(g.labels.get("pod") or ""))
            before = self._labels.get(key)
            self._labels[key] = now
            if before is not None and before != now:
                what = "workload_changed" if before[0] != now[0] else "pod_changed"
                change = f"{before[0] or '-'}/{before[1] or '-'} -> {now[0] or '-'}/{now[1] or '-'}"
                self._happened.add(Happening(m.node, m.tick_ns, what, "labels", now[1], (g.gpu,), change))

    def _note_firings(self, m: FrameMessage, alerts: list[Alert]) -> None:
        due = m.tick_ns + self.params.attribution.delay_ticks * self.grid_ns
        for a in alerts:
            if a.state == "firing" and not a.causes:
                self._happened.add(Happening(a.node, a.onset_ts_ns, a.rule, "detection", "", (a.gpu,), a.id))
                self._pending.append((due, (a.rule, a.node, a.gpu), a.id))

    def _attribute_due(self, m: FrameMessage) -> list[Alert]:
        if not self._pending:
            return []
        out, keep = [], []
        for due, key, aid in self._pending:
            if key[1] != m.node:
                keep.append((due, key, aid))
            elif due <= m.tick_ns:
                a = self._open.get(key)
                if a is not None and a.id == aid and not a.causes:
                    causes = self.causes(a)
                    if causes:
                        a = self._open[key] = a.attributed(causes)
                        out.append(a)
            else:
                keep.append((due, key, aid))
        self._pending = keep[-10_000:]
        return out

    def causes(self, a: Alert) -> tuple[Cause, ...]:
        """The likely causes of ``a`` from what this object has seen of its node (see ``streams.attribution``)."""
        p = self.params.attribution
        gpu = a.gpu if a.gpu != "host" else self._first_gpu.get(a.node, a.gpu)  # a node's alert: its first GPU
        w = self._windows.get((a.node, gpu))
        witnesses = []
        if w is not None and len(w) and (a.rule in SYMPTOM or a.rule in RULE_CAUSES):  # no copy for a spike
            times, block = w.ordered()
            keep = times <= a.ts_ns
            witnesses += series_witnesses(a.rule, times[keep], block[:, keep], a.onset_ts_ns, p)
        lo = a.onset_ts_ns - int(p.event_window_s * 1e9)
        pod = self._labels.get((a.node, gpu), ("", ""))[1]
        around = [h for h in self._happened.around(a.node, lo, a.ts_ns)
                  if not (h.type == "detection" and (h.detail == a.id or (h.reason == a.rule and gpu in h.gpus)))]
        around += list(self.events.around(a.node, lo, a.ts_ns))
        witnesses += context_causes(around, gpu, pod, a.onset_ts_ns, p)
        return rank(witnesses, p.max_causes)

    def adopt(self, sent: Alert) -> None:
        """Take ``sent``, a firing message of an open episode as it was sent before a restart, as the episode's
        own: its resolution then repeats the causes consumers were given."""
        key = (sent.rule, sent.node, sent.gpu)
        a = self._open.get(key)
        if sent.state == "firing" and a is not None and a.id == sent.id:
            self._open[key] = sent

    @property
    def firing(self) -> list[Alert]:
        return list(self._open.values())

    @property
    def firing_count(self) -> int:
        return len(self._open)

    def drifting(self, node: str) -> dict[str, DriftDetail]:
        """The node's GPUs with an ``efficiency_drift`` episode open, with the figures it was confirmed on."""
        out = {}
        for (rule, n, g), a in self._open.items():
            if n == node and rule == DRIFT_RULE:
                load, lo, hi = (_number(a.evidence.get(k)) for k in ("load_w", "band_lo_w", "band_hi_w"))
                out[g] = DriftDetail(g, a.value, a.baseline if a.baseline is not None else a.threshold, load, lo, hi)
        return out

    def _spikes(self, m: FrameMessage, g: GpuFrame) -> list[Alert]:
        out = []
        end = m.tick_ns + self.grid_ns
        for sensor, peak, limit in tick_peaks(g.derived, self.params.spike_thresholds):
            rule = SPIKE_RULES[sensor]
            key = (rule, m.node, g.gpu)
            open_ = self._open.get(key)
            if spike_flags(peak, limit) and open_ is None:
                a = make_alert(rule, self.params.spike_severity, m.node, g.gpu, value=peak, threshold=limit,
                               onset_ts_ns=m.tick_ns, ts_ns=end, workload=_label(g, "workload"),
                               namespace=_label(g, "namespace"),
                               evidence=spike_evidence(self.params.spike))
                self._open[key] = a
                out.append(a)
            elif open_ is not None and spike_ended(peak, limit):
                del self._open[key]
                out.append(open_.resolved(end, value=peak if peak is not None else open_.value))
        return out

    def _leaks(self, m: FrameMessage) -> list[Alert]:
        if not self._leaks_on:  # every rule off: no per-GPU bookkeeping either
            return []
        res = self.leaks.on_message(m)
        if not res.events and not res.reset:
            return []
        out = []
        end = m.tick_ns + self.grid_ns
        for gpu in res.reset:  # a new workload: what the old one leaked has ended
            for rule in LEAK_RULES:
                open_ = self._open.pop((rule, m.node, gpu), None)
                if open_ is not None:
                    out.append(open_.resolved(max(end, open_.ts_ns)))
        frames = {g.gpu: g for g in m.gpus}
        for gpu, ev in res.events:
            g = frames.get(gpu)
            if gpu == "host":  # a node's leak: the labels of its first GPU that has a workload
                g = next((f for f in m.gpus if f.gpu != "host" and _label(f, "workload")), g)
            out.append(self._leak_alert(m, gpu, g, ev))
        return out

    def _leak_alert(self, m: FrameMessage, gpu: str, g: GpuFrame | None, ev: LeakEvent) -> Alert:
        key = (ev.rule, m.node, gpu)
        end = ev.tick_ns + self.grid_ns
        workload = _label(g, "workload") if g is not None else None
        namespace = _label(g, "namespace") if g is not None else None
        if ev.state == "firing":
            a = make_alert(ev.rule, self.params.leak_severity, m.node, gpu, value=ev.value, threshold=ev.threshold,
                           onset_ts_ns=ev.onset_ns, ts_ns=end, baseline=ev.baseline, workload=workload,
                           namespace=namespace, evidence=ev.evidence)
            self._open[key] = a
            return a
        firing = self._open.pop(key, None)
        if firing is None:
            firing = make_alert(ev.rule, self.params.leak_severity, m.node, gpu, value=ev.value,
                                threshold=ev.threshold, onset_ts_ns=ev.onset_ns, ts_ns=end, baseline=ev.baseline,
                                workload=workload, namespace=namespace)
        return firing.resolved(max(end, firing.ts_ns), value=ev.value, evidence=ev.evidence)

    def _drift(self, m: FrameMessage, g: GpuFrame) -> list[Alert]:
        value = g.derived.get("flops_per_watt")
        suspect = g.clock_uncertainty_us > self.params.max_uncertainty_us
        events = self.drift.update((m.node, g.gpu), m.tick_ns, value, context_of(g.labels), suspect,
                                   g.values.get("power"), g.fpw_sub)
        return [self._drift_alert(m, g, ev) for ev in events]

    def _drift_alert(self, m: FrameMessage, g: GpuFrame, ev: DriftEvent) -> Alert:
        key = (DRIFT_RULE, m.node, g.gpu)
        end = ev.tick_ns + self.grid_ns
        evidence = {**ev.evidence, "drop": self.params.drift.drop, "hold_ms": self.params.drift.hold_ns // 1_000_000}
        if ev.state == "firing":
            # The hold completed at ev.at_ns when the frames carried sub-tick profiles: that is the alert's time.
            a = make_alert(DRIFT_RULE, self.params.drift_severity, m.node, g.gpu, value=ev.value,
                           threshold=ev.threshold, onset_ts_ns=ev.onset_ns, ts_ns=ev.at_ns or end,
                           baseline=ev.baseline,
                           workload=_label(g, "workload"), namespace=_label(g, "namespace"), evidence=evidence)
            self._open[key] = a
            return a
        firing = self._open.pop(key, None)
        if firing is None:  # resolved without a firing this object saw (cannot happen in one sequence)
            firing = make_alert(DRIFT_RULE, self.params.drift_severity, m.node, g.gpu, value=ev.value,
                                threshold=ev.threshold, onset_ts_ns=ev.onset_ns, ts_ns=end, baseline=ev.baseline,
                                workload=_label(g, "workload"), namespace=_label(g, "namespace"))
        return firing.resolved(max(end, firing.ts_ns), value=ev.value, evidence=evidence)


def _number(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) else None


def _label(g: GpuFrame, key: str) -> str | None:
    v = g.labels.get(key)
    return str(v) if v not in (None, "") else None
