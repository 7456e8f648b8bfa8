"""What a frame's compute is worth: achieved TFLOP/s, FLOPS/Watt, cost per TFLOP/s, energy, cost, idle.

Pure and vectorised over a poll's frames: the price book's answers are looked up once
per distinct (model, region, precision), not per frame. A derived value is NULL (NaN)
only where an input is missing, and the frame's note says which (``schemas.frames.NOTE_CODES``):

- ``host``: the node's host pseudo-GPU has no compute;
- ``unknown_model`` / ``unknown_precision``: no peak TFLOP/s for the GPU model or precision;
- ``no_price``: the price book has no hourly price for the model in the region;
- ``no_activity``: neither tensor_active nor sm_active was sampled;
- ``no_power``: no power sample (FLOPS/Watt and energy stay NULL);
- ``zero_throughput``: the GPU did no work, so cost per TFLOP/s is unbounded.

>>> import numpy as np
>>> from streams.align.aggregate import FrameBatch
>>> from schemas.frames import VALUE_COLUMNS
>>> vals = {c: np.full(2, np.nan) for c in VALUE_COLUMNS}
>>> vals["tensor_active"][:] = [0.5, np.nan]; vals["power"][:] = [500.0, 400.0]
>>> b = FrameBatch(np.array([0, 0]), ["n", "n"], ["0", "1"], [{"gpu_model": "X"}, {"gpu_model": "X", "pod": "p"}],
...                vals, {}, np.zeros(2, np.int64))
>>> class Book:
...     def knows(self, model): return model == "X"
...     def peak_tflops(self, model, precision): return 1000.0
...     def hourly_usd(self, model, region): return 4.0
>>> d = derive(b, Book(), 1_000_000_000)
>>> d.columns["tflops"].tolist()[0], d.columns["flops_per_watt"].tolist()[0], d.columns["cost_per_tflops"].tolist()[0]
(500.0, 1000000000000.0, 0.008)
>>> d.notes
['', 'no_activity']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

from schemas.catalog import HOST_GPU
from schemas.frames import DERIVED_COLUMNS, NOTE_CODES, PEAK_COLUMNS
from streams.align.aggregate import FrameBatch

F64 = npt.NDArray[np.float64]
DEFAULT_PRECISION: Final = "bf16"


class Pricing(Protocol):
    """What derive needs from the GPU specs and the price book."""

    def knows(self, gpu_model: str) -> bool: ...
    def peak_tflops(self, gpu_model: str, precision: str) -> float | None: ...
    def hourly_usd(self, gpu_model: str, region: str | None) -> float | None: ...


@dataclass(frozen=True, slots=True)
class IdleParams:
    """An allocated GPU (its frame has a pod) is idle when both its utilisation and its activity
    are at most these (where sampled)."""

    max_util_pct: float = 5.0
    max_activity: float = 0.05


@dataclass(frozen=True, slots=True)
class Derived:
    columns: dict[str, F64]  # every DERIVED_COLUMNS entry; idle as 0.0 / 1.0 / NaN
    notes: list[str]  # per frame, comma-separated codes ("" when nothing is missing)


def derive(batch: FrameBatch, pricing: Pricing, grid_ns: int, idle: IdleParams = IdleParams(),
           peaks: dict[str, F64] | None = None) -> Derived:
    """The derived columns of ``batch``; ``peaks`` carries the spike engine's columns when it ran."""
    n = len(batch)
    peak, price, key_notes = _lookups(batch, pricing)
    host = np.fromiter((g == HOST_GPU for g in batch.gpu), bool, n)
    tensor, sm = batch.values["tensor_active"], batch.values["sm_active"]
    activity = np.where(np.isnan(tensor), sm, tensor)
    power = batch.values["power"]
    grid_s = grid_ns / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        tflops = peak * activity
        fpw = np.where(power > 0, tflops * 1e12 / power, np.nan)
        cost_per = np.where(tflops > 0, price / tflops, np.nan)
    energy = power * grid_s
    cost = price * (grid_s / 3600.0)
    idle_flag = _idle(batch, activity, idle)
    cols = {"tflops": tflops, "flops_per_watt": fpw, "cost_per_tflops": cost_per, "energy_j": energy,
            "cost_usd": cost, "idle": idle_flag}
    for c in PEAK_COLUMNS:
        cols[c] = peaks[c] if peaks is not None and c in peaks else np.full(n, np.nan)
    for c, col in cols.items():
        if c not in PEAK_COLUMNS:
            col[host] = np.nan
    assert set(cols) == set(DERIVED_COLUMNS)
    masks = {"host": host, "no_activity": ~host & np.isnan(activity), "no_power": ~host & np.isnan(power),
             "zero_throughput": ~host & (tflops == 0)}
    return Derived(cols, _notes(n, key_notes, host, masks))


def _lookups(batch: FrameBatch, pricing: Pricing) -> tuple[F64, F64, list[str]]:
    """Peak TFLOP/s and hourly price per frame, and each frame's notes about its labels."""
    n = len(batch)
    peak, price = np.full(n, np.nan), np.full(n, np.nan)
    notes = [""] * n
    cache: dict[tuple[str, str | None, str], tuple[float, float, str]] = {}
    for i, lab in enumerate(batch.labels):
        key = (str(lab.get("gpu_model", "")), _opt(lab.get("region")), str(lab.get("precision") or DEFAULT_PRECISION))
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = _lookup(pricing, *key)
        peak[i], price[i], notes[i] = hit
    return peak, price, notes


def _lookup(pricing: Pricing, model: str, region: str | None, precision: str) -> tuple[float, float, str]:
    if not model or not pricing.knows(model):
        return np.nan, np.nan, "unknown_model,no_price"
    got = pricing.peak_tflops(model, precision)
    usd = pricing.hourly_usd(model, region)
    codes = [c for c, missing in (("unknown_precision", got is None), ("no_price", usd is None)) if missing]
    return (np.nan if got is None else got), (np.nan if usd is None else usd), ",".join(codes)


def _opt(v: object) -> str | None:
    return None if v is None or v == "" else str(v)


def _idle(batch: FrameBatch, activity: F64, p: IdleParams) -> F64:
    util = batch.values["gpu_util"]
    known = ~(np.isnan(util) & np.isnan(activity))
    quiet = np.where(np.isnan(util), True, util <= p.max_util_pct) & np.where(
        np.isnan(activity), True, activity <= p.max_activity)
    allocated = np.fromiter((bool(lab.get("pod")) for lab in batch.labels), bool, len(batch))
    return np.where(known, (allocated & quiet).astype(np.float64), np.nan)


def _notes(n: int, key_notes: list[str], host: npt.NDArray[np.bool_],
           masks: dict[str, npt.NDArray[np.bool_]]) -> list[str]:
    out = list(key_notes)
    for i in np.flatnonzero(host).tolist():
        out[i] = ""  # a host row has no model; "host" says it all
    flagged = np.zeros(n, bool)
    for m in masks.values():
        flagged |= m
    for i in np.flatnonzero(flagged).tolist():
        codes = set(filter(None, out[i].split(",")))
        codes.update(c for c, m in masks.items() if m[i])
        if "host" in codes:
            codes = {"host"}
        out[i] = ",".join(c for c in NOTE_CODES if c in codes)
    return out
