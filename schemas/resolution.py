"""The resolution at which ``gpu_frames`` keeps each value, and the rounding to it.

A frame's mean of ten noisy samples carries a full 52-bit mantissa, and no float codec compresses
noise: stored as is, a value costs ~7 bytes. Rounded to a power-of-two step at or below the
sensor's own resolution, its low mantissa bits are zero and Gorilla + ZSTD keep it in ~1-2 bytes,
with every column still Float64 under its name (SQL, views and rollups unchanged). The rounding
error is at most half a step; frames on Kafka are not rounded.

>>> import numpy as np
>>> at_resolution("power", np.array([126.87734813098378, np.nan]))
array([126.875,     nan])
>>> at_resolution("ecc_errors", np.array([3.0]))  # counters are kept exactly
array([3.])
>>> step("power"), step("ecc_errors_last"), step("cost_usd")
(0.0625, None, 9.313225746154785e-10)
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from schemas.catalog import CATALOG, STORAGE_RESOLUTION
from schemas.frames import DERIVED_COLUMNS, PEAK_COLUMNS, SPIKE_SENSORS

# The derived columns' steps: no finer than their inputs' (power to 1/16 W of ~500 W is ~1e-4).
_DERIVED: Final[dict[str, int]] = {
    "tflops": -4,  # 1/16 TFLOP/s
    "flops_per_watt": 26,  # ~6.7e7 FLOPS/W of ~1e12
    "cost_per_tflops": -20,  # ~1e-6 USD per TFLOP/s-hour of ~0.04
    "energy_j": -4,
    "cost_usd": -30,  # ~1e-9 USD of ~1e-3 per GPU-second
    **{p: STORAGE_RESOLUTION[s] for s, p in zip(SPIKE_SENSORS, PEAK_COLUMNS, strict=True)},
}
# Column -> binary exponent of its step; a column not here is stored exactly.
EXPONENTS: Final[dict[str, int]] = {
    **{s.column(a): STORAGE_RESOLUTION[s.name] for s in CATALOG if s.kind == "gauge" for a in s.aggs},
    **_DERIVED,
}
assert set(_DERIVED) <= set(DERIVED_COLUMNS)


def step(column: str) -> float | None:
    """The column's storage step in its unit, None where it is stored exactly."""
    exp = EXPONENTS.get(column)
    return None if exp is None else float(np.ldexp(1.0, exp))


def at_resolution(column: str, values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``values`` rounded to the column's step (half to even; exact, the step being a power of two);
    NaN (no value) stays NaN."""
    exp = EXPONENTS.get(column)
    if exp is None:
        return values
    return np.ldexp(np.round(np.ldexp(values, -exp)), exp)


def stored_as(column: str, stored: float, value: float, rel: float = 1e-9) -> bool:
    """Whether ``stored`` is what ``gpu_frames`` keeps of ``value``: within half the column's step (and ``rel``
    for two computations of the same value, which may fall on either side of a half step).

    >>> stored_as("power", 126.875, 126.87734813098378), stored_as("power", 126.9375, 126.87734813098378)
    (True, False)
    >>> stored_as("ecc_errors", 3.0, 3.0), stored_as("ecc_errors", 3.0, 3.5)
    (True, False)
    """
    q = step(column)
    return abs(stored - value) <= (0.0 if q is None else q / 2) + rel * max(1.0, abs(value))
