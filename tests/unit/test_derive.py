"""streams.efficiency.derive: the efficiency and cost columns, and the reasons a value is NULL."""

from __future__ import annotations

import math

import numpy as np
import pytest

from schemas.frames import DERIVED_COLUMNS, NOTE_CODES, VALUE_COLUMNS
from schemas.records import Labels
from streams.align.aggregate import FrameBatch
from streams.efficiency.derive import IdleParams, derive

GRID = 1_000_000_000


class Book:
    """Two models; H has a price in us-east only, no fp64."""

    def knows(self, model: str) -> bool:
        return model in {"H", "L"}

    def peak_tflops(self, model: str, precision: str) -> float | None:
        table = {("H", "bf16"): 1000.0, ("H", "fp8"): 2000.0, ("L", "bf16"): 100.0}
        return table.get((model, precision))

    def hourly_usd(self, model: str, region: str | None) -> float | None:
        return {("H", "us-east"): 3.6, ("L", "us-east"): 0.72, ("L", None): 0.8}.get((model, region))


def batch(rows: list[dict[str, float]], labels: list[Labels], gpus: list[str] | None = None) -> FrameBatch:
    n = len(rows)
    vals = {c: np.array([r.get(c, math.nan) for r in rows], float) for c in VALUE_COLUMNS}
    return FrameBatch(np.arange(n, dtype=np.int64) * GRID, ["n"] * n, gpus or [str(i) for i in range(n)], labels,
                      vals, {}, np.zeros(n, np.int64))


def test_efficiency_and_cost_follow_the_definitions() -> None:
    b = batch([{"tensor_active": 0.4, "sm_active": 0.9, "power": 500.0, "gpu_util": 90.0}],
              [{"gpu_model": "H", "region": "us-east", "pod": "p"}])
    d = derive(b, Book(), GRID)
    c = {k: v.tolist()[0] for k, v in d.columns.items()}
    assert set(c) == set(DERIVED_COLUMNS)
    assert c["tflops"] == pytest.approx(400.0)  # tensor activity wins over sm activity
    assert c["flops_per_watt"] == pytest.approx(400e12 / 500.0)
    assert c["cost_per_tflops"] == pytest.approx(3.6 / 400.0)
    assert c["energy_j"] == pytest.approx(500.0)
    assert c["cost_usd"] == pytest.approx(3.6 / 3600.0)
    assert c["idle"] == 0.0 and d.notes == [""]


def test_sm_activity_and_precision_and_grid_step_are_used() -> None:
    b = batch([{"sm_active": 0.5, "power": 250.0}], [{"gpu_model": "H", "region": "us-east", "precision": "fp8"}])
    d = derive(b, Book(), GRID // 10)
    assert d.columns["tflops"][0] == pytest.approx(1000.0)
    assert d.columns["energy_j"][0] == pytest.approx(25.0)
    assert d.columns["cost_usd"][0] == pytest.approx(3.6 / 36000.0)


@pytest.mark.parametrize(("row", "labels", "note", "null", "kept"), [
    ({"sm_active": 0.5, "power": 300.0}, {"gpu_model": "Z"}, "unknown_model,no_price", {"tflops", "cost_usd"},
     {"energy_j"}),
    ({"sm_active": 0.5, "power": 300.0}, {"gpu_model": "H", "region": "us-east", "precision": "fp64"},
     "unknown_precision", {"tflops", "flops_per_watt", "cost_per_tflops"}, {"cost_usd", "energy_j"}),
    ({"sm_active": 0.5, "power": 300.0}, {"gpu_model": "H", "region": "eu"}, "no_price",
     {"cost_usd", "cost_per_tflops"}, {"tflops", "flops_per_watt"}),
    ({"power": 300.0}, {"gpu_model": "L", "region": "us-east"}, "no_activity", {"tflops", "idle"},
     {"energy_j", "cost_usd"}),
    ({"sm_active": 0.5}, {"gpu_model": "L"}, "no_power", {"flops_per_watt", "energy_j"}, {"tflops", "cost_usd"}),
    ({"sm_active": 0.0, "power": 80.0, "gpu_util": 0.0}, {"gpu_model": "L", "pod": "p"}, "zero_throughput",
     {"cost_per_tflops"}, {"flops_per_watt", "idle"}),
])
def test_a_null_value_comes_with_its_reason(row: dict[str, float], labels: Labels, note: str, null: set[str],
                                            kept: set[str]) -> None:
    d = derive(batch([row], [labels]), Book(), GRID)
    assert d.notes == [note] and all(c in NOTE_CODES for c in note.split(","))
    for c in null:
        assert math.isnan(d.columns[c][0]), c
    for c in kept:
        assert not math.isnan(d.columns[c][0]), c


def test_idle_means_allocated_without_work() -> None:
    rows = [{"gpu_util": 1.0, "sm_active": 0.01, "power": 60.0}] * 2 + [{"gpu_util": 50.0, "sm_active": 0.4}]
    labels: list[Labels] = [{"gpu_model": "L", "pod": "p"}, {"gpu_model": "L"}, {"gpu_model": "L", "pod": "p"}]
    d = derive(batch(rows, labels), Book(), GRID, IdleParams(max_util_pct=5.0, max_activity=0.05))
    assert d.columns["idle"].tolist() == [1.0, 0.0, 0.0]


def test_host_rows_have_no_compute_and_say_so() -> None:
    d = derive(batch([{"host_cpu_util": 30.0}], [{}], gpus=["host"]), Book(), GRID)
    assert d.notes == ["host"] and all(math.isnan(d.columns[c][0]) for c in DERIVED_COLUMNS)


def test_spike_peaks_are_carried_through() -> None:
    b = batch([{"sm_active": 0.5, "power": 300.0}], [{"gpu_model": "L"}])
    d = derive(b, Book(), GRID, peaks={"gpu_util_p99": np.array([99.0]), "sm_active_p99": np.array([0.97])})
    assert d.columns["gpu_util_p99"].tolist() == [99.0] and d.columns["sm_active_p99"].tolist() == [0.97]


def test_vectorised_over_many_frames_matches_frame_by_frame() -> None:
    rng = np.random.default_rng(7)
    rows = [{"tensor_active": float(t), "power": float(p), "gpu_util": float(u)}
            for t, p, u in zip(rng.uniform(0, 1, 300), rng.uniform(50, 700, 300), rng.uniform(0, 100, 300), strict=True)]
    labels: list[Labels] = [{"gpu_model": m, "region": "us-east"} for m in rng.choice(["H", "L", "Z"], 300).tolist()]
    whole = derive(batch(rows, labels), Book(), GRID)
    for i in range(0, 300, 37):
        one = derive(batch([rows[i]], [labels[i]]), Book(), GRID)
        assert one.notes[0] == whole.notes[i]
        for c in DERIVED_COLUMNS:
            a, b = one.columns[c][0], whole.columns[c][i]
            assert (math.isnan(a) and math.isnan(b)) or a == b
