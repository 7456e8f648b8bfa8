"""The aligned frame as a contract: its columns, named once for the aligner, the sinks, the DDL
and the tests. Generated from the catalog; code reads a column by name, never by position.

>>> VALUE_COLUMNS[:3], COUNT_COLUMNS[:2]
(('gpu_util', 'gpu_util_max', 'sm_active'), ('n_gpu_util', 'n_sm_active'))
>>> INSERT_COLUMNS[:3], INSERT_COLUMNS[-2:]
(('ts', 'node', 'gpu'), ('sm_active_p99', 'derive_note'))
>>> value_index("power") == VALUE_COLUMNS.index("power")
True
>>> PEAK_COLUMNS
('gpu_util_p99', 'sm_active_p99')
"""

from __future__ import annotations

from typing import Final

from schemas.catalog import CATALOG, LABEL_COLUMNS, value_columns

VALUE_COLUMNS: Final = tuple(col for _, _, col in value_columns())  # one per sensor aggregate
COUNT_COLUMNS: Final = tuple(s.count_column for s in CATALOG)  # samples per sensor and cell
LABEL_COLS: Final = tuple(LABEL_COLUMNS.values())
# The L1 spike rule's sensors (streams.detect.spike_rule): each has a peak column in the frame.
SPIKE_SENSORS: Final = ("gpu_util", "sm_active")


def peak_column(sensor: str) -> str:
    """The derived column holding a spike sensor's sliding-window peak within the tick."""
    return f"{sensor}_p99"


PEAK_COLUMNS: Final = tuple(peak_column(s) for s in SPIKE_SENSORS)
# Filled by streams.efficiency.derive after aggregation; NULL where an input is missing, and then
# ``derive_note`` says which (NOTE_CODES).
DERIVED_COLUMNS: Final = ("tflops", "flops_per_watt", "cost_per_tflops", "energy_j", "cost_usd", "idle",
                          *PEAK_COLUMNS)
NOTE_COLUMN: Final = "derive_note"
NOTE_CODES: Final = ("host", "unknown_model", "unknown_precision", "no_price", "no_activity", "no_power",
                     "zero_throughput")
# Insert order of gpu_frames; ``ts`` is epoch milliseconds on the wire for both layouts.
INSERT_COLUMNS: Final = ("ts", "node", "gpu", *LABEL_COLS, *VALUE_COLUMNS, *COUNT_COLUMNS, "clock_uncertainty_us",
                         *DERIVED_COLUMNS, NOTE_COLUMN)
_VALUE_INDEX: Final = {c: i for i, c in enumerate(VALUE_COLUMNS)}
_COUNT_INDEX: Final = {c: i for i, c in enumerate(COUNT_COLUMNS)}


def value_index(column: str) -> int:
    """Position of a value column in a frame's ``values``; KeyError names a column that is not one."""
    try:
        return _VALUE_INDEX[column]
    except KeyError:
        raise KeyError(f"{column!r} is not a value column of gpu_frames") from None


def count_index(column: str) -> int:
    try:
        return _COUNT_INDEX[column]
    except KeyError:
        raise KeyError(f"{column!r} is not a count column of gpu_frames") from None
