"""gpu_frames keeps each value at its column's resolution: within half a step of the frame, counters exact,
and a stored table of noisy frames at <= 2 bytes per sensor value."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from agents.sinks.clickhouse import ChdbBackend
from agents.sinks.schema import ensure_schema
from agents.sinks.store import FrameStore, Pending
from schemas import ddl
from schemas.catalog import CATALOG, STORAGE_RESOLUTION
from schemas.resolution import EXPONENTS, at_resolution, step
from streams.align.aggregate import FrameBatch

DB = "fwres"
N = 5_000


@pytest.fixture(scope="module")
def b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChdbBackend]:
    backend = ChdbBackend(tmp_path_factory.mktemp("res") / "db", DB)
    ensure_schema(backend)
    yield backend
    backend.close()


def test_every_gauge_and_float_derived_column_has_a_step_and_counters_and_events_have_none() -> None:
    assert set(STORAGE_RESOLUTION) == {s.name for s in CATALOG if s.kind == "gauge"}
    for s in CATALOG:
        for col in s.columns:
            assert (step(col) is not None) == (s.kind == "gauge"), col
    assert {c for c in ddl.DERIVED_COLS if step(c) is None} == {"idle"}
    assert all(-30 <= e <= 30 for e in EXPONENTS.values())


def test_rounding_is_to_the_nearest_step_and_keeps_what_is_already_on_it() -> None:
    v = np.array([0.03125, 0.09375, 126.9, -1.0, 1e13, np.nan, 0.0])
    got = at_resolution("power", v)  # 1/16 W; halves go to even
    assert got[:5].tolist() == [0.0, 0.125, 126.875, -1.0, 1e13] and np.isnan(got[5]) and got[6] == 0.0
    on_grid = np.arange(1000) / 16.0
    assert (at_resolution("power", on_grid) == on_grid).all()


def _batch(rng: np.random.Generator, t0: int) -> FrameBatch:
    """One GPU, N one-second frames of noisy, unquantized values (as a mean of samples is)."""
    values = {}
    for s in CATALOG:
        for col in s.columns:
            base = rng.uniform(0.0, min(s.hi, 1e10))
            noise = rng.normal(0.0, 1.0, N) * base * 0.01
            values[col] = (np.round(base + np.cumsum(rng.integers(0, 2, N)))
                           if s.kind != "gauge" else np.clip(base + noise, s.lo, s.hi))
    derived = {c: rng.uniform(1.0, 500.0, N) * (1e12 if c == "flops_per_watt" else 1.0)
               for c in ddl.DERIVED_COLS if c != "idle"} | {"idle": np.zeros(N)}
    return FrameBatch(tick_ns=t0 + np.arange(N, dtype=np.int64) * 1_000_000_000, node=["n"] * N, gpu=["0"] * N,
                      labels=[{"workload": "w"}] * N, values=values,
                      counts={c: np.full(N, 10, dtype=np.int64) for c in ddl.COUNT_COLS},
                      clock_uncertainty_ns=np.zeros(N, dtype=np.int64), derived=derived, notes=[""] * N)


def test_stored_values_are_within_half_a_step_of_the_frame_and_counters_are_exact(b: ChdbBackend) -> None:
    batch = _batch(np.random.default_rng(7), 1_764_000_000 * 1_000_000_000)
    FrameStore(b).write(Pending([batch], {c: [] for c in ddl.EVENT_COLUMNS}), {}, 0)
    cols = [c for c in (*ddl.VALUE_COLS, *ddl.DERIVED_COLS) if c != "idle"]
    _, rows = b.rows(f"SELECT {', '.join(cols)} FROM {DB}.gpu_frames ORDER BY ts")
    stored = np.array(rows, dtype=np.float64).T
    for col, got in zip(cols, stored, strict=True):
        want = batch.column(col)
        q = step(col)
        if q is None:
            assert (got == want).all(), col  # counters and events: every bit
        else:
            assert (np.abs(got - want) <= q / 2).all() and (np.round(got / q) * q == got).all(), col
