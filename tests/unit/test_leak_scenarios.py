"""Leak scenarios: parsing, and the labelled benchmark scenario through the detectors (every leak found, root cause
first; no look-alike fires)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.detect.detectors import Detectors, DetectParams
from streams.sim.bench_frames import frames
from streams.sim.scenario import ScenarioError, parse_scenario
from streams.sim.simulate import ClusterSimulator, SimParams

S = 1_000_000_000
ROOT = Path(__file__).resolve().parents[2]
# The root cause each leak of deploy/scenarios/leaks.toml plants (streams/sim/leak_effects.py).
PLANTED = {"pipeline_stall": {"host_cpu_util"}, "batching_collapse": {"request_rate"},
           "nccl_retransmit_storm": {"nvlink_tx", "nvlink_rx"}, "nccl_slow_allreduce": {"nvlink_tx", "nvlink_rx"},
           "checkpoint_io_storm": {"disk_write"}}


def leak(**keys: object) -> str:
    body = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in keys.items())
    return f'version = 1\n[[event]]\nkind = "leak"\n{body}\n'


def test_a_leak_is_labelled_by_its_duration_and_a_look_alike_never_alerts() -> None:
    long = parse_scenario(leak(rule="pipeline_stall", node="node-00", gpu="0", start_s=10.0, duration_s=300.0))
    short = parse_scenario(leak(rule="pipeline_stall", node="node-00", gpu="0", start_s=10.0, duration_s=30.0))
    alike = parse_scenario(leak(rule="pipeline_stall", variant="short", node="node-00", gpu="0", start_s=10.0,
                                duration_s=900.0))
    assert [e.expect for e in (long.events[0], short.events[0], alike.events[0])] == ["alert", "no_alert", "no_alert"]
    assert long.events[0].magnitude == 600.0  # the rule's default: dataloader wait, ms


@pytest.mark.parametrize(("keys", "message"), [
    ({"rule": "gpu_leak"}, "rule must be one of"),
    ({"rule": "pipeline_stall", "variant": "warmup"}, "variant of pipeline_stall must be one of 'leak', 'short'"),
    ({"rule": "checkpoint_io_storm", "gpu": "0"}, 'gpu must be "\\*"'),
    ({"rule": "pipeline_stall", "period_s": 60.0}, "period_s is for checkpoint_io_storm"),
    ({"rule": "pipeline_stall", "magnitude": -1.0}, "magnitude must be > 0"),
])
def test_leak_events_are_checked(keys: dict[str, object], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(leak(**{"node": "node-00", "gpu": "0", "start_s": 1.0, "duration_s": 100.0, **keys}), "x.toml")


def test_the_leak_benchmark_scenario_finds_every_leak_names_its_cause_and_spares_the_look_alikes() -> None:
    sc = parse_scenario((ROOT / "deploy/scenarios/leaks.toml").read_text(), "leaks.toml")
    p = SimParams(nodes=4, gpus=4, seed=0)
    batches = ClusterSimulator(p, scenario=sc).advance(p.start_ns + 1800 * S)
    det = Detectors(DetectParams(), S)
    alerts = [a for m in frames(batches, p.start_ns, 1800, S) for a in det.on_message(m)]
    leaks = [a for a in alerts if a.rule not in ("util_spike", "sm_spike", "efficiency_drift")]
    truth = sc.truth(p.start_ns)
    found = {}
    for t in truth:
        target = "host" if t.rule == "checkpoint_io_storm" else t.gpu
        hits = [a for a in leaks if a.rule == t.rule and a.node == t.node and a.gpu == target
                and t.start_ns - 60 * S <= a.onset_ts_ns <= t.end_ns and a.state == "firing"]
        if t.expect == "alert":
            assert hits, f"{t.rule} on {t.node}/{target} was not found"
            first = hits[0]
            assert first.ts_ns - t.start_ns <= 700 * S  # each within its documented delay (docs/leaks.md)
            found[t.rule] = [a for a in hits if a.causes]
        else:
            assert not hits, f"the {t.variant} look-alike of {t.rule} fired: {hits[0]}"
    assert set(found) == {t.rule for t in truth if t.expect == "alert"}
    matched = {(a.rule, a.node, a.gpu) for t in truth for a in leaks if a.rule == t.rule and a.node == t.node}
    assert {(a.rule, a.node, a.gpu) for a in leaks} <= matched  # nothing fired anywhere else
    for rule, causes in PLANTED.items():
        [attributed] = found[rule]
        assert attributed.causes[0].cause in causes, (rule, attributed.causes)
