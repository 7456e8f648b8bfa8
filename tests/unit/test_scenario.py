"""Scenario files: parsing and its errors, truth times, and the simulator playing each kind of event."""

from __future__ import annotations

import doctest
import gc
import hashlib
import struct
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner

import streams.sim.play
import streams.sim.scenario
from agents.collect.scenario_file import load_scenario
from agents.runtime.gc_tuning import PAUSES
from schemas.records import K8sEvent
from streams.sim.scenario import (
    ALERT_MIN_DEPTH,
    Scenario,
    ScenarioError,
    ScenarioEvent,
    TruthEvent,
    parse_scenario,
)
from streams.sim.simulate import ClusterSimulator, SimParams

S = 1_000_000_000
ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "deploy" / "scenarios"
Key = tuple[str, str, str]  # (sensor, node, gpu)


def toml(*events: str, head: str = "version = 1\n") -> str:
    return head + "".join(f"\n[[event]]\n{e.strip()}\n" for e in events)


DROP = 'kind = "efficiency_drop"\nnode = "node-00"\ngpu = "0"\nstart_s = 20.0\nduration_s = 10.0\ndepth = 0.25'
SPIKE = 'kind = "spike"\nnode = "node-01"\ngpu = "1"\nstart_s = 15.0\nlevel = 0.95'
CHANGE = 'kind = "workload_change"\nnode = "node-01"\ngpu = "*"\nstart_s = 12.5'
LOAD = ('kind = "load_change"\nnode = "node-00"\ngpu = "1"\nstart_s = 10.0\nduration_s = 20.0\nprofile = "square"\n'
        'level = 0.3\nperiod_s = 10.0')


# --- parsing ------------------------------------------------------------------------------------------------------

def test_parses_every_kind_with_defaults() -> None:
    sc = parse_scenario(toml(DROP, SPIKE, CHANGE, head='version = 1\ndescription = "d"\nduration_s = 60\n'), "a.toml")
    assert sc.source == "a.toml" and sc.description == "d" and sc.duration_s == 60.0
    drop, spike, change = sc.events
    assert drop == ScenarioEvent(0, "efficiency_drop", "node-00", "0", 20.0, 10.0, "alert", depth=0.25, line=5)
    assert spike == ScenarioEvent(1, "spike", "node-01", "1", 15.0, 0.2, "no_alert", level=0.95, line=13)
    assert change == ScenarioEvent(2, "workload_change", "node-01", "*", 12.5, 0.0, "no_alert", line=20)
    assert change.covers("node-01", "3") and not change.covers("node-00", "0")
    assert parse_scenario("version = 1\n").events == ()


@pytest.mark.parametrize(("depth", "duration", "expect"), [
    (ALERT_MIN_DEPTH, 3.0, "alert"), (0.5, 30.0, "alert"), (0.11, 30.0, "no_alert"), (0.08, 30.0, "no_alert"),
    (0.5, 2.9, "no_alert"), (0.3, 2.0, "no_alert"),
])
def test_expect_defaults_to_the_rule(depth: float, duration: float, expect: str) -> None:
    ev = DROP.replace("depth = 0.25", f"depth = {depth}").replace("duration_s = 10.0", f"duration_s = {duration}")
    assert parse_scenario(toml(ev)).events[0].expect == expect


def test_an_explicit_label_wins_over_the_rule() -> None:
    assert parse_scenario(toml(DROP + '\nexpect = "no_alert"')).events[0].expect == "no_alert"
    assert parse_scenario(toml(SPIKE + '\nexpect = "alert"')).events[0].expect == "alert"


def test_inline_tables_parse_without_lines() -> None:
    sc = parse_scenario('version = 1\nevent = [{kind = "spike", node = "*", gpu = "*", start_s = 1, level = 1.0}]\n')
    assert sc.events[0].line is None and sc.events[0].duration_s == 0.2
    with pytest.raises(ScenarioError, match=r"^x: event\[0\] level must be"):
        parse_scenario('version = 1\nevent = [{kind = "spike", node = "*", gpu = "*", start_s = 1, level = 2}]', "x")


