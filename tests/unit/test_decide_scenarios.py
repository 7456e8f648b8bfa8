"""Every decision scenario, replayed through the tap and the engine in-process, decides as it expects."""

from __future__ import annotations

import pytest

from streams.decide.params import S
from streams.decide.sim import SCENARIOS, check, flaps, run_scenario


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_decides_as_expected(name: str) -> None:
    sc = SCENARIOS[name]
    run = run_scenario(sc)
    assert check(sc, run) == []
    assert flaps(run, sc.params.rules.stabilisation_s) == 0
    # Nothing is taken at a tick some node did not send, or that the worker read too late.
    for d in run.decisions:
        if d.outcome != "taken":
            continue
        end_s = (d.trigger.ts_ns - sc.start_ns) / S
        assert not any(a < end_s <= b for _, a, b in sc.stopped), d
        assert not any(a < end_s <= b for a, b, lag in sc.lagged if lag > sc.params.rules.max_age_s), d


def test_the_sla_breach_is_rolled_back_within_one_tick() -> None:
    run = run_scenario(SCENARIOS["sla_breach"])
    down = next(d.trigger for d in run.decisions if d.trigger.action == "scale_down" and d.outcome == "taken")
    rb = next(d.trigger for d in run.decisions if d.trigger.action == "rollback")
    assert rb.reverses == down.id and rb.desired == down.current
    breach_tick = rb.evidence["sla_breach"]["breach_ts_ns"]
    assert isinstance(breach_tick, int)
    assert rb.ts_ns - breach_tick == S  # decided at the end of the tick that broke the SLA


def test_a_replay_of_the_frames_gives_the_same_trigger_ids() -> None:
    a, b = run_scenario(SCENARIOS["diurnal"]), run_scenario(SCENARIOS["diurnal"])
    assert [d.trigger.id for d in a.decisions] == [d.trigger.id for d in b.decisions]


def test_the_drift_scenarios_rebalance_states_the_drift_at_its_load() -> None:
    sc = SCENARIOS["drift"]
    [d] = [d for d in run_scenario(sc).decisions if d.trigger.action == "rebalance" and d.outcome == "taken"]
    ev = {k: v for k, v in d.trigger.evidence["efficiency_drift"].items() if isinstance(v, float)}
    assert abs(ev["drop"] - 0.25) < 0.05 and ev["flops_per_watt"] < ev["baseline_at_load"]
    assert ev["load_band_lo_w"] <= ev["load_w"] * 1.02 and ev["load_band_hi_w"] >= ev["load_w"] * 0.98
    assert ev["load_moved"] < 0.10 and d.trigger.reasons == ("efficiency_drift",)
