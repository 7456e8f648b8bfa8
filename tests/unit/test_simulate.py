"""The cluster simulator: determinism, chunking invariance, ranges, and believable correlations."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.catalog import BY_NAME, CATALOG
from schemas.records import K8sEvent, SampleBatch
from streams.sim.simulate import (
    GPU_PHYSICS,
    XID_CODES,
    ClusterSimulator,
    SimParams,
    node_name,
)

S = 1_000_000_000
Key = tuple[str, str, str]  # (sensor, node, gpu)
Series = dict[Key, tuple[list[int], list[float]]]


def collect(sim: ClusterSimulator, cuts: list[int]) -> tuple[Series, list[K8sEvent]]:
    series: Series = {}
    events: list[K8sEvent] = []
    for cut in cuts:
        for b in sim.advance(cut):
            ts, vs = series.setdefault((b.sensor, b.node, b.gpu), ([], []))
            ts.extend(b.ts_ns)
            vs.extend(b.value)
        events.extend(sim.k8s_events())
    return series, events


@cache
def run(seconds: int, nodes: int = 2, gpus: int = 2, seed: int = 0, leak: float = 0.0,
        fault_scale: float = 1.0) -> tuple[SimParams, Series, list[K8sEvent]]:
    p = SimParams(nodes=nodes, gpus=gpus, seed=seed, leak_mib_per_s=leak, fault_scale=fault_scale)
    series, events = collect(ClusterSimulator(p), [p.start_ns + seconds * S])
    return p, series, events


def arr(series: Series, sensor: str, node: int, gpu: str) -> tuple[np.ndarray, np.ndarray]:
    ts, vs = series[(sensor, node_name(node), gpu)]
    return np.asarray(ts, dtype=np.int64), np.asarray(vs, dtype=np.float64)


def per_second(ts: np.ndarray, vs: np.ndarray, start_ns: int, seconds: int) -> np.ndarray:
    """Mean per 1 s bucket (NaN where empty)."""
    idx = (ts - start_ns) // S
    sums = np.bincount(idx, weights=vs, minlength=seconds)[:seconds]
    counts = np.bincount(idx, minlength=seconds)[:seconds]
    with np.errstate(invalid="ignore"):
        return sums / counts


def corr(a: np.ndarray, b: np.ndarray) -> float:
    ok = np.isfinite(a) & np.isfinite(b)
    return float(np.corrcoef(a[ok], b[ok])[0, 1])


def test_node_name() -> None:
    assert [node_name(i) for i in (0, 1, 12)] == ["node-00", "node-01", "node-12"]


def test_deterministic_for_a_seed_and_seeds_differ() -> None:
    _, a, ea = run(20, seed=5)
    b, eb = collect(ClusterSimulator(SimParams(seed=5)), [SimParams().start_ns + 20 * S])
    _, c, _ = run(20, seed=6)
    assert a == b and ea == eb
    assert a.keys() == c.keys()
    assert a[("power", "node-00", "0")] != c[("power", "node-00", "0")]


# A leak makes node-00 go through OOMKilled restarts within the window, so invariance covers them too.
CHUNK_SECONDS = 60
CHUNK_LEAK = 1500.0


@settings(max_examples=12, deadline=None)
@given(st.lists(st.integers(0, CHUNK_SECONDS * S), max_size=25))
def test_chunking_invariance(cuts: list[int]) -> None:
    p, whole, whole_events = run(CHUNK_SECONDS, leak=CHUNK_LEAK)
    end = p.start_ns + CHUNK_SECONDS * S
    sliced, sliced_events = collect(ClusterSimulator(p), [p.start_ns + c for c in sorted(cuts)] + [end])
    assert sliced == whole
    assert sliced_events == whole_events
    assert any(e.reason == "OOMKilled" for e in whole_events)


def test_batches_are_well_formed() -> None:
    p = SimParams(nodes=2, gpus=3, seed=2)
    sim = ClusterSimulator(p)
    prev = p.start_ns
    for cut in (prev + 1, prev + 50_000_000, prev + 3 * S, prev + 3 * S, prev + 17 * S, prev + 31 * S):
        batches = sim.advance(cut)
        assert sim.now_ns == cut
        keys = [(b.sensor, b.node, b.gpu) for b in batches]
        assert len(keys) == len(set(keys)), "one batch per (sensor, node, gpu) per advance"
        for b in batches:
            assert isinstance(b, SampleBatch) and b.clock == "utc"
            assert len(b.ts_ns) == len(b.value) > 0
            assert all(type(t) is int for t in b.ts_ns) and all(type(v) is float for v in b.value)
            assert all(prev <= t < cut for t in b.ts_ns)
            assert all(t1 < t2 for t1, t2 in zip(b.ts_ns, b.ts_ns[1:], strict=False))
            assert b.labels is not None
            if BY_NAME[b.sensor].scope == "host":
                assert b.gpu == "host" and b.labels == {"gpu_model": "H200", "region": "us-east"}
            else:
                assert b.gpu in {"0", "1", "2"}
                assert set(b.labels) == {"gpu_model", "region", "namespace", "pod", "workload", "class", "rank", "pid"}
                assert b.labels["class"] == ("training" if b.node == "node-00" else "inference")
                assert isinstance(b.labels["rank"], int) and isinstance(b.labels["pid"], int)
        prev = cut
    with pytest.raises(ValueError):
        sim.advance(prev - 1)


def test_all_23_sensors_appear_and_streams_follow_the_workload_class() -> None:
    _, series, _ = run(30)
    assert {k[0] for k in series} == {s.name for s in CATALOG}
    training = {k[0] for k in series if k[1] == "node-00"}
    inference = {k[0] for k in series if k[1] == "node-01"}
    assert not training & {"queue_depth", "request_rate", "request_latency_ms"}
    assert not inference & {"nccl_allreduce_ms", "nccl_retries", "dataloader_wait_ms"}
    assert {"torch_allocated", "torch_reserved"} <= training & inference


def test_values_finite_and_within_catalog_range() -> None:
    for _, series, _ in (run(300, leak=400.0), run(60, fault_scale=1000.0)):
        for (sensor, _, _), (_, vs) in series.items():
            s = BY_NAME[sensor]
            v = np.asarray(vs)
            assert np.isfinite(v).all(), sensor
            assert (v >= s.lo).all() and (v <= s.hi).all(), (sensor, v.min(), v.max())


def test_counters_and_events() -> None:
    _, series, _ = run(60, fault_scale=1000.0)
    xids = 0
    for (sensor, _, _), (_, vs) in series.items():
        v = np.asarray(vs)
        if sensor in ("ecc_errors", "nccl_retries", "xid_errors", "queue_depth", "gpu_util", "fb_used"):
            assert (v == np.round(v)).all(), sensor
        if sensor == "nccl_retries":
            assert (np.diff(v) >= 0).all()
        if sensor == "ecc_errors":
            d = np.diff(v)
            assert ((d >= 0) | (v[1:] == 0)).all(), "a counter only grows or resets to 0"
            assert v.max() > 0
        if sensor == "xid_errors":
            assert set(v) <= {0.0, *map(float, XID_CODES)}
            xids += int((v > 0).sum())
    assert xids > 0


def test_power_follows_tensor_activity_on_training_gpus() -> None:
    _, series, _ = run(120)
    for gpu in ("0", "1"):
        _, power = arr(series, "power", 0, gpu)
        _, tensor = arr(series, "tensor_active", 0, gpu)
        _, sm = arr(series, "sm_active", 0, gpu)
        _, util = arr(series, "gpu_util", 0, gpu)
        assert corr(power, tensor) > 0.7
        assert corr(util, sm) > 0.9
        assert (sm >= tensor).all()
        idle_w, tdp_w = GPU_PHYSICS["H200"].idle_w, GPU_PHYSICS["H200"].tdp_w
        assert 0.8 * idle_w < power.min() < 1.3 * idle_w and 0.8 * tdp_w < power.max() <= 1.05 * tdp_w
        assert 0.6 < np.quantile(tensor, 0.75) < 0.95  # mostly computing


def test_temperature_lags_power() -> None:
    p, series, _ = run(300)
    ts, power = arr(series, "power", 0, "0")
    _, temp = arr(series, "temperature", 0, "0")
    pw, tc = per_second(ts, power, p.start_ns, 300), per_second(ts, temp, p.start_ns, 300)
    lags = list(range(-30, 31))
    cs = [corr(pw[max(0, -lag):300 - max(0, lag)], tc[max(0, lag):300 - max(0, -lag)]) for lag in lags]
    best = lags[int(np.argmax(cs))]
    assert 1 <= best <= 30, best  # temperature is behind power, not ahead
    # Temperature is a low-pass of power: it tracks power smoothed over ~25 s far better than power itself.
    alpha, level = 1 - math.exp(-p.nvml_period_ns / S / 25.0), power[0]
    smoothed = np.empty_like(power)
    for i, w in enumerate(power):
        level += (w - level) * alpha
        smoothed[i] = level
    assert corr(temp, smoothed) > 0.95 > corr(temp, power) + 0.3
    assert temp.min() >= 30 and temp.max() <= 90


def test_clock_throttles_only_when_hot() -> None:
    _, series, _ = run(240, nodes=1, gpus=4)
    throttled_hot_slot = 0
    for gpu in "0123":
        ts_c, clock = arr(series, "sm_clock", 0, gpu)
        ts_t, temp = arr(series, "temperature", 0, gpu)
        assert (ts_c == ts_t).all()
        hot = temp > 80
        assert (clock[~hot] == 1980).all()
        assert (clock[hot] < 1980).all()
        assert clock.min() >= GPU_PHYSICS["H200"].min_clock_mhz
        if gpu == "3":
            throttled_hot_slot = int(hot.sum())
    assert throttled_hot_slot > 0, "the GPU in the hot slot throttles at some point"


def test_memory_ordering_allocated_reserved_fb_used() -> None:
    _, series, _ = run(120)
    for node in (0, 1):
        for gpu in ("0", "1"):
            ts_a, alloc = arr(series, "torch_allocated", node, gpu)
            ts_r, res = arr(series, "torch_reserved", node, gpu)
            ts_f, fb = arr(series, "fb_used", node, gpu)
            assert (ts_a == ts_r).all() and (alloc <= res).all() and (alloc > 0).all()
            nearest = np.clip(np.searchsorted(ts_f, ts_r), 1, len(ts_f) - 1)
            nearest -= (ts_r - ts_f[nearest - 1]) < (ts_f[nearest] - ts_r)
            assert (res <= fb[nearest] * 2**20).all()
            assert fb.max() < GPU_PHYSICS["H200"].mem_mib
            if node == 0:  # training memory grows to a plateau
                assert fb[-1] > 0.6 * GPU_PHYSICS["H200"].mem_mib
                assert (np.diff(fb) >= 0).all()


def test_leak_ends_in_oom_and_restart() -> None:
    _, series, events = run(CHUNK_SECONDS, leak=CHUNK_LEAK)
    ooms = [e for e in events if e.reason == "OOMKilled"]
    assert ooms and all(e.node == "node-00" and e.type == "Warning" for e in ooms)
    assert [e.reason for e in events if e.node == "node-01"] == ["Scheduled", "Started"]
    oom = ooms[0].ts_ns
    ts, fb = arr(series, "fb_used", 0, "0")
    before, after = fb[ts < oom], fb[ts >= oom]
    assert before[-1] > 0.99 * GPU_PHYSICS["H200"].mem_mib and after[0] == 0
    ts_step, _ = arr(series, "torch_reserved", 0, "1")
    assert not ((ts_step >= oom) & (ts_step < oom + 15 * S)).any(), "no training steps while the pod is down"


def test_training_phases_show_in_framework_and_host_streams() -> None:
    _, series, _ = run(180)
    ts_w, wait = arr(series, "dataloader_wait_ms", 0, "0")
    ts_t, tensor = arr(series, "tensor_active", 0, "0")
    stalled = wait > 100
    assert stalled.any() and np.median(wait) < 10
    at = np.clip(np.searchsorted(ts_t, ts_w), 0, len(ts_t) - 1)
    assert tensor[at[stalled]].mean() < 0.2 < 0.6 < tensor[at[~stalled]].mean()
    _, allreduce = arr(series, "nccl_allreduce_ms", 0, "0")
    assert 2 < np.median(allreduce) < 15 and allreduce.max() < 1000
    ts_d, disk = arr(series, "disk_write", 0, "host")
    burst_starts = ts_d[1:][(disk[1:] > 1e9) & (disk[:-1] <= 1e9)]
    assert len(burst_starts) >= 2
    gaps = np.diff(burst_starts) / S
    assert ((gaps > 25) & (gaps < 75)).all(), gaps
    _, cpu = arr(series, "host_cpu_util", 0, "host")
    assert cpu.max() > 80 and np.median(cpu) < 50


def test_inference_signals_follow_request_rate() -> None:
    p, series, _ = run(600, seed=3)
    for gpu in ("0", "1"):
        ts_r, rate = arr(series, "request_rate", 1, gpu)
        _, queue = arr(series, "queue_depth", 1, gpu)
        _, latency = arr(series, "request_latency_ms", 1, gpu)
        ts_t, tensor = arr(series, "tensor_active", 1, gpu)
        tensor_1s = per_second(ts_t, tensor, p.start_ns, 600)[(ts_r - p.start_ns) // S]
        assert corr(tensor_1s, rate) > 0.7
        # Queue depth rises with the rate (monotone, not linear: a backlog builds only above capacity).
        assert corr(np.argsort(np.argsort(queue)), np.argsort(np.argsort(rate))) > 0.7
        assert corr(latency, queue) > 0.7
        assert rate.max() > 1.8 * rate.min()  # the daily cycle and bursts


def test_params_are_validated() -> None:
    with pytest.raises(ValueError):
        SimParams(nodes=0)
    with pytest.raises(ValueError):
        SimParams(jitter_ns=60_000_000)
    with pytest.raises(ValueError):
        SimParams(leak_mib_per_s=10.0, leak_node=5)
    with pytest.raises(ValueError):
        SimParams(leak_mib_per_s=math.inf)
