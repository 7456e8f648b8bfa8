"""The decision engine, rule by rule and gate by gate, on hand-made summary sequences."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import pytest

from schemas.triggers import decode_trigger, encode_trigger
from schemas.workload_samples import DriftDetail, WorkloadSample
from streams.decide.engine import Decider
from streams.decide.params import (
    ClassPolicy,
    DecideParams,
    NamespacePolicy,
    Rules,
    parse_decide_policy,
)
from streams.decide.rules import Decision
from streams.policy.tables import PolicyError

S = 1_000_000_000
T0 = 1_796_200_000 * S


def sample(t: int, node: str = "n1", cls: str = "training", pods: int = 2, **values: Any) -> WorkloadSample:
    base: dict[str, Any] = {"sm_active": 0.5, "pcie_util": None, "nccl_ms": None, "latency_ms": None, "qps": None,
                            "spike": False, "drift": (), "power_w": None, "drift_detail": ()}
    base.update(values)
    return WorkloadSample("ml", "job", cls, node, T0 + t * S, S, 8, tuple(f"{node}-p{i}" for i in range(pods)),
                          base["sm_active"], base["pcie_util"], base["nccl_ms"], base["latency_ms"], base["qps"],
                          base["spike"], tuple(base["drift"]), power_w=base["power_w"],
                          drift_detail=tuple(base["drift_detail"]))


def run(d: Decider, samples: Iterable[WorkloadSample], now: int | None = None) -> list[Decision]:
    return [x for s in samples for x in d.on_sample(s, now)]


def taken(out: list[Decision]) -> list[tuple[str, int]]:
    return [(x.trigger.action, (x.trigger.ts_ns - T0) // S) for x in out if x.outcome == "taken"]


def held(out: list[Decision]) -> list[tuple[str, str | None]]:
    return [(x.trigger.action, x.gate) for x in out if x.outcome == "withheld"]


# --- scale-up rules ----------------------------------------------------------------------------------------------

def test_sm_active_at_75_percent_for_60_s_scales_up_at_the_window_end_and_not_before() -> None:
    d = Decider(DecideParams())
    out = run(d, [sample(t, sm_active=0.75) for t in range(59)])
    assert taken(out) == []
    out = run(d, [sample(59, sm_active=0.75)])
    assert taken(out) == [("scale_up", 60)]
    t = out[0].trigger
    assert (t.current, t.desired, t.reasons) == (2, 3, ("sm_active",))
    assert t.evidence["sm_active"] == {"value": 0.75, "threshold": 0.75, "window_s": 60.0}


def test_a_dip_restarts_the_sm_window() -> None:
    d = Decider(DecideParams())
    seq = [sample(t, sm_active=0.74 if t == 30 else 0.9) for t in range(90)]
    assert taken(run(d, seq)) == []
    assert taken(run(d, [sample(90, sm_active=0.9)])) == [("scale_up", 91)]


def test_a_missing_tick_restarts_the_window() -> None:
    d = Decider(DecideParams(rules=Rules(tick_grace_s=0)))
    seq = [sample(t, sm_active=0.9) for t in range(82) if t != 20]
    assert taken(run(d, seq)) == [("scale_up", 81)]  # held from 21 s, 60 s at the end of tick 80


def test_pcie_above_90_percent_of_the_link_for_30_s() -> None:
    d = Decider(DecideParams())
    out = run(d, [sample(t, sm_active=0.2, pcie_util=0.95) for t in range(30)])
    assert taken(out) == [("scale_up", 30)] and out[-1].trigger.reasons == ("pcie",)
    assert taken(run(Decider(DecideParams()), [sample(t, sm_active=0.2, pcie_util=0.9) for t in range(60)])) == []


def test_nccl_allreduce_above_12_ms() -> None:
    d = Decider(DecideParams())
    out = run(d, [sample(t, sm_active=0.2, nccl_ms=15.0) for t in range(10)])
    assert taken(out) == [("scale_up", 10)] and out[-1].trigger.reasons == ("nccl_allreduce",)


def test_online_p95_latency_above_120_ms_and_qps_per_replica_above_800() -> None:
    lat = [sample(t, cls="inference", sm_active=0.2, latency_ms=200.0 if t % 10 == 0 else 50.0, qps=100.0)
           for t in range(30)]
    assert taken(run(Decider(DecideParams()), lat)) == [("scale_up", 30)]
    # 1,700 req/s over 2 replicas is 850 each; the same on a training job means nothing.
    qps = [sample(t, cls="inference", sm_active=0.2, latency_ms=50.0, qps=1700.0) for t in range(30)]
    out = run(Decider(DecideParams()), qps)
    assert taken(out) == [("scale_up", 30)]
    assert out[-1].trigger.desired == 3 and out[-1].trigger.evidence["qps"]["value"] == 850.0
    assert taken(run(Decider(DecideParams()), [dataclasses.replace(s, workload_class="training") for s in qps])) == []


def test_desired_is_proportional_and_capped_by_class_step_and_quota() -> None:
    p = DecideParams(classes={"inference": ClassPolicy(online=True, max_step_up=4)},
                     namespaces={"ml": NamespacePolicy(max_replicas=5)})
    out = run(Decider(p), [sample(t, cls="inference", pods=2, latency_ms=50.0, qps=8000.0) for t in range(30)])
    assert [(x.trigger.current, x.trigger.desired) for x in out] == [(2, 5)]  # ceil(2 x 4000/800) = 10, capped


def test_quota_max_withholds_and_says_so_once() -> None:
    p = DecideParams(namespaces={"ml": NamespacePolicy(max_replicas=2)})
    out = run(Decider(p), [sample(t, sm_active=0.9) for t in range(200)])
    assert taken(out) == [] and held(out) == [("scale_up", "quota_max")]


def test_rebalance_once_per_drift_episode_and_per_cooldown() -> None:
    """An episode that opens and ends inside the cooldown gets none; one still open when it ends gets it then."""
    d = Decider(DecideParams())
    drifting = [(10, 20), (40, 45), (100, 400), (700, 710)]
    seq = [sample(t, drift=("3",) if any(a <= t < b for a, b in drifting) else ()) for t in range(800)]
    out = run(d, seq)
    assert taken(out) == [("rebalance", 11), ("rebalance", 311), ("rebalance", 701)]
    assert held(out) == [("rebalance", "cooldown"), ("rebalance", "cooldown")]
    assert out[0].trigger.evidence["efficiency_drift"]["gpus"] == "3" and out[0].trigger.delta == 0


def test_rebalance_cooldown_is_its_own_setting() -> None:
    d = Decider(DecideParams(rules=Rules(rebalance_cooldown_s=20.0)))
    seq = [sample(t, drift=("3",) if 10 <= t < 20 or 40 <= t < 45 else ()) for t in range(60)]
    assert taken(run(d, seq)) == [("rebalance", 11), ("rebalance", 41)]


def test_rebalance_spends_the_rate_limit() -> None:
    d = Decider(DecideParams(rules=Rules(rate_per_min=0.001, rate_burst=1.0)))
    out = run(d, [sample(t, sm_active=0.9 if t < 70 else 0.5, drift=("3",) if t >= 80 else ()) for t in range(100)])
    assert taken(out) == [("scale_up", 60)] and held(out) == [("rebalance", "rate_limit")]


def test_no_rebalance_while_the_workload_power_moves_and_one_once_it_holds() -> None:
    """A drift confirmed while the load (the workload's mean power) is still moving is a load change."""
    def power(t: int) -> float:
        return 600.0 if t < 50 else 400.0  # the load steps down at 50 s

    d = Decider(DecideParams())
    out = run(d, [sample(t, power_w=power(t), drift=("3",) if t >= 53 else ()) for t in range(120)])
    assert held(out) == [("rebalance", "load_change")]
    assert taken(out) == [("rebalance", 80)]  # 30 s after the step the power has held: the drift is a drift
    ev = out[-1].trigger.evidence["efficiency_drift"]
    assert ev["load_moved"] == 0.0 and ev["load_window_s"] == 30.0


def test_rebalance_states_the_drift_at_its_load() -> None:
    details = (DriftDetail("3", 0.75e12, 1.0e12, 412.5, 400.0, 425.0), DriftDetail("5", 0.8e12, 1.0e12, None))
    out = run(Decider(DecideParams()), [sample(t, power_w=410.0, drift=("3", "5") if t >= 5 else (),
                                               drift_detail=details if t >= 5 else ()) for t in range(10)])
    assert taken(out) == [("rebalance", 6)]
    ev = out[0].trigger.evidence["efficiency_drift"]
    assert ev["gpus"] == "3,5" and ev["node"] == "n1" and ev["gpu"] == "3"
    assert ev["flops_per_watt"] == 0.75e12 and ev["baseline_at_load"] == 1.0e12 and ev["load_w"] == 412.5
    assert (ev["load_band_lo_w"], ev["load_band_hi_w"]) == (400.0, 425.0)
    assert ev["drop"] == pytest.approx(0.25)
    assert out[0].trigger.reasons == ("efficiency_drift",)


# --- scale-down gates --------------------------------------------------------------------------------------------

def idle(t: int, **kw: Any) -> WorkloadSample:
    return sample(t, cls=kw.pop("cls", "batch"), pods=kw.pop("pods", 4), sm_active=kw.pop("sm_active", 0.1), **kw)


def test_batch_scales_down_after_n_checks_and_the_stabilisation_window() -> None:
    d = Decider(DecideParams())
    out = run(d, [idle(t) for t in range(600)])
    # 3 checks at 0, 10, 20 s; then the 300 s stabilisation window must be full of down recommendations.
    assert held(out)[0] == ("scale_down", "stabilisation")
    assert taken(out)[0][0] == "scale_down" and 300 <= taken(out)[0][1] <= 330
    t = next(x for x in out if x.outcome == "taken").trigger
    assert (t.current, t.desired, t.before.replicas) == (4, 2, 4)


def test_a_failing_check_restarts_the_metrics_gate() -> None:
    p = DecideParams(rules=Rules(stabilisation_s=0))
    seq = [idle(t, sm_active=0.5 if t == 20 else 0.1) for t in range(60)]
    out = run(Decider(p), seq)
    assert taken(out) == [("scale_down", 51)]  # checks at 30, 40, 50 after the failure at 20


@pytest.mark.parametrize(("change", "gate"), [
    ({"cls": "training"}, "class"),
    ({"pods": 1}, "quota_min"),
])
def test_gates_that_hold_a_scale_down(change: dict[str, Any], gate: str) -> None:
    p = DecideParams(rules=Rules(stabilisation_s=0))
    out = run(Decider(p), [idle(t, **change) for t in range(120)])
    assert taken(out) == [] and held(out)[0] == ("scale_down", gate)


def test_guaranteed_qos_and_namespace_min_hold_a_scale_down() -> None:
    p = DecideParams(rules=Rules(stabilisation_s=0), namespaces={"ml": NamespacePolicy(qos="guaranteed")})
    assert held(run(Decider(p), [idle(t) for t in range(60)])) == [("scale_down", "qos")]
    p = DecideParams(rules=Rules(stabilisation_s=0), namespaces={"ml": NamespacePolicy(min_replicas=4)})
    assert held(run(Decider(p), [idle(t) for t in range(60)])) == [("scale_down", "quota_min")]


def test_a_spike_in_the_l1_window_holds_a_scale_down_until_it_is_a_minute_old() -> None:
    p = DecideParams(rules=Rules(stabilisation_s=0))
    out = run(Decider(p), [idle(t, spike=t == 5) for t in range(120)])
    assert held(out)[0] == ("scale_down", "spike")
    assert taken(out)[0] == ("scale_down", 66)  # the spike at 5 s has left the 60 s window at the end of 65 s


def test_the_sla_gate_wants_latency_headroom_and_qps_room_after_the_change() -> None:
    p = DecideParams(rules=Rules(stabilisation_s=0))
    hot = [idle(t, cls="inference", latency_ms=110.0, qps=400.0) for t in range(120)]
    assert run(Decider(p), hot) == []  # no headroom: the metrics gate itself never passes
    busy = [idle(t, cls="inference", latency_ms=40.0, qps=4 * 700.0) for t in range(120)]
    out = run(Decider(p), busy)  # 700 each now, 1,400 each at half the replicas
    assert taken(out) == [] and ("scale_down", "sla") in held(out)
    calm = [idle(t, cls="inference", latency_ms=40.0, qps=4 * 100.0) for t in range(120)]
    assert taken(run(Decider(p), calm))[0][0] == "scale_down"


def test_never_the_opposite_action_inside_the_cooldown() -> None:
    p = DecideParams(rules=Rules(stabilisation_s=0, cooldown_s=300, sm_active_up_s=10))
    d = Decider(p)
    up = run(d, [sample(t, cls="batch", pods=4, sm_active=0.9) for t in range(10)])
    assert taken(up) == [("scale_up", 10)]
    out = run(d, [idle(t) for t in range(10, 400)])
    assert held(out)[0] == ("scale_down", "cooldown")
    assert taken(out) and taken(out)[0][1] >= 310


def test_the_rate_limit_is_shared_by_every_workload() -> None:
    p = DecideParams(rules=Rules(rate_per_min=0.0, rate_burst=2.0, sm_active_up_s=5))
    d = Decider(p)
    out: list[Decision] = []
    for t in range(5):
        for w in ("a", "b", "c"):
            out += d.on_sample(dataclasses.replace(sample(t, sm_active=0.9), workload=w), None)
    assert [(x.trigger.workload, x.outcome, x.gate) for x in out] == [
        ("a", "taken", None), ("b", "taken", None), ("c", "withheld", "rate_limit")]


# --- staleness ---------------------------------------------------------------------------------------------------

def test_no_decision_while_a_node_of_the_workload_is_silent() -> None:
    d = Decider(DecideParams(rules=Rules(sm_active_up_s=10)))
    seq = [s for t in range(40) for s in (sample(t, "n1", sm_active=0.9), sample(t, "n2", sm_active=0.9))
           if not (s.node == "n2" and 5 <= t < 30)]
    out = run(d, seq)
    assert held(out) == [("scale_up", "stale_node")]
    assert taken(out) and all(t >= 31 for _, t in taken(out))


def test_a_node_that_left_the_workload_is_not_stale() -> None:
    d = Decider(DecideParams(rules=Rules(sm_active_up_s=10)))
    seq = [sample(t, "n1", sm_active=0.9) for t in range(12)]
    seq.insert(2, sample(1, "n2", sm_active=0.9))
    seq.insert(4, dataclasses.replace(sample(2, "n2"), present=False, gpus=0, pods=()))
    assert taken(run(d, seq)) == [("scale_up", 10)]


def test_no_decision_on_data_older_than_max_age() -> None:
    d = Decider(DecideParams(rules=Rules(sm_active_up_s=10, max_age_s=30)))
    out = [x for t in range(20) for x in d.on_sample(sample(t, sm_active=0.9), T0 + (t + 1 + 45) * S)]
    assert taken(out) == [] and held(out) == [("scale_up", "stale_data")]
    out = [x for t in range(20, 25) for x in d.on_sample(sample(t, sm_active=0.9), T0 + (t + 3) * S)]
    assert taken(out) == [("scale_up", 21)]


def test_duplicates_and_late_samples_change_nothing() -> None:
    seq = [sample(t, sm_active=0.9) for t in range(70)]
    a, b = Decider(DecideParams()), Decider(DecideParams())
    once = run(a, seq)
    twice = run(b, [s for x in seq for s in (x, x)])
    assert [x.trigger for x in once] == [x.trigger for x in twice] and b.stats.duplicates == 70


# --- rollback ----------------------------------------------------------------------------------------------------

def test_an_sla_breach_after_a_scale_down_rolls_it_back_at_once() -> None:
    p = DecideParams(rules=Rules(stabilisation_s=0))
    d = Decider(p)
    out = run(d, [idle(t, cls="inference", latency_ms=40.0, qps=100.0) for t in range(90)])
    down = [x.trigger for x in out if x.outcome == "taken"]
    assert [t.action for t in down] == ["scale_down"]
    breach = run(d, [idle(90, cls="inference", pods=3, latency_ms=300.0, qps=100.0)])
    assert taken(breach) == [("rollback", 91)]
    rb = breach[0].trigger
    assert (rb.reverses, rb.desired, rb.reasons) == (down[0].id, 4, ("sla_breach",))
    assert decode_trigger(encode_trigger(rb)) == rb


def test_no_rollback_after_the_watch_window() -> None:
    p = DecideParams(rules=Rules(stabilisation_s=0, watch_s=20))
    d = Decider(p)
    assert taken(run(d, [idle(t, cls="inference", latency_ms=40.0, qps=100.0) for t in range(90)])) == [
        ("scale_down", 81)]
    late = run(d, [idle(t, cls="inference", pods=3, latency_ms=40.0 if t < 105 else 300.0, qps=100.0)
                   for t in range(90, 110)])
    assert "rollback" not in [a for a, _ in taken(late)]


# --- determinism and policy --------------------------------------------------------------------------------------

def test_a_replay_makes_the_same_decisions_with_the_same_ids() -> None:
    seq = [idle(t, sm_active=0.9 if t < 100 else 0.1) for t in range(800)]
    first = [x.trigger.id for x in run(Decider(DecideParams()), seq)]
    assert first and first == [x.trigger.id for x in run(Decider(DecideParams()), seq)]


def test_policy_file_errors_name_the_file_and_key() -> None:
    with pytest.raises(PolicyError, match=r"p.toml: \[classes.batch\] weight must be a non-negative number"):
        parse_decide_policy({"classes": {"batch": {"weight": "high"}}}, "p.toml")
    with pytest.raises(PolicyError, match="min_replicas <= max_replicas"):
        parse_decide_policy({"namespaces": {"x": {"min_replicas": 5, "max_replicas": 2}}}, "p.toml")
    with pytest.raises(PolicyError, match="qos must be one of"):
        parse_decide_policy({"namespaces": {"x": {"qos": "gold"}}}, "p.toml")
    p = parse_decide_policy({"classes": {"gpu-burst": {"online": True, "sla_latency_ms": 50}}}, "p.toml")
    assert p.policy("gpu-burst").sla_latency_ms == 50.0 and p.policy("unknown") == p.classes["default"]


def test_the_policy_file_is_read_through_the_settings(tmp_path: Any) -> None:
    from agents.settings import SettingsError, load_settings

    good = tmp_path / "policy.toml"
    good.write_text("[rules]\nqps_up = 500\n[namespaces.serving]\nmax_replicas = 8\n")
    p = load_settings({"FLOPWATCH_DECIDE_POLICY": str(good)}).decide_params()
    assert p.rules.qps_up == 500.0 and p.namespace("serving").max_replicas == 8
    bad = tmp_path / "bad.toml"
    bad.write_text("[rules]\nqps_up = 'lots'\n")
    with pytest.raises(SettingsError, match=r"bad.toml: \[rules\] qps_up must be a non-negative number"):
        load_settings({"FLOPWATCH_DECIDE_POLICY": str(bad)}).decide_params()
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings({"FLOPWATCH_DECIDE_POLICY": str(tmp_path / "none.toml")}).decide_params()
    broken = tmp_path / "broken.toml"
    broken.write_text("[rules\n")
    with pytest.raises(SettingsError, match=r"broken\.toml"):
        load_settings({"FLOPWATCH_DECIDE_POLICY": str(broken)}).decide_params()


def test_the_worker_refuses_a_bad_policy_file_before_it_starts(tmp_path: Any) -> None:
    from click.testing import CliRunner

    from agents.cli.main import cli

    bad = tmp_path / "bad.toml"
    bad.write_text("[classes.inference]\nweight = -1\n")
    res = CliRunner().invoke(cli, ["worker"], env={"FLOPWATCH_DECIDE_POLICY": str(bad),
                                                   "FLOPWATCH_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    assert res.exit_code == 2 and "[classes.inference] weight must be a non-negative number" in res.output


def test_a_replay_that_starts_later_checks_at_the_same_ticks() -> None:
    p = DecideParams(rules=Rules(stabilisation_s=0))
    seq = [idle(t) for t in range(120)]
    whole = taken(run(Decider(p), seq))
    late = taken(run(Decider(p), seq[7:]))  # a rebuild's replay starts wherever the window falls
    assert whole[0] == late[0] == ("scale_down", 21)


def test_a_tick_without_the_drifting_node_does_not_start_a_second_rebalance() -> None:
    d = Decider(DecideParams(rules=Rules(tick_grace_s=2)))
    seq: list[WorkloadSample] = []
    for t in range(30):
        seq.append(sample(t, "n1", drift=("0",) if t >= 5 else ()))
        if not 10 <= t < 15:  # n2 (not drifting) keeps up; n1 is missing for a while
            seq.append(sample(t, "n2"))
    seq = [s for s in seq if not (s.node == "n1" and 10 <= (s.tick_ns - T0) // S < 15)]
    out = run(d, seq)
    assert [a for a, _ in taken(out)] == ["rebalance"]


def test_a_held_rollback_is_recorded_once_not_every_tick() -> None:
    p = DecideParams(rules=Rules(stabilisation_s=0))
    d = Decider(p)
    run(d, [idle(t, cls="inference", latency_ms=40.0, qps=100.0) for t in range(90)])
    # The SLA breaks while the age guard holds everything: one withheld record, not one per tick.
    late = [x for t in range(90, 100)
            for x in d.on_sample(idle(t, cls="inference", pods=3, latency_ms=300.0, qps=100.0), T0 + (t + 60) * S)]
    assert held(late) == [("rollback", "stale_data")]


def test_zero_thresholds_and_grids_are_refused() -> None:
    with pytest.raises(PolicyError, match="weight must be greater than 0"):
        parse_decide_policy({"classes": {"batch": {"weight": 0}}}, "p.toml")
    with pytest.raises(PolicyError, match="qps_up must be greater than 0"):
        parse_decide_policy({"rules": {"qps_up": 0}}, "p.toml")
    from schemas.workload_samples import WorkloadSampleDecodeError, decode_workload_sample, encode_workload_sample

    with pytest.raises(WorkloadSampleDecodeError, match="grid_ns"):
        decode_workload_sample(encode_workload_sample(dataclasses.replace(sample(0), grid_ns=0)))
