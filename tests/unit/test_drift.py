"""Golden tests of the efficiency-drift rule: seeded noisy FLOPS/W streams with known change points."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.drift import DriftBank, DriftEvent, DriftParams, EfficiencyDrift

S = 1_000_000_000
GRIDS = [S, S // 10]
LEVEL = 4.0e10  # FLOPS/W of a busy GPU (any scale: the rule is relative)

Segment = tuple[float, float]  # (start second, level factor from then on)


def stream(grid_ns: int, seconds: float, segments: Sequence[Segment] = (), noise: float = 0.02,
           seed: int = 0) -> list[tuple[int, float]]:
    """Ticks of a piecewise-constant level times (1 + seeded gaussian noise)."""
    n = int(seconds * S) // grid_ns
    ticks = np.arange(n, dtype=np.int64) * grid_ns
    factor = np.ones(n)
    for start_s, f in segments:
        factor[ticks >= int(start_s * S)] = f
    values = LEVEL * factor * (1 + np.random.default_rng(seed).normal(0.0, noise, n))
    return list(zip(ticks.tolist(), values.tolist(), strict=True))


def run(d: EfficiencyDrift | DriftBank, ticks: Iterable[tuple[int, float | None]], context: str = "ns/job/bf16",
        key: tuple[str, str] = ("n0", "0")) -> list[DriftEvent]:
    out: list[DriftEvent] = []
    for t, v in ticks:
        out += d.update(key, t, v, context) if isinstance(d, DriftBank) else d.update(t, v, context)
    return out


def brief(events: Iterable[DriftEvent]) -> list[tuple[str, float, float, str]]:
    return [(e.state, e.onset_ns / S, e.tick_ns / S, str(e.evidence.get("reason", ""))) for e in events]


@pytest.mark.parametrize(("grid_ns", "confirm_s"), [(S, 102.0), (S // 10, 102.9)])
def test_a_drop_is_confirmed_at_the_exact_tick(grid_ns: int, confirm_s: float) -> None:
    ev = run(EfficiencyDrift(DriftParams(), grid_ns), stream(grid_ns, 150, [(100, 0.8)], seed=11))
    assert brief(ev) == [("firing", 100.0, confirm_s, "")]
    e = ev[0]
    assert e.evidence["held_ns"] == 3 * S and e.evidence["ticks_below"] == 3 * S // grid_ns
    assert e.threshold == pytest.approx(e.baseline * 0.88)
    assert e.baseline == pytest.approx(LEVEL, rel=0.01) and e.value < e.threshold
    assert e.evidence["detector"] == "page_hinkley"
    assert 100 * S <= int(e.evidence["river_onset_ns"]) <= e.tick_ns  # River saw it inside the run


@pytest.mark.parametrize("detector", ["page_hinkley", "adwin"])
def test_the_persistence_rule_not_river_decides_the_tick(detector: Literal["page_hinkley", "adwin"]) -> None:
    ev = run(EfficiencyDrift(DriftParams(detector=detector), S), stream(S, 150, [(100, 0.8)], seed=11))
    assert brief(ev) == [("firing", 100.0, 102.0, "")]


@pytest.mark.parametrize("grid_ns", GRIDS)
def test_dips_of_one_or_two_seconds_give_no_event(grid_ns: int) -> None:
    segs: list[Segment] = []
    for i, length in enumerate([1, 2, 1, 2, 2]):
        start = 80 + 20 * i
        segs += [(start, 0.5), (start + length, 1.0)]
    assert run(EfficiencyDrift(DriftParams(), grid_ns), stream(grid_ns, 200, segs, seed=12)) == []


@pytest.mark.parametrize(("grid_ns", "factor"), [(S, 0.92), (S // 10, 0.90)])
def test_shallow_drops_give_no_event(grid_ns: int, factor: float) -> None:
    assert run(EfficiencyDrift(DriftParams(), grid_ns), stream(grid_ns, 300, [(80, factor)], seed=13)) == []


@pytest.mark.parametrize("grid_ns", GRIDS)
def test_a_new_workload_is_learnt_not_reported(grid_ns: int) -> None:
    d = EfficiencyDrift(DriftParams(), grid_ns)
    first = stream(grid_ns, 100, seed=14)
    second = [(t + 100 * S, v * 0.5) for t, v in stream(grid_ns, 100, [(5, 0.9), (10, 1.0)], seed=15)]
    assert run(d, first, "ns/a/bf16") + run(d, second, "ns/b/fp8") == []
    assert d.baseline == pytest.approx(0.5 * LEVEL, rel=0.02)


def test_an_open_alert_resolves_on_workload_change_and_nothing_fires_while_learning() -> None:
    d = EfficiencyDrift(DriftParams(), S)
    ev = run(d, stream(S, 110, [(100, 0.7)], seed=16), "ns/a/bf16")
    assert brief(ev) == [("firing", 100.0, 102.0, "")]
    # The new job starts at the low level and drops again 10 s in: still learning, so silent.
    after = [(t + 110 * S, v * 0.7) for t, v in stream(S, 19, [(10, 0.5)], seed=17)]
    ev = run(d, after, "ns/b/bf16")
    assert brief(ev) == [("resolved", 100.0, 110.0, "workload_change")]
    assert d.baseline is None  # 10 accepted values so far; 20 needed


def test_a_missing_frame_on_a_context_change_still_resolves_with_the_last_value() -> None:
    d = EfficiencyDrift(DriftParams(), S)
    run(d, stream(S, 110, [(100, 0.7)], seed=16))
    (ev,) = d.update(110 * S, None, "other")
    assert ev.state == "resolved" and ev.evidence["reason"] == "workload_change"
    assert ev.value < ev.threshold


@pytest.mark.parametrize(("grid_ns", "resolve_s"), [(S, 159.0), (S // 10, 159.9)])
def test_a_permanent_shift_becomes_the_new_baseline(grid_ns: int, resolve_s: float) -> None:
    d = EfficiencyDrift(DriftParams(), grid_ns)
    ev = run(d, stream(grid_ns, 400, [(100, 0.8)], seed=18))
    assert brief(ev) == [("firing", 100.0, 102.0 if grid_ns == S else 102.9, ""),
                         ("resolved", 100.0, resolve_s, "new_baseline")]
    assert ev[1].evidence["new_baseline"] == pytest.approx(0.8 * LEVEL, rel=0.01)
    assert ev[1].baseline == ev[0].baseline and ev[1].threshold == ev[0].threshold
    assert d.baseline == pytest.approx(0.8 * LEVEL, rel=0.01)


@pytest.mark.parametrize("grid_ns", GRIDS)
def test_a_recovery_resolves_after_the_hold(grid_ns: int) -> None:
    ev = run(EfficiencyDrift(DriftParams(), grid_ns), stream(grid_ns, 200, [(100, 0.7), (130, 1.0)], seed=19))
    last = (130 * S + 3 * S - grid_ns) / S
    assert brief(ev) == [("firing", 100.0, (100 * S + 3 * S - grid_ns) / S, ""), ("resolved", 100.0, last, "recovered")]
    assert ev[1].evidence["held_ns"] == 3 * S


def test_missing_frames_do_not_break_a_run_but_a_long_gap_does() -> None:
    base = stream(S, 100, seed=20)
    low = 0.7 * LEVEL
    d = EfficiencyDrift(DriftParams(), S)
    run(d, base)
    # below, missing, below: the run spans 3 s at the second below tick
    ev = run(d, [(100 * S, low), (101 * S, None), (102 * S, low)])
    assert brief(ev) == [("firing", 100.0, 102.0, "")] and ev[0].evidence["ticks_below"] == 2
    d = EfficiencyDrift(DriftParams(), S)
    run(d, base)
    assert run(d, [(100 * S, low), (104 * S, low), (105 * S, low)]) == []  # 4 s without data: a new run
    assert brief(run(d, [(106 * S, low)])) == [("firing", 104.0, 106.0, "")]


def test_suspect_values_do_not_teach_the_baseline() -> None:
    d = EfficiencyDrift(DriftParams(), S)
    for t, v in stream(S, 30, seed=21):
        d.update(t, v * 0.1, "job", suspect=True)
    assert d.baseline is None
    run(d, [(t + 30 * S, v) for t, v in stream(S, 30, seed=22)])
    assert d.baseline == pytest.approx(LEVEL, rel=0.01)


def test_old_or_repeated_ticks_are_ignored() -> None:
    d = EfficiencyDrift(DriftParams(), S)
    run(d, stream(S, 50, seed=23))
    before = d.snapshot()
    assert d.update(49 * S, 0.0, "job") == [] and d.update(10 * S, 0.0, "other") == []
    assert d.ignored == 2 and {**d.snapshot(), "ignored": 0} == {**before, "ignored": 0}


EPISODES: list[Segment] = [(90, 0.7), (95, 1.0), (130, 0.75), (134, 1.0), (160, 0.8), (300, 1.0), (330, 0.6)]


@pytest.mark.parametrize("detector", ["page_hinkley", "adwin"])
@pytest.mark.parametrize("grid_ns", GRIDS)
def test_snapshot_restore_mid_stream_gives_identical_events(grid_ns: int, detector: Literal["page_hinkley", "adwin"]) -> None:
    params = DriftParams(detector=detector)
    ticks = stream(grid_ns, 420, EPISODES, seed=24)
    whole = run(EfficiencyDrift(params, grid_ns), ticks)
    assert [e.state for e in whole].count("firing") >= 3
    for cut_s in (50, 91, 101, 131, 170, 229, 331.5):
        cut = int(cut_s * S) // grid_ns
        d = EfficiencyDrift(params, grid_ns)
        head = run(d, ticks[:cut])
        d2 = EfficiencyDrift.restore(params, grid_ns, json.loads(json.dumps(d.snapshot())))
        assert head + run(d2, ticks[cut:]) == whole, cut_s


def test_bank_snapshot_keeps_entities_and_their_order() -> None:
    params = DriftParams()
    bank = DriftBank(params, S, max_entities=3)
    for g in "abcd":
        run(bank, stream(S, 110, [(100, 0.7)], seed=ord(g)), key=("n", g))
    assert bank.keys() == [("n", "b"), ("n", "c"), ("n", "d")] and bank.evicted == 1
    copy = DriftBank.restore(params, S, json.loads(json.dumps(bank.snapshot())), max_entities=3)
    more = stream(S, 60, seed=99)
    for g in "bcd":
        tail = [(t + 110 * S, v) for t, v in more]
        assert run(bank, tail, key=("n", g)) == run(copy, tail, key=("n", g))
    run(bank, [(0, 1.0)], key=("n", "e"))
    run(copy, [(0, 1.0)], key=("n", "e"))
    assert bank.keys() == copy.keys() == [("n", "c"), ("n", "d"), ("n", "e")]


@pytest.mark.parametrize("grid_ns", GRIDS)
def test_memory_stays_bounded_over_1e5_ticks(grid_ns: int) -> None:
    seconds = 100_000 * grid_ns / S
    segs: list[Segment] = []
    for start in np.arange(100, seconds - 200, 250):
        segs += [(float(start), 0.7), (float(start) + 120, 1.0)]  # long enough to re-learn, then back up
    d = EfficiencyDrift(DriftParams(), grid_ns)
    cap = DriftParams().baseline_ns // grid_ns
    peak = dict.fromkeys(d.buffer_lengths(), 0)
    events = []
    for t, v in stream(grid_ns, seconds, segs, seed=25):
        events += d.update(t, v, "job")
        peak = {k: max(peak[k], n) for k, n in d.buffer_lengths().items()}
    assert len(events) >= 4
    assert peak["baseline"] == peak["sorted"] == cap and peak["level"] <= cap
    assert peak["run"] <= 3 * S // grid_ns
    assert len(json.dumps(d.snapshot())) < 40 * cap + 4_000


def test_parameters_are_validated() -> None:
    with pytest.raises(ValueError, match="drop"):
        DriftParams(drop=1.5)
    with pytest.raises(ValueError, match="min_baseline_ns"):
        DriftParams(min_baseline_ns=120 * S)
    with pytest.raises(ValueError, match="detector"):
        DriftParams(detector="cusum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="threshold"):
        DriftParams(ph_threshold=-1)
    with pytest.raises(ValueError, match="grid"):
        EfficiencyDrift(DriftParams(), 0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000),
       segs=st.lists(st.tuples(st.floats(20, 400), st.sampled_from([0.5, 0.7, 0.85, 0.9, 1.0, 1.1])), max_size=12),
       switches=st.lists(st.floats(0, 400), max_size=2),
       holes=st.lists(st.integers(0, 399), max_size=30))
def test_episodes_pair_up_and_replay_is_deterministic(seed: int, segs: list[Segment], switches: list[float],
                                                      holes: list[int]) -> None:
    ticks: list[tuple[int, float | None]] = [(t, None if t // S in holes else v)
                                             for t, v in stream(S, 400, sorted(segs), seed=seed)]

    def go() -> list[DriftEvent]:
        d, out = EfficiencyDrift(DriftParams(), S), []
        for t, v in ticks:
            ctx = f"job{sum(t >= s * S for s in switches)}"
            out += d.update(t, v, ctx)
        return out

    events = go()
    assert events == go()
    open_onset: int | None = None
    for e in events:
        if e.state == "firing":
            assert open_onset is None
            open_onset = e.onset_ns
        else:
            assert open_onset == e.onset_ns
            open_onset = None
        assert e.onset_ns <= e.tick_ns
