"""One workload's decision rules, gates and L3 limits, stepped once per evaluated tick.

How the rules combine (each evaluated tick, in this order):

1. **Rollback** first: within ``watch_s`` after a scale-down this engine took, a tick whose
   latency is above the class SLA makes a ``rollback`` to the replicas before it (its
   ``reverses`` names the scale-down). Cooldowns and the rate limit do not hold a rollback:
   it repairs a decision of ours; staleness does.
2. **Rebalance** once per drift episode: the first tick at which a GPU of the workload has
   a confirmed efficiency drift open (the detection agent's ``efficiency_drift``). A rebalance
   restarts or moves the work, so it has guards of its own: at most one per workload per
   ``rebalance_cooldown_s`` (an episode that opens and ends inside it gets none; one still
   open when it ends gets its rebalance then), never while the workload's mean power moved
   more than ``rebalance_load_move`` within ``rebalance_load_s`` (a load change, not a
   drift), and it spends the rate limit's tokens like any action. Its evidence states, per
   drifting GPU, the FLOPS/W, the baseline at that load and the power it was judged at.
3. **Scale up** when any up-rule holds (SM activity, PCIe, NCCL AllReduce; for online
   classes p95 latency and QPS per replica over their windows); all that hold are the
   reasons. Desired = the largest ``ceil(current x value / threshold)`` of them, at least
   current + 1, at most current + the class's ``max_step_up`` and the namespace's max.
4. Otherwise **scale down** when the metrics gate has passed ``down_checks`` checks in a row
   (SM activity below ``sm_active_down`` at every check, every ``check_interval_s``), and
   then every gate in turn: stale data, class (``scale_down``), QoS (guaranteed never shrinks),
   quota min, no L1 spike within ``spike_window_s``, the SLA (p95 within headroom, and the
   QPS per replica after the change still under the up threshold), stabilisation (the
   highest recommendation of the last ``stabilisation_s`` must be below current, and
   becomes desired), cooldown and repeat spacing, and the rate limit.

A decision held by a gate is ``withheld`` with the first gate that held it (the evidence
lists every failing gate); a withheld record is made when the held action or its gate
changes, not on every tick. An action resets the rule windows and the metrics gate: the
next decision needs fresh evidence at the new size.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from schemas.triggers import Action, Before, Trigger, make_trigger
from schemas.workload_samples import DriftDetail
from streams.decide.params import DecideParams, S
from streams.decide.window import Held, TokenBucket, Window

Outcome = Literal["taken", "withheld"]
STALE_GATES: Final = ("stale_node", "stale_data")


@dataclass(frozen=True, slots=True)
class WorkloadTick:
    """A workload's figures at one tick, over the nodes that reported it."""

    tick_ns: int
    grid_ns: int
    replicas: int
    gpus: int
    sm_active: float | None
    pcie_util: float | None
    nccl_ms: float | None
    latency_ms: float | None
    qps: float | None
    spike: bool
    drift: tuple[str, ...]
    stale: str | None = None  # "stale_node" | "stale_data": nothing is taken on this tick
    power_w: float | None = None  # mean power over the GPUs
    drift_detail: tuple[tuple[str, DriftDetail], ...] = ()  # (node, figures) of each drifting GPU

    @property
    def end_ns(self) -> int:
        return self.tick_ns + self.grid_ns


@dataclass(frozen=True, slots=True)
class Decision:
    trigger: Trigger  # for a withheld decision: the trigger it would have been
    outcome: Outcome
    gate: str | None = None  # the first gate that held it
    gates: tuple[str, ...] = ()  # every gate that failed


