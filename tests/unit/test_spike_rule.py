"""The L1 spike rule is one rule: the detectors, the workload tap and the frame columns agree on it."""

from __future__ import annotations

import math

from schemas.frame_messages import FrameMessage, GpuFrame
from schemas.frames import DERIVED_COLUMNS, PEAK_COLUMNS, SPIKE_SENSORS
from streams.detect.detectors import Detectors, DetectParams
from streams.detect.spike_rule import SPIKE_RULES, SPIKE_THRESHOLDS, SpikeParams, spike_ended, spike_flags
from streams.detect.workload_tap import WorkloadTap

S = 1_000_000_000


def test_every_spike_sensor_has_a_threshold_a_rule_and_a_peak_column() -> None:
    assert set(SPIKE_THRESHOLDS) == set(SPIKE_RULES) == set(SPIKE_SENSORS)
    assert set(PEAK_COLUMNS) <= set(DERIVED_COLUMNS)


def test_the_alert_evidence_reads_the_spike_params() -> None:
    spike = GpuFrame("0", {}, {}, {"gpu_util_p99": 99.0}, "")
    [a] = Detectors(DetectParams(), S).on_message(FrameMessage("n", S, S, (spike,)))
    assert a.evidence == {"quantile": 0.99, "window_ms": 1000, "bucket_ms": 100}
    p = DetectParams(spike=SpikeParams(bucket_ns=50_000_000, window_ns=500_000_000, quantile=0.95))
    [a] = Detectors(p, S).on_message(FrameMessage("n", S, S, (spike,)))
    assert a.evidence == {"quantile": 0.95, "window_ms": 500, "bucket_ms": 50}


def test_the_detectors_and_the_tap_flag_the_same_ticks() -> None:
    tap = WorkloadTap(SPIKE_THRESHOLDS, lambda _model: None)
    det = Detectors(DetectParams(), S)
    for k, peak in enumerate([94.0, 95.0, 95.01, 99.0, 20.0, None, 96.0]):
        g = GpuFrame("0", {"workload": "w"}, {}, {"gpu_util_p99": peak}, "")
        m = FrameMessage("n", k * S, S, (g,))
        det.on_message(m)
        [sample] = tap.summarise(m, drifting=())
        assert sample.spike == spike_flags(peak, SPIKE_THRESHOLDS["gpu_util"]) == bool(det.firing), peak


def test_a_nan_peak_neither_starts_nor_ends_a_spike() -> None:
    assert not spike_flags(math.nan, 95.0) and not spike_ended(math.nan, 95.0)
