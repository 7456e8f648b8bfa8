"""The L1 spike rule in one place: its sensors' thresholds, the window the engine measures, and when a peak is a spike.

The sensors themselves are ``schemas.frames.SPIKE_SENSORS`` (the frame's peak columns are
generated from them); ``streams.detect.spikes.SpikeEngine`` measures each tick's peak, and the
detectors, the workload tap and the ingest all ask this module whether it is a spike.

>>> list(tick_peaks({"gpu_util_p99": 97.0, "sm_active_p99": None}, SPIKE_THRESHOLDS))
[('gpu_util', 97.0, 95.0), ('sm_active', None, 0.95)]
>>> [spike_flags(peak, limit) for _, peak, limit in tick_peaks({"gpu_util_p99": 97.0}, SPIKE_THRESHOLDS)]
[True, False]
>>> spike_evidence(SpikeParams())
{'quantile': 0.99, 'window_ms': 1000, 'bucket_ms': 100}
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, TypeGuard

from schemas.frames import SPIKE_SENSORS, peak_column

SPIKE_THRESHOLDS: Final[Mapping[str, float]] = MappingProxyType({"gpu_util": 95.0, "sm_active": 0.95})
SPIKE_RULES: Final[Mapping[str, str]] = MappingProxyType({"gpu_util": "util_spike", "sm_active": "sm_spike"})
assert tuple(SPIKE_THRESHOLDS) == tuple(SPIKE_RULES) == SPIKE_SENSORS, "one threshold and one rule per spike sensor"


@dataclass(frozen=True, slots=True)
class SpikeParams:
    bucket_ns: int = 100_000_000
    window_ns: int = 1_000_000_000
    quantile: float = 0.99
    max_per_bucket: int = 64  # the largest values kept per bucket (see streams.detect.spikes)
    # How far behind its newest sample a series keeps buckets. Live, a tick stays open about
    # idle 15 s + lateness 2 s; replaying a backlog, the samples of minutes ahead arrive
    # before a tick closes. The pipeline releases each series as its ticks close
    # (``release``), so this is only the backstop for a series whose ticks never do.
    horizon_ns: int = 600_000_000_000
    max_series: int = 200_000

    def __post_init__(self) -> None:
        if self.bucket_ns <= 0 or self.window_ns <= 0 or self.window_ns % self.bucket_ns:
            raise ValueError("bucket_ns and window_ns must be > 0, window_ns a multiple of bucket_ns")
        if not 0.5 <= self.quantile <= 1.0:
            raise ValueError(f"quantile must be in [0.5, 1] (top values are kept), got {self.quantile}")
        if self.max_per_bucket < 1 or self.max_series < 1:
            raise ValueError("max_per_bucket and max_series must be >= 1")
        if self.horizon_ns < self.window_ns:
            raise ValueError("horizon_ns must cover at least one window")


def spike_flags(peak: float | None, threshold: float) -> TypeGuard[float]:
    """A tick is a spike when its peak is above the threshold (no samples: no spike).

    >>> spike_flags(None, 95.0), spike_flags(95.0, 95.0), spike_flags(95.5, 95.0)
    (False, False, True)
    """
    return peak is not None and peak > threshold


def spike_ended(peak: float | None, threshold: float) -> bool:
    """An open spike ends at a tick whose peak is at or below the threshold, or that has none.

    Not quite ``not spike_flags``: a NaN peak (which the frames codec never delivers) neither
    starts nor ends a spike.

    >>> spike_ended(None, 95.0), spike_ended(95.0, 95.0), spike_ended(float("nan"), 95.0)
    (True, True, False)
    """
    return peak is None or peak <= threshold


def tick_peaks(derived: Mapping[str, float | None],
               thresholds: Mapping[str, float]) -> Iterator[tuple[str, float | None, float]]:
    """(sensor, the tick's peak or None, threshold) of each spike sensor that has a threshold."""
    for sensor in SPIKE_SENSORS:
        limit = thresholds.get(sensor)
        if limit is not None:
            yield sensor, derived.get(peak_column(sensor)), limit


def spike_evidence(params: SpikeParams) -> dict[str, float | int]:
    """What a spike alert says about how its peak was measured."""
    return {"quantile": params.quantile, "window_ms": params.window_ns // 1_000_000,
            "bucket_ms": params.bucket_ns // 1_000_000}