class WorkloadRules:
    def __init__(self, params: DecideParams, namespace: str, workload: str, workload_class: str,
                 grid_ns: int) -> None:
        r = params.rules
        self.params, self.namespace, self.workload, self.workload_class = params, namespace, workload, workload_class
        self.grid_ns = grid_ns
        self.sm = Held(grid_ns)
        self.pcie = Held(grid_ns)
        self.nccl = Held(grid_ns)
        self.latency = Window(int(r.latency_window_s * S), grid_ns)
        self.qps = Window(int(r.qps_window_s * S), grid_ns)
        self.recs: deque[tuple[int, int]] = deque()
        self.first_rec: int | None = None
        self.checks = 0
        self.check_slot: int | None = None  # checks fall on absolute multiples of the interval: a replay
        # that starts elsewhere checks at the same ticks
        self.was_sent: Callable[[str], bool] | None = None  # set while replaying history (see Decider)
        self._withheld_now = False
        self.last_spike: int | None = None
        self.drift_open = False
        self.last_rebalance_ns: int | None = None
        self.powers: deque[tuple[int, float]] = deque()  # (tick, mean power) over rebalance_load_s
        self.last_action: Trigger | None = None
        self.desired: int | None = None
        self.watch: Trigger | None = None
        self.last_withheld: tuple[str, str] | None = None
        self.last_tick: WorkloadTick | None = None
        self.metric: tuple[str, float] = ("steady", 0.0)

    # --- one tick ---------------------------------------------------------------------------------------------

    def step(self, t: WorkloadTick, bucket: TokenBucket) -> list[Decision]:
        r, pol = self.params.rules, self.params.policy(self.workload_class)
        self.last_tick = t
        self._withheld_now = False
        end, cur = t.end_ns, t.replicas
        up: dict[str, dict[str, Any]] = {}
        self._held(up, "sm_active", self.sm, t, t.sm_active, r.sm_active_up, r.sm_active_up_s, ge=True)
        self._held(up, "pcie", self.pcie, t, t.pcie_util, r.pcie_up, r.pcie_up_s)
        self._held(up, "nccl_allreduce", self.nccl, t, t.nccl_ms, r.nccl_ms_up, r.nccl_up_s)
        p95 = qps = None
        if pol.online:
            self.latency.add(t.tick_ns, t.latency_ms)
            self.qps.add(t.tick_ns, t.qps / cur if t.qps is not None and cur > 0 else None)
            p95, qps = self.latency.p95(), self.qps.mean()
            if p95 is not None and p95 > r.latency_p95_up_ms:
                up["latency_p95"] = _ev(p95, r.latency_p95_up_ms, r.latency_window_s)
            if qps is not None and qps > r.qps_up:
                up["qps"] = _ev(qps, r.qps_up, r.qps_window_s)
        if t.spike:
            self.last_spike = t.tick_ns
        out: list[Decision] = []
        rollback = self._rollback(t)
        if rollback is not None:
            out.append(rollback)
            if rollback.outcome == "taken":
                return out
        out += self._rebalance(t, bucket)
        self._check(t, p95, qps)
        ns = self.params.namespace(self.namespace)
        if up:
            desired = min(max(cur + 1, *(math.ceil(cur * e["value"] / e["threshold"]) for e in up.values())),
                          cur + pol.max_step_up, ns.max_replicas)
            self._recommend(end, desired)
            self.metric = max(((k, e["value"] / e["threshold"]) for k, e in up.items()), key=lambda kv: kv[1])
            out += self._try("scale_up", t, desired, up, self._up_gates(t, desired), bucket, 1 / pol.weight)
        elif self.checks >= pol.down_checks:
            step_to = max(cur - pol.max_step_down, ns.min_replicas, 0)
            self._recommend(end, step_to)
            highest = max(v for _, v in self.recs)  # HPA's scale-down stabilisation
            desired = highest if highest < cur else step_to
            evidence = {"sm_active": _ev(t.sm_active, r.sm_active_down, r.check_interval_s,
                                         checks=self.checks, checks_needed=pol.down_checks)}
            self.metric = ("sm_active", t.sm_active or 0.0)
            out += self._try("scale_down", t, desired, evidence, self._down_gates(t, desired, p95, qps), bucket,
                             1 / pol.weight)
        else:
            self._recommend(end, cur)
            if not self._withheld_now:  # nothing is held back any more: a later hold is news again
                self.last_withheld = None
            self.metric = ("steady", t.sm_active or 0.0)
        return out

    def _held(self, up: dict[str, dict[str, Any]], name: str, held: Held, t: WorkloadTick, value: float | None,
              threshold: float, window_s: float, ge: bool = False) -> None:
        holds = value is not None and (value >= threshold if ge else value > threshold)
        if held.update(t.tick_ns, holds) >= int(window_s * S) and value is not None:
            up[name] = _ev(value, threshold, window_s)

    def _check(self, t: WorkloadTick, p95: float | None, qps: float | None) -> None:
        """The metrics gate (seed 001 §4.1): one check per interval; a failing check restarts the count."""
        r, pol = self.params.rules, self.params.policy(self.workload_class)
        slot = t.tick_ns // int(r.check_interval_s * S)
        if slot == self.check_slot:
            return
        self.check_slot = slot
        ok = t.sm_active is not None and t.sm_active < r.sm_active_down and t.stale is None
        if pol.online:
            ok = ok and p95 is not None and p95 <= self._sla_ms() * r.sla_headroom
        self.checks = self.checks + 1 if ok else 0

    def _recommend(self, end: int, replicas: int) -> None:
        if self.first_rec is None:
            self.first_rec = end
        self.recs.append((end, replicas))
        start = end - int(self.params.rules.stabilisation_s * S)
        while len(self.recs) > 1 and self.recs[0][0] <= start:
            self.recs.popleft()

    # --- gates ------------------------------------------------------------------------------------------------

    def _common_gates(self, t: WorkloadTick, action: str) -> list[str]:
        r = self.params.rules
        gates = [t.stale] if t.stale else []
        last = self.last_action
        if last is not None and last.action in ("scale_up", "scale_down", "rollback"):
            since = t.end_ns - last.ts_ns
            grew = last.action in ("scale_up", "rollback")
            opposite = grew != (action == "scale_up")
            if opposite and since < int(r.cooldown_s * S):
                gates.append("cooldown")
            elif not opposite and since < int(r.repeat_s * S):
                gates.append("repeat")
        return gates

    def _up_gates(self, t: WorkloadTick, desired: int) -> list[str]:
        gates = self._common_gates(t, "scale_up")
        if desired <= t.replicas:
            gates.append("quota_max")
        return gates

    def _down_gates(self, t: WorkloadTick, desired: int, p95: float | None, qps: float | None) -> list[str]:
        r, pol = self.params.rules, self.params.policy(self.workload_class)
        ns = self.params.namespace(self.namespace)
        gates = [t.stale] if t.stale else []
        if not pol.scale_down:
            gates.append("class")
        if ns.qos == "guaranteed":
            gates.append("qos")
        if t.replicas - 1 < ns.min_replicas or t.replicas <= 1:
            gates.append("quota_min")
        if self.last_spike is not None and self.last_spike >= t.end_ns - int(r.spike_window_s * S):
            gates.append("spike")
        if pol.online:
            sla = self._sla_ms()
            after = qps * t.replicas / max(desired, 1) if qps is not None else None
            if p95 is None or p95 > sla * r.sla_headroom or after is None or after > r.qps_up * r.sla_headroom:
                gates.append("sla")
        full = self.first_rec is not None and t.end_ns - self.first_rec >= int(r.stabilisation_s * S) - self.grid_ns
        if not full or max(v for _, v in self.recs) >= t.replicas:
            gates.append("stabilisation")
        gates += [g for g in self._common_gates(t, "scale_down") if g not in STALE_GATES]
        return gates

    def _sla_ms(self) -> float:
        pol = self.params.policy(self.workload_class)
        return pol.sla_latency_ms if pol.sla_latency_ms is not None else self.params.rules.latency_p95_up_ms

    # --- outcomes ---------------------------------------------------------------------------------------------

    def _not_sent(self, trig: Trigger) -> bool:
        """Replaying history: a decision whose trigger never reached the topic (held live by the age guard,
        or lost) was not taken, so it must not start cooldowns, watches or spend rate tokens now."""
        return self.was_sent is not None and not self.was_sent(trig.id)

    def _try(self, action: Action, t: WorkloadTick, desired: int, evidence: dict[str, dict[str, Any]],
             gates: list[str], bucket: TokenBucket, cost: float) -> list[Decision]:
        trig = self._trigger(action, t, desired, evidence)
        if not gates and self._not_sent(trig):
            gates = ["not_sent"]
        if not gates and not bucket.take(t.end_ns, cost):
            gates = ["rate_limit"]
        if gates:
            return self._withheld(trig, gates)
        self._taken(trig)
        return [Decision(trig, "taken")]

    def _withheld(self, trig: Trigger, gates: list[str]) -> list[Decision]:
        self._withheld_now = True
        key = (trig.action, gates[0])
        if key == self.last_withheld:
            return []
        self.last_withheld = key
        return [Decision(trig, "withheld", gates[0], tuple(gates))]

    def _taken(self, trig: Trigger) -> None:
        self.last_withheld = None
        if trig.action == "rebalance":
            return
        self.last_action = trig
        self.desired = trig.desired
        self.watch = trig if trig.action == "scale_down" else None
        for held in (self.sm, self.pcie, self.nccl):
            held.reset()
        self.latency.reset()
        self.qps.reset()
        self.recs.clear()
        self.first_rec = None
        self.checks = 0

    def _trigger(self, action: Action, t: WorkloadTick, desired: int, evidence: dict[str, dict[str, Any]],
                 reverses: str | None = None) -> Trigger:
        last = self.last_action
        before = Before(t.replicas, self.desired if self.desired is not None else t.replicas,
                        last.action if last else None, last.ts_ns if last else None)
        return make_trigger(action, self.namespace, self.workload, self.workload_class, ts_ns=t.end_ns,
                            current=t.replicas, desired=desired, reasons=tuple(sorted(evidence)), evidence=evidence,
                            reverses=reverses, before=before)

    def _rollback(self, t: WorkloadTick) -> Decision | None:
        d, pol = self.watch, self.params.policy(self.workload_class)
        if d is None:
            return None
        if t.end_ns - d.ts_ns > int(self.params.rules.watch_s * S) or pol.sla_latency_ms is None:
            self.watch = None
            return None
        if t.latency_ms is None or t.latency_ms <= pol.sla_latency_ms:
            return None
        evidence = {"sla_breach": _ev(t.latency_ms, pol.sla_latency_ms, self.params.rules.watch_s,
                                      breach_ts_ns=t.tick_ns, after_s=(t.end_ns - d.ts_ns) / S)}
        trig = self._trigger("rollback", t, max(d.current, t.replicas), evidence, reverses=d.id)
        if t.stale or self._not_sent(trig):
            held = self._withheld(trig, [t.stale or "not_sent"])
            return held[0] if held else None
        self._taken(trig)
        return Decision(trig, "taken")

    def _load_moved(self, t: WorkloadTick) -> float | None:
        """How far (relative, max over min) the workload's mean power moved within ``rebalance_load_s``."""
        r = self.params.rules
        w = self.powers
        if t.power_w is not None and t.power_w > 0 and t.stale is None:
            w.append((t.tick_ns, t.power_w))
        while w and w[0][0] <= t.tick_ns - int(r.rebalance_load_s * S):
            w.popleft()
        if not w:
            return None
        lo, hi = min(p for _, p in w), max(p for _, p in w)
        return hi / lo - 1.0

    def _rebalance(self, t: WorkloadTick, bucket: TokenBucket) -> list[Decision]:
        r = self.params.rules
        moved = self._load_moved(t)
        if not t.drift:
            if t.stale is None:  # a tick missing the drifting node says nothing about the episode
                self.drift_open = False
            return []
        if self.drift_open:
            return []
        drift: dict[str, Any] = {"value": float(len(t.drift)), "threshold": 1.0, "window_s": r.check_interval_s,
                                 "gpus": ",".join(t.drift), "load_moved": moved, "load_window_s": r.rebalance_load_s}
        worst = min(t.drift_detail, key=lambda nd: nd[1].value / nd[1].baseline if nd[1].baseline > 0 else 1.0,
                    default=None)
        if worst is not None:  # the deepest drop, stated at the load it was judged at
            node, d = worst
            drift.update(node=node, gpu=d.gpu, flops_per_watt=d.value, baseline_at_load=d.baseline, load_w=d.load_w,
                         load_band_lo_w=d.band_lo_w, load_band_hi_w=d.band_hi_w,
                         drop=1 - d.value / d.baseline if d.baseline > 0 else None)
        ev = {"efficiency_drift": drift}
        trig = self._trigger("rebalance", t, t.replicas, ev)
        gates = [t.stale] if t.stale else []
        cooldown = r.cooldown_s if r.rebalance_cooldown_s is None else r.rebalance_cooldown_s
        if self.last_rebalance_ns is not None and t.end_ns - self.last_rebalance_ns < int(cooldown * S):
            gates.append("cooldown")
        if moved is not None and moved > r.rebalance_load_move:
            gates.append("load_change")
        if not gates and self._not_sent(trig):
            # Replaying: this episode was open before the replayed window (or its trigger was lost);
            # either way it is not announced again.
            self.drift_open = True
            return self._withheld(trig, ["not_sent"])
        if not gates and not bucket.take(t.end_ns, 1 / self.params.policy(self.workload_class).weight):
            gates = ["rate_limit"]
        if gates:
            return self._withheld(trig, gates)
        self.drift_open = True
        self.last_rebalance_ns = trig.ts_ns
        self._taken(trig)
        return [Decision(trig, "taken")]


def _ev(value: float | None, threshold: float, window_s: float, **more: Any) -> dict[str, Any]:
    return {"value": value, "threshold": threshold, "window_s": window_s, **more}