def err(text: str) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "bad.toml")
    return info.value


@pytest.mark.parametrize(("text", "fragment"), [
    ("version = 1\n[[event]\n", "not valid TOML"),
    ("version = 1\nname = 'x'\n", "unknown top-level key(s) 'name'"),
    ("[[event]]\nkind = 'spike'\n", "missing 'version'"),
    ("version = 2\n", "unsupported version 2"),
    ("version = '1'\n", "unsupported version '1'"),
    ("version = true\n", "unsupported version True"),
    ("version = 1\ndescription = 3\n", "description must be a string"),
    ("version = 1\nduration_s = 0\n", "duration_s must be > 0"),
    ("version = 1\nduration_s = 'long'\n", "duration_s must be a finite number"),
    ("version = 1\nevent = 3\n", "'event' must be an array of tables"),
    ("version = 1\nevent = [1, 2]\n", "'event' must be an array of tables"),
])
def test_file_level_errors_name_the_file(text: str, fragment: str) -> None:
    e = err(text)
    assert str(e).startswith("bad.toml: ") and fragment in str(e) and e.index is None


def test_toml_syntax_errors_keep_the_parser_position() -> None:
    assert "line 2" in str(err("version = 1\nx = = 1\n"))


@pytest.mark.parametrize(("event", "fragment"), [
    ('node = "node-00"', "kind must be one of 'efficiency_drop', 'spike', 'load_change', 'workload_change', 'leak', got None"),
    ('kind = "dip"', "kind must be one of"),
    (DROP + "\ndept = 0.2", "unknown key(s) 'dept'; efficiency_drop takes kind, node, gpu, start_s, expect, "
                            "duration_s, depth"),
    (DROP + "\nlevel = 0.2", "unknown key(s) 'level'"),
    (SPIKE + "\nduration_s = 1.0", "unknown key(s) 'duration_s'; spike takes"),
    (CHANGE + "\ndepth = 0.1", "unknown key(s) 'depth'"),
    (DROP.replace('node = "node-00"\n', ""), "needs 'node'"),
    (DROP.replace('"node-00"', "0"), "node must be a simulator node name such as 'node-00' or '*', got 0"),
    (DROP.replace('"node-00"', '"node-0"'), "got 'node-0'"),
    (DROP.replace('"node-00"', '"node-000"'), "got 'node-000'"),
    (DROP.replace('"node-00"', '"gpu-node-00"'), "got 'gpu-node-00'"),
    (DROP.replace('gpu = "0"\n', ""), "needs 'gpu'"),
    (DROP.replace('gpu = "0"', "gpu = 0"), "gpu must be a GPU index as a string"),
    (DROP.replace('gpu = "0"', 'gpu = "01"'), "got '01'"),
    (DROP.replace('gpu = "0"', 'gpu = "-1"'), "got '-1'"),
    (DROP.replace("start_s = 20.0\n", ""), "efficiency_drop needs 'start_s'"),
    (DROP.replace("start_s = 20.0", "start_s = -1.0"), "start_s must be >= 0, got -1.0"),
    (DROP.replace("start_s = 20.0", "start_s = true"), "start_s must be a finite number, got True"),
    (DROP.replace("start_s = 20.0", "start_s = nan"), "start_s must be a finite number, got nan"),
    (DROP.replace("start_s = 20.0", "start_s = inf"), "start_s must be a finite number, got inf"),
    (DROP.replace("start_s = 20.0", 'start_s = "20"'), "start_s must be a finite number, got '20'"),
    (DROP.replace("duration_s = 10.0\n", ""), "efficiency_drop needs 'duration_s'"),
    (DROP.replace("duration_s = 10.0", "duration_s = 0"), "duration_s must be > 0, got 0.0"),
    (DROP.replace("depth = 0.25", ""), "efficiency_drop needs 'depth'"),
    (DROP.replace("depth = 0.25", "depth = 0"), "depth must be in (0, 1], got 0.0"),
    (DROP.replace("depth = 0.25", "depth = 1.5"), "depth must be in (0, 1], got 1.5"),
    (DROP.replace("depth = 0.25", "depth = 1"), "depth must be < 1"),
    (DROP + '\nexpect = "maybe"', "expect must be one of 'alert', 'no_alert', got 'maybe'"),
    (SPIKE.replace("level = 0.95", ""), "spike needs 'level'"),
    (SPIKE.replace("level = 0.95", "level = 0"), "level must be in (0, 1], got 0.0"),
    (SPIKE.replace("level = 0.95", "level = 95"), "level must be in (0, 1], got 95.0"),
    (SPIKE + "\nduration_ms = 0", "duration_ms must be > 0, got 0.0"),
    (CHANGE + '\nnew_workload = "LLM Serve"', "new_workload must be a Kubernetes name"),
    (CHANGE + '\nnew_workload = ""', "new_workload must be a Kubernetes name"),
    (CHANGE + "\nnew_workload = 7", "new_workload must be a Kubernetes name"),
    (LOAD.replace('"square"', '"saw"'), "profile must be one of 'step', 'square', 'sine', 'diurnal', got 'saw'"),
    (LOAD.replace("\nperiod_s = 10.0", ""), "a square load_change needs 'period_s'"),
    (LOAD.replace('"square"', '"step"'), "period_s is for the square and sine profiles, not 'step'"),
    (LOAD.replace("level = 0.3", "level = 0"), "level must be in (0, 2], got 0.0"),
    (LOAD.replace("level = 0.3", "level = 3"), "level must be in (0, 2], got 3.0"),
    (LOAD.replace("period_s = 10.0", "period_s = 0"), "period_s must be > 0, got 0.0"),
])
def test_event_errors_name_the_file_event_and_line(event: str, fragment: str) -> None:
    # The bad event is the second one, so index and line are not the defaults.
    e = err(toml(SPIKE.replace("15.0", "50.0"), event))
    assert e.index == 1 and e.line == 10
    assert str(e).startswith("bad.toml: event[1] (line 10) ") and fragment in str(e), str(e)


