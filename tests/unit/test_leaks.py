"""Golden tests of the seven leak detectors, each with the look-alikes that must not fire."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pytest

from schemas.alerts import decode_alert, encode_alert
from schemas.frame_messages import FrameMessage, GpuFrame
from streams.detect.detectors import Detectors, DetectParams
from streams.leaks.checkpoint import CheckpointStorm
from streams.leaks.episode import price_per_h
from streams.leaks.idle import IdleAllocated
from streams.leaks.memory import Fragmentation
from streams.leaks.nccl import RetransmitStorm, SlowAllreduce
from streams.leaks.params import (
    CheckpointParams,
    FragmentationParams,
    IdleAllocatedParams,
    LeakParams,
    RetransmitParams,
    SlowAllreduceParams,
    StallParams,
    parse_leak_policy,
)
from streams.leaks.pipeline import PipelineStall
from streams.leaks.serving import BatchingCollapse
from streams.policy.tables import PolicyError

S = 1_000_000_000
T0 = 1_796_200_000 * S
PRICE_H = 3.6  # USD per GPU-hour: 0.001 per 1 s tick
GIB = 2.0**30


def frame(values: dict[str, float], pod: str = "p-0", workload: str = "llm", **derived: float) -> GpuFrame:
    return GpuFrame("0", {"pod": pod, "workload": workload, "namespace": "ml"} if pod else {}, values,
                    {"cost_usd": PRICE_H / 3600.0, **derived}, "")


def num(v: object) -> float:
    assert isinstance(v, int | float)
    return float(v)


def run(det: object, frames: Iterable[tuple[int, GpuFrame]]) -> list[tuple[float, str]]:
    """(seconds from T0, state) of every event the detector emits."""
    update: Callable[[int, GpuFrame, float | None], object] = det.update  # type: ignore[attr-defined]
    out = []
    for t, g in frames:
        ev = update(T0 + t * S, g, price_per_h(g, S))
        if ev is not None:
            out.append(((ev.tick_ns - T0) / S, ev.state))  # type: ignore[attr-defined]
    return out


# --- idle_allocated ------------------------------------------------------------------------------------------------

def test_idle_allocated_fires_after_ten_minutes_and_prices_the_idle_hours() -> None:
    d = IdleAllocated(IdleAllocatedParams(), S)
    busy = [(t, frame({"gpu_util": 70.0}, idle=0.0)) for t in range(100)]
    idle = [(t, frame({"gpu_util": 0.0, "sm_active": 0.0}, idle=1.0)) for t in range(100, 1300)]
    back = [(1300, frame({"gpu_util": 60.0}, idle=0.0))]
    events = []
    for t, g in busy + idle + back:
        ev = d.update(T0 + t * S, g, price_per_h(g, S))
        if ev is not None:
            events.append(ev)
    fire, end = events
    assert (fire.state, fire.onset_ns, fire.tick_ns) == ("firing", T0 + 100 * S, T0 + 699 * S)
    assert fire.evidence["cost_usd_per_h"] == PRICE_H and fire.evidence["idle_gpu_hours"] == pytest.approx(600 / 3600, abs=1e-4)
    assert end.state == "resolved" and end.evidence["idle_s"] == 1200.0
    assert end.evidence["cost_usd"] == pytest.approx(1.2, abs=1e-3)  # 1,200 idle GPU-seconds at 3.6 USD/h


def test_an_idle_gpu_no_pod_holds_is_free_capacity_not_a_leak() -> None:
    d = IdleAllocated(IdleAllocatedParams(), S)
    assert run(d, ((t, frame({"gpu_util": 0.0}, pod="", idle=0.0)) for t in range(2000))) == []


def test_a_pod_loading_its_weights_is_not_idle() -> None:
    d = IdleAllocated(IdleAllocatedParams(), S)
    warm = [(t, frame({"gpu_util": 4.0, "sm_active": 0.04, "pcie_rx": 12e9}, idle=1.0)) for t in range(900)]
    assert run(d, warm) == []


def test_a_new_pod_on_the_gpu_starts_the_idle_clock_again() -> None:
    d = IdleAllocated(IdleAllocatedParams(), S)
    a = [(t, frame({"gpu_util": 0.0}, pod="a", idle=1.0)) for t in range(500)]
    b = [(t, frame({"gpu_util": 0.0}, pod="b", idle=1.0)) for t in range(500, 1000)]
    assert run(d, a + b) == []


# --- pipeline_stall ------------------------------------------------------------------------------------------------

def test_pipeline_stall_fires_on_a_lasting_stall_and_resolves() -> None:
    d = PipelineStall(StallParams(), S)
    ok = [(t, frame({"gpu_util": 85.0, "dataloader_wait_ms": 2.0})) for t in range(120)]
    stall = [(t, frame({"gpu_util": 4.0, "dataloader_wait_ms": 600.0})) for t in range(120, 300)]
    back = [(t, frame({"gpu_util": 85.0, "dataloader_wait_ms": 2.0})) for t in range(300, 420)]
    got = run(d, ok + stall + back)
    assert [s for _, s in got] == ["firing", "resolved"]
    assert 150 <= got[0][0] <= 165  # half the 60 s window stalled, then the 10 s hold


def test_a_training_loop_short_stalls_do_not_fire() -> None:
    rng = np.random.default_rng(3)
    d = PipelineStall(StallParams(), S)
    frames = []
    for t in range(3600):  # 2 s stalled in every 9 s: 22% of the time, a dataloader that keeps up on average
        stalled = t % 9 < 2
        frames.append((t, frame({"gpu_util": 3.0 if stalled else 80.0 + 5 * rng.standard_normal(),
                                 "dataloader_wait_ms": 700.0 if stalled else 2.0})))
    assert run(d, frames) == []


# --- batching_collapse ---------------------------------------------------------------------------------------------

def _serve(t: int, q: float, u: float, lat: float) -> tuple[int, GpuFrame]:
    return t, frame({"queue_depth": q, "gpu_util": u, "request_latency_ms": lat})


def test_batching_collapse_follows_the_seeds_table() -> None:
    d = BatchingCollapse(LeakParams().batching_collapse, S)
    steady = [_serve(t, 2, 78, 15) for t in range(300)]
    early = [_serve(t, 17, 32, 92) for t in range(300, 340)]
    cliff = [_serve(t, 43, 4, 310) for t in range(340, 420)]
    got = run(d, steady + early + cliff)
    assert got and got[0][1] == "firing" and 300 < got[0][0] <= 360


def test_a_queue_growing_with_the_load_while_the_gpu_keeps_up_does_not_fire() -> None:
    d = BatchingCollapse(LeakParams().batching_collapse, S)
    steady = [_serve(t, 2, 60, 15) for t in range(300)]
    rush = [_serve(t, 2 + (t - 300) * 0.5, 99, 15 + (t - 300)) for t in range(300, 500)]
    assert run(d, steady + rush) == []


# --- NCCL ------------------------------------------------------------------------------------------------------------

def test_a_retransmit_storm_at_the_seeds_8x_fires() -> None:
    rng = np.random.default_rng(1)
    d = RetransmitStorm(RetransmitParams(), S)
    calm = [(t, frame({"nccl_retries": float(rng.poisson(0.3)), "gpu_util": 80.0})) for t in range(600)]
    storm = [(t, frame({"nccl_retries": float(rng.poisson(2.4)), "gpu_util": 60.0})) for t in range(600, 700)]
    got = run(d, calm + storm)
    assert got and got[0][1] == "firing" and 600 < got[0][0] <= 660  # 4x the window's baseline, then the hold


def test_normal_nccl_variance_does_not_fire() -> None:
    # Retries in clusters (a slow collective retries 1-4 times), 1% of steps very slow: a day of a healthy job.
    rng = np.random.default_rng(2)
    d, slow = RetransmitStorm(RetransmitParams(), S), SlowAllreduce(SlowAllreduceParams(), S)
    frames = []
    for t in range(6 * 3600):
        clusters = rng.poisson(0.1)
        retries = float(sum(rng.integers(1, 5, clusters)))
        ms = math.exp(1.5 + 0.35 * rng.standard_normal()) * (rng.uniform(4, 15) if rng.random() < 0.01 else 1.0)
        frames.append((t, frame({"nccl_retries": retries, "nccl_allreduce_ms": ms, "gpu_util": 80.0})))
    assert run(d, frames) == [] and run(slow, frames) == []


def test_a_lastingly_slow_allreduce_fires_with_the_gpu_time_it_costs() -> None:
    rng = np.random.default_rng(4)
    d = SlowAllreduce(SlowAllreduceParams(), S)
    calm = [(t, frame({"nccl_allreduce_ms": 4.5 * rng.lognormal(0, 0.3), "gpu_util": 85.0})) for t in range(400)]
    slow = [(t, frame({"nccl_allreduce_ms": 18.0 * rng.lognormal(0, 0.3), "gpu_util": 60.0})) for t in range(400, 520)]
    events = []
    for t, g in calm + slow:
        ev = d.update(T0 + t * S, g, price_per_h(g, S))
        if ev is not None:
            events.append(ev)
    [fire] = events
    assert 420 <= (fire.tick_ns - T0) / S <= 460
    assert num(fire.evidence["ratio"]) > 3 and num(fire.evidence["gpu_s_lost_per_h"]) > 600
    assert fire.evidence["cost_usd_per_h"] == pytest.approx(PRICE_H * (1 - 60 / 85), rel=0.05)


# --- memory_fragmentation ------------------------------------------------------------------------------------------

def _mem(t: int, fb_mib: float, reserved: float, allocated: float) -> tuple[int, GpuFrame]:
    return t, frame({"fb_used": fb_mib, "torch_reserved": reserved, "torch_allocated": allocated})


def test_a_growing_driver_gap_fires_with_the_memory_it_strands() -> None:
    d = Fragmentation(FragmentationParams(), S, memory_mib=80 * 1024.0)
    res = 40 * GIB
    frames = [_mem(t, 40 * 1024 + 800 + (0 if t < 600 else (t - 600) * 2.0), res, 0.8 * res) for t in range(1800)]
    events = []
    for t, g in frames:
        ev = d.update(T0 + t * S, g, price_per_h(g, S))
        if ev is not None:
            events.append(ev)
    assert events and events[0].state == "firing" and events[0].evidence["gap"] == "driver"
    assert events[0].evidence["slope_mib_per_min"] == pytest.approx(120.0, rel=0.1)
    assert num(events[0].evidence["cost_usd_per_h"]) > 0


def test_a_growing_allocator_cache_fires() -> None:
    d = Fragmentation(FragmentationParams(), S)
    frames = [_mem(t, 30 * 1024 + 600 + t * 0.5, 30 * GIB + t * 0.5 * 2**20, 10 * GIB) for t in range(900)]
    got = [e for e in (d.update(T0 + t * S, g, price_per_h(g, S)) for t, g in frames) if e is not None]
    assert got and got[0].evidence["gap"] == "allocator"


def test_a_warm_up_and_a_large_flat_cache_do_not_fire() -> None:
    d = Fragmentation(FragmentationParams(), S)
    warm = []
    for t in range(1800):  # the allocator fills to 60 GiB over minutes; fb_used follows it
        res = 60 * GIB * (1 - math.exp(-t / 300))
        warm.append(_mem(t, res / 2**20 + 900, res, 0.75 * res))
    assert run(d, warm) == []
    d = Fragmentation(FragmentationParams(), S)
    flat = [_mem(t, 60 * 1024 + 900, 60 * GIB, 20 * GIB) for t in range(1800)]  # large cache, not growing
    assert run(d, flat) == []


# --- checkpoint_io_storm -------------------------------------------------------------------------------------------

def _ckpt(det: CheckpointStorm, seconds: int, period: int, burst_s: int, rate: Callable[[int], float],
          state: Callable[[int], float]) -> list[tuple[float, str]]:
    out: list[tuple[float, str]] = []
    for t in range(seconds):
        burst = t % period < burst_s
        ev = det.update(T0 + t * S, rate(t) if burst else 2e6, 3.0 if burst else 85.0, state(t), 8 * PRICE_H)
        if ev is not None:
            out.append(((ev.tick_ns - T0) / S, ev.state))
    return out


def test_full_checkpoints_of_an_unchanged_state_are_a_storm() -> None:
    got = _ckpt(CheckpointStorm(CheckpointParams(), S), 400, 60, 4, lambda t: 0.6e9, lambda t: 64e9)
    assert got == [(246.0, "firing")]


def test_checkpoints_of_a_changing_state_do_not_fire() -> None:
    got = _ckpt(CheckpointStorm(CheckpointParams(), S), 900, 60, 4, lambda t: 0.6e9, lambda t: 64e9 * (1 + t / 600))
    assert got == []


def test_irregular_checkpoints_of_varying_size_do_not_fire() -> None:
    rng = np.random.default_rng(5)
    det = CheckpointStorm(CheckpointParams(), S)
    t, out = 0, []
    while t < 7200:  # the simulator's training: 3-8 s writes of 1-6 GB/s every 30-60 s
        for k in range(int(rng.uniform(3, 8))):
            ev = det.update(T0 + (t + k) * S, rng.uniform(0.5, 1) * (2 + 4 * rng.random()) * 1e9, 2.0, 64e9, 1.0)
            out += [ev] if ev else []
        gap = int(rng.uniform(30, 60))
        for k in range(8, gap):
            ev = det.update(T0 + (t + k) * S, 5e6, 80.0, 64e9, 1.0)
            out += [ev] if ev else []
        t += gap
    assert out == []


# --- the alerts -------------------------------------------------------------------------------------------------------

def test_leaks_become_alerts_with_their_rule_cost_and_workload_and_end_with_the_workload() -> None:
    det = Detectors(DetectParams(), S)
    alerts = []
    for t in range(700):
        g = frame({"gpu_util": 0.0, "sm_active": 0.0}, idle=1.0)
        alerts += det.on_message(FrameMessage("node-3", T0 + t * S, S, (g,)))
    [a] = alerts
    assert (a.rule, a.state, a.node, a.gpu, a.workload, a.namespace) == ("idle_allocated", "firing", "node-3", "0",
                                                                          "llm", "ml")
    assert a.evidence["cost_usd_per_h"] == PRICE_H and decode_alert(encode_alert(a)) == a
    moved = frame({"gpu_util": 0.0}, pod="p-1", workload="other", idle=1.0)
    [r] = det.on_message(FrameMessage("node-3", T0 + 700 * S, S, (moved,)))
    assert (r.id, r.state) == (a.id, "resolved")


def test_the_leak_policy_is_strict_and_can_turn_a_rule_off() -> None:
    p = parse_leak_policy({"leaks": {"idle_allocated": {"enabled": False, "idle_s": 60}}}, "l.toml")
    assert not p.idle_allocated.enabled and p.idle_allocated.idle_s == 60.0
    with pytest.raises(PolicyError, match=r"l.toml: \[leaks.pipeline_stall\] has no key 'wait'"):
        parse_leak_policy({"leaks": {"pipeline_stall": {"wait": 1}}}, "l.toml")
    with pytest.raises(PolicyError, match="window_s must be greater than 0"):
        parse_leak_policy({"leaks": {"pipeline_stall": {"window_s": 0}}}, "l.toml")
    det = Detectors(DetectParams(leaks=p), S)
    g = frame({"gpu_util": 0.0}, idle=1.0)
    assert not any(det.on_message(FrameMessage("n", T0 + t * S, S, (g,))) for t in range(900))


def test_the_leak_policy_is_read_through_the_settings(tmp_path: Path) -> None:
    from agents.settings import SettingsError, load_settings

    good = tmp_path / "leaks.toml"
    good.write_text("[leaks.idle_allocated]\nidle_s = 1800\n[leaks.checkpoint_io_storm]\nenabled = false\n")
    p = load_settings({"FLOPWATCH_LEAK_POLICY": str(good)}).detect_params().leaks
    assert p.idle_allocated.idle_s == 1800.0 and not p.checkpoint_io_storm.enabled
    bad = tmp_path / "bad.toml"
    bad.write_text("[leaks.checkpoint_io_storm]\nbursts = 2\n")
    with pytest.raises(SettingsError, match="bursts must be >= 3"):
        load_settings({"FLOPWATCH_LEAK_POLICY": str(bad)}).leak_params()
    with pytest.raises(SettingsError, match="leak_policy: cannot read"):
        load_settings({"FLOPWATCH_LEAK_POLICY": str(tmp_path / "none.toml")}).leak_params()
