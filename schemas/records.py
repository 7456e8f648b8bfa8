"""Record types of the wire contract (version 1) and of the dead-letter path."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

import numpy as np
import numpy.typing as npt

WIRE_VERSION: Final = 1
UTC_CLOCK: Final = "utc"

LabelValue = str | int
Labels = dict[str, LabelValue]


# A message's times and values: lists from producers, numpy views or packed arrays once decoded.
Times = Sequence[int] | npt.NDArray[np.int64]
Values = Sequence[float] | npt.NDArray[np.float64]

class RejectReason(StrEnum):
    """Stable reason codes of the dead-letter topic; consumers may switch on them."""

    MALFORMED_JSON = "malformed_json"
    UNKNOWN_VERSION = "unknown_version"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    NOT_FINITE = "not_finite"
    OUT_OF_RANGE = "out_of_range"
    LENGTH_MISMATCH = "length_mismatch"
    UNKNOWN_SENSOR = "unknown_sensor"
    TOO_OLD = "too_old"
    TOO_NEW = "too_new"
    LATE = "late"
    NO_CLOCK = "no_clock"
    INTERNAL_ERROR = "internal_error"  # a bug of ours tripped on this record; the detail names the exception


@dataclass(frozen=True, slots=True)
class Reject:
    """Why a message (or some samples of it) cannot be used."""

    reason: RejectReason
    detail: str


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of one sensor (the single-sample wire form)."""

    sensor: str
    node: str
    gpu: str
    ts_ns: int
    value: float
    clock: str = UTC_CLOCK
    labels: Labels | None = None


# Not frozen, though nothing changes one after decoding: the decoder makes one per Kafka message, and a frozen
# dataclass's __init__ (object.__setattr__ per field) costs 1 us against 0.2.
@dataclass(slots=True)
class SampleBatch:
    """Readings of one sensor of one GPU (the batch wire form; a single sample is a batch of one)."""

    sensor: str
    node: str
    gpu: str
    # Decoded batches hold int64 and float64 numpy views of their poll's columns (schemas.codec), or
    # array('q') / array('d'): compact either way, and numpy reads them as they are.
    ts_ns: Times
    value: Values
    clock: str = UTC_CLOCK
    labels: Labels | None = None
    ts_min: int | None = None  # filled by the decoder, which scans the times anyway
    ts_max: int | None = None

    @property
    def span(self) -> tuple[int, int]:
        """Earliest and latest time in the batch."""
        if self.ts_min is not None and self.ts_max is not None:
            return self.ts_min, self.ts_max
        return min(self.ts_ns), max(self.ts_ns)

    def __len__(self) -> int:
        return len(self.ts_ns)

    def samples(self) -> list[Sample]:
        return [Sample(self.sensor, self.node, self.gpu, t, v, self.clock, self.labels)
                for t, v in zip(self.ts_ns, self.value, strict=True)]


@dataclass(frozen=True, slots=True)
class ClockBeacon:
    """A reading of clock domain ``clock`` taken between two UTC readings of its host."""

    node: str
    clock: str
    domain_ns: int
    utc_before_ns: int
    utc_after_ns: int

    @property
    def round_trip_ns(self) -> int:
        return self.utc_after_ns - self.utc_before_ns


@dataclass(frozen=True, slots=True)
class K8sEvent:
    """A Kubernetes event that concerns a node (and possibly some of its GPUs)."""

    node: str
    ts_ns: int
    type: str
    reason: str
    kind: str = ""
    namespace: str = ""
    pod: str = ""
    workload: str = ""
    gpus: tuple[str, ...] = field(default_factory=tuple)
    message: str = ""