def test_an_event_must_end_within_the_scenario_duration() -> None:
    e = err(toml(DROP, head="version = 1\nduration_s = 25\n"))
    assert "event[0] (line 4) ends at 30 s, after the scenario's duration_s = 25" in str(e)


@pytest.mark.parametrize(("first", "second"), [
    (DROP, DROP.replace("start_s = 20.0", "start_s = 29.9")),
    (DROP, DROP.replace('node = "node-00"', 'node = "*"').replace("start_s = 20.0", "start_s = 15.0")),
    (DROP, DROP.replace('gpu = "0"', 'gpu = "*"').replace("start_s = 20.0", "start_s = 25.0")),
    (SPIKE, SPIKE.replace("start_s = 15.0", "start_s = 15.1")),
    (CHANGE, CHANGE.replace('gpu = "*"', 'gpu = "2"')),
])
def test_events_of_one_kind_must_not_overlap_on_a_gpu(first: str, second: str) -> None:
    e = err(toml(first, second))
    assert e.index == 1 and "overlaps event[0] (line 3) on the same GPU(s)" in str(e)


@pytest.mark.parametrize("second", [
    DROP.replace("start_s = 20.0", "start_s = 30.0"),  # starts where the first ends
    DROP.replace('gpu = "0"', 'gpu = "1"'),
    DROP.replace('node = "node-00"', 'node = "node-01"').replace('gpu = "0"', 'gpu = "*"'),
    SPIKE.replace('"node-01"', '"node-00"').replace('"1"', '"0"').replace("15.0", "25.0"),  # a spike inside a drop
])
def test_events_that_do_not_overlap_are_fine(second: str) -> None:
    assert len(parse_scenario(toml(DROP, second)).events) == 2


def test_load_scenario_names_the_path(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text(toml(DROP.replace("depth = 0.25", "depth = 2")))
    with pytest.raises(ScenarioError, match=rf"^{f}: event\[0\] \(line 3\) depth"):
        load_scenario(f)
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.toml")


# --- truth --------------------------------------------------------------------------------------------------------

def test_truth_gives_absolute_times_by_start() -> None:
    sc = parse_scenario(toml(DROP, SPIKE, CHANGE + '\nnew_workload = "llm-canary"'))
    t0 = 1_796_200_000_123_456_789
    assert sc.truth(t0) == [
        TruthEvent(2, "workload_change", "node-01", "*", t0 + 12_500_000_000, t0 + 12_500_000_000, "no_alert",
                   new_workload="llm-canary"),
        TruthEvent(1, "spike", "node-01", "1", t0 + 15 * S, t0 + 15 * S + 200_000_000, "no_alert", level=0.95),
        TruthEvent(0, "efficiency_drop", "node-00", "0", t0 + 20 * S, t0 + 30 * S, "alert", depth=0.25),
    ]
    ms = parse_scenario(toml(SPIKE + "\nduration_ms = 0.5")).truth(0)[0]
    assert (ms.start_ns, ms.end_ns) == (15 * S, 15 * S + 500_000)
    assert sc.truth(0)[0].covers("node-01", "0") and not sc.truth(0)[1].covers("node-01", "0")


def test_check_cluster_names_what_is_missing() -> None:
    sc = parse_scenario(toml(DROP.replace("node-00", "node-02")), "c.toml")
    sc.check_cluster(3, 1)
    with pytest.raises(ScenarioError, match=r"c.toml: event\[0\] \(line 3\) node 'node-02' is not in the cluster: "
                                            r"it has 2 node\(s\), node-00..node-01"):
        sc.check_cluster(2, 4)
    sc = parse_scenario(toml(DROP.replace('gpu = "0"', 'gpu = "4"')), "c.toml")
    with pytest.raises(ScenarioError, match=r"gpu '4' is not in the cluster: nodes have 4 GPU\(s\), 0..3"):
        sc.check_cluster(1, 4)
    with pytest.raises(ScenarioError, match="node 'node-02'"):
        ClusterSimulator(SimParams(nodes=2), parse_scenario(toml(DROP.replace("node-00", "node-02"))))


# --- the simulator plays the events -------------------------------------------------------------------------------

Run = tuple[dict[Key, tuple[list[int], list[float], list[str]]], list[K8sEvent]]


def play(scenario: Scenario | None, seconds: int = 40, cuts: tuple[float, ...] = (), nodes: int = 2,
         gpus: int = 2) -> Run:
    p = SimParams(nodes=nodes, gpus=gpus, seed=4)
    sim = ClusterSimulator(p, scenario)
    series: dict[Key, tuple[list[int], list[float], list[str]]] = {}
    events: list[K8sEvent] = []
    for c in (*cuts, seconds):
        for b in sim.advance(p.start_ns + int(c * S)):
            ts, vs, wl = series.setdefault((b.sensor, b.node, b.gpu), ([], [], []))
            ts.extend(b.ts_ns)
            vs.extend(b.value)
            wl.extend([str((b.labels or {}).get("workload", ""))] * len(b))
        events.extend(sim.k8s_events())
    return series, events


@pytest.fixture(scope="module")
def base() -> Run:
    return play(None)


def window(run: Run, sensor: str, node: str, gpu: str, lo_s: float, hi_s: float) -> tuple[list[float], list[float]]:
    """(values in [lo_s, hi_s) after the start, values outside)."""
    start = SimParams().start_ns
    ts, vs, _ = run[0][(sensor, node, gpu)]
    inside = [v for t, v in zip(ts, vs, strict=True) if lo_s * S <= t - start < hi_s * S]
    outside = [v for t, v in zip(ts, vs, strict=True) if not lo_s * S <= t - start < hi_s * S]
    return inside, outside


def test_efficiency_drop_scales_activity_and_keeps_power(base: Run) -> None:
    run = play(parse_scenario(toml(DROP)))
    for sensor in ("tensor_active", "sm_active"):
        got_in, got_out = window(run, sensor, "node-00", "0", 20, 30)
        want_in, want_out = window(base, sensor, "node-00", "0", 20, 30)
        assert len(got_in) == 100 and got_out == want_out
        assert got_in == [v * 0.75 for v in want_in]
        assert sum(want_in) > 50  # the window is in compute, so the drop shows
    # FLOPs fall, watts do not: every other stream (power, temperature, clock, utilisation) is as generated.
    changed = {k for k in base[0] if base[0][k] != run[0][k]}
    assert changed == {("tensor_active", "node-00", "0"), ("sm_active", "node-00", "0")}
    assert base[1] == run[1]
    _, tensor, _ = run[0][("tensor_active", "node-00", "0")]
    _, sm, _ = run[0][("sm_active", "node-00", "0")]
    assert all(s >= t for s, t in zip(sm, tensor, strict=True))


def test_spike_sets_utilisation_and_sm_activity(base: Run) -> None:
    run = play(parse_scenario(toml(SPIKE.replace("15.0", "15.05"))))
    util_in, util_out = window(run, "gpu_util", "node-01", "1", 15.05, 15.25)
    sm_in, sm_out = window(run, "sm_active", "node-01", "1", 15.05, 15.25)
    tensor_in, _ = window(run, "tensor_active", "node-01", "1", 15.05, 15.25)
    assert len(util_in) == 2 and util_in == [95.0, 95.0] and sm_in == [0.95, 0.95]
    assert all(t <= 0.95 for t in tensor_in)
    assert window(base, "gpu_util", "node-01", "1", 15.05, 15.25)[1] == util_out
    assert window(base, "sm_active", "node-01", "1", 15.05, 15.25)[1] == sm_out
    assert {k for k in base[0] if base[0][k] != run[0][k]} <= {(s, "node-01", "1") for s in
                                                                ("gpu_util", "sm_active", "tensor_active")}


def test_workload_change_relabels_from_its_start_and_publishes_an_event(base: Run) -> None:
    run = play(parse_scenario(toml(CHANGE, CHANGE.replace("12.5", "30.0") + '\nnew_workload = "llm-canary"')),
               cuts=(10.0, 20.0))
    start = SimParams().start_ns
    for (sensor, node, gpu), (ts, vs, wl) in run[0].items():
        assert (ts, vs) == base[0][(sensor, node, gpu)][:2], "values are untouched"
        if node != "node-01" or gpu == "host":
            assert wl == base[0][(sensor, node, gpu)][2]
            continue
        want = ["llm-serve" if t < start + 12_500_000_000 else "llm-serve-v2" if t < start + 30 * S
                else "llm-canary" for t in ts]
        assert wl == want, sensor
    added = [e for e in run[1] if e not in base[1]]
    assert [(e.node, e.ts_ns, e.reason, e.workload, e.gpus) for e in added] == [
        ("node-01", start + 12_500_000_000, "Scheduled", "llm-serve-v2", ("0", "1")),
        ("node-01", start + 30 * S, "Scheduled", "llm-canary", ("0", "1")),
    ]
    assert "workload llm-serve-v2 -> llm-canary" in added[1].message


def test_parses_a_load_change() -> None:
    (ev,) = parse_scenario(toml(LOAD)).events
    assert ev == ScenarioEvent(0, "load_change", "node-00", "1", 10.0, 20.0, "no_alert", level=0.3, profile="square",
                               period_s=10.0, line=3)
    (step,) = parse_scenario(toml(LOAD.replace('"square"', '"step"').replace("\nperiod_s = 10.0", ""))).events
    assert step.profile == "step" and step.period_s == 0.0


def test_a_load_change_moves_activity_and_power_together_and_keeps_static_power(base: Run) -> None:
    """Low phases [10, 15) and [20, 25): activity x 0.3; power falls towards the idle draw, lagging ~0.5 s."""
    run = play(parse_scenario(toml(LOAD)))
    for sensor in ("sm_active", "tensor_active"):
        got, _ = window(run, sensor, "node-00", "1", 10, 15)
        want, _ = window(base, sensor, "node-00", "1", 10, 15)
        assert got == pytest.approx([v * 0.3 for v in want])
        assert window(run, sensor, "node-00", "1", 15, 20)[0] == window(base, sensor, "node-00", "1", 15, 20)[0]
    got_p, _ = window(run, "power", "node-00", "1", 12, 15)  # settled
    want_p, _ = window(base, "power", "node-00", "1", 12, 15)
    assert sum(got_p) < 0.8 * sum(want_p)
    assert min(got_p) > 0.5 * min(want_p), "the static part of the power stays"
    first, _ = window(run, "power", "node-00", "1", 10.0, 10.1)  # 100 ms into the low phase: still high
    assert first[0] > 0.75 * window(base, "power", "node-00", "1", 10.0, 10.1)[0][0]
    assert window(run, "power", "node-00", "1", 0, 10)[0] == window(base, "power", "node-00", "1", 0, 10)[0]
    changed = {k for k in base[0] if base[0][k] != run[0][k]}
    assert changed == {(s, "node-00", "1") for s in ("gpu_util", "sm_active", "tensor_active", "power")}


def test_wildcards_reach_every_gpu(base: Run) -> None:
    run = play(parse_scenario(toml(DROP.replace('"node-00"', '"*"').replace('"0"', '"*"'))))
    for node in ("node-00", "node-01"):
        for gpu in ("0", "1"):
            got, _ = window(run, "tensor_active", node, gpu, 20, 30)
            want, _ = window(base, "tensor_active", node, gpu, 20, 30)
            assert got == [v * 0.75 for v in want]


def test_a_played_scenario_does_not_depend_on_where_advance_cuts() -> None:
    sc = parse_scenario(toml(DROP, SPIKE, CHANGE))
    assert play(sc) == play(sc, cuts=(12.5, 12.50001, 15.1, 20.0, 25.0, 29.99))


def test_without_a_scenario_the_output_is_what_it_was() -> None:
    # sha256 of every batch of a seeded 30 s run, recorded before the simulator was split into modules and
    # before scenarios existed. If the physics changes on purpose, re-record it (and the scenarios' truth
    # needs no change: it is relative to the start).
    p = SimParams()
    h = hashlib.sha256()
    sim = ClusterSimulator(p)
    for c in (0.05, 7.3, 12, 29.999, 30):
        for b in sim.advance(p.start_ns + int(c * S)):
            h.update(repr((b.sensor, b.node, b.gpu, b.clock, sorted((b.labels or {}).items()))).encode())
            h.update(struct.pack(f"{len(b.ts_ns)}q", *b.ts_ns))
            h.update(struct.pack(f"{len(b.value)}d", *b.value))
        for e in sim.k8s_events():
            h.update(repr(e).encode())
    assert h.hexdigest() == "8e1d9d980709beee19b53f1dcbb9816777ef9dd20e9c615981534ca05dd78724"


def test_an_empty_scenario_changes_nothing(base: Run) -> None:
    assert play(parse_scenario("version = 1\n")) == base


# --- shipped files ------------------------------------------------------------------------------------------------

def test_demo_scenario_has_what_the_demo_shows() -> None:
    sc = load_scenario(SCENARIOS / "demo.toml")
    sc.check_cluster(2, 2)  # the simulate command's default cluster
    assert sc.duration_s is not None and 120 <= sc.duration_s <= 600
    drops = [e for e in sc.events if e.kind == "efficiency_drop"]
    alerts = [e for e in drops if e.expect == "alert"]
    assert [(e.depth, e.duration_s) for e in alerts] == [(0.25, 20.0)] and 55 <= alerts[0].start_s <= 70
    assert any(e.duration_s == 2.0 and e.expect == "no_alert" for e in drops)
    assert any(e.depth == 0.08 and e.expect == "no_alert" for e in drops)
    assert [e.duration_s for e in sc.events if e.kind == "spike"] == [0.2, 0.2]
    assert len([e for e in sc.events if e.kind == "workload_change"]) == 1
    assert all(e.line is not None for e in sc.events)


def test_drift_bench_scenario_is_a_labelled_benchmark() -> None:
    sc = load_scenario(SCENARIOS / "drift-bench.toml")
    sc.check_cluster(4, 4)
    drops = [e for e in sc.events if e.kind == "efficiency_drop"]
    alerts = [e for e in drops if e.expect == "alert"]
    assert len(alerts) >= 50 and len(drops) - len(alerts) >= 30
    assert min(e.depth for e in alerts) == 0.12 and max(e.depth for e in alerts) <= 0.5
    assert min(e.duration_s for e in alerts) == 3.0 and max(e.duration_s for e in alerts) <= 30.0
    assert any(e.duration_s < 3 for e in drops) and any(e.depth < 0.1 for e in drops)
    assert {(e.node, e.gpu) for e in drops} >= {(f"node-0{n}", str(g)) for n in range(4) for g in range(4)}
    assert 1500 <= max(e.start_s + e.duration_s for e in sc.events) <= 1800
    for e in drops:  # the file's labels follow the documented rule
        assert e.expect == ("alert" if e.depth >= 0.12 and e.duration_s >= 3 else "no_alert"), e


def test_the_simulator_plays_the_shipped_demo() -> None:
    sc = load_scenario(SCENARIOS / "demo.toml")
    p = SimParams(seed=1)
    sim = ClusterSimulator(p, sc)
    assert sim.truth() == sc.truth(p.start_ns)
    seen = {b.labels["workload"] for b in sim.advance(p.start_ns + 240 * S) if b.labels and "workload" in b.labels}
    assert "llm-serve-canary" in seen


# --- doctests and the command line --------------------------------------------------------------------------------

@pytest.mark.parametrize("module", [streams.sim.scenario, streams.sim.play])
def test_doctests_pass(module: ModuleType) -> None:
    result = doctest.testmod(module, verbose=False, report=True)
    assert result.attempted >= 1 and result.failed == 0


def test_simulate_refuses_a_bad_scenario_before_touching_kafka(tmp_path: Path) -> None:
    from agents.cli.main import cli

    f = tmp_path / "bad.toml"
    f.write_text(toml(DROP.replace("node-00", "node-07")))
    result = CliRunner().invoke(cli, ["simulate", "--scenario", str(f)])
    assert result.exit_code == 2, result.output
    assert "node 'node-07' is not in the cluster" in result.output
    f.write_text("version = 1\n[[event]]\nkind = 'dip'\n")
    result = CliRunner().invoke(cli, ["simulate", "--scenario", str(f), "--nodes", "8"])
    assert result.exit_code == 2 and "event[0] (line 2) kind must be one of" in result.output


def test_the_demo_finds_its_scripts_and_refuses_a_cluster_its_scenario_does_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    from agents.cli.main import PROJECT_ROOT, cli

    assert (PROJECT_ROOT / "deploy" / "kafka.sh").is_file()
    assert (PROJECT_ROOT / "deploy" / "scenarios" / "live-demo.toml").is_file()
    # Checked before a broker is started: a bootstrap that nothing listens on is never reached.
    monkeypatch.setenv("FLOPWATCH_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    gc_before = gc.get_threshold()
    result = CliRunner().invoke(cli, ["demo", "--nodes", "1", "--duration", "1"])
    assert result.exit_code == 1, result.output
    assert "node 'node-01' is not in the cluster" in result.output
    assert "Traceback" not in result.output
    # The command tuned the process's garbage collector for throughput and put it back as it returned.
    assert gc.get_threshold() == gc_before and PAUSES not in gc.callbacks
