"""flopwatch's Prometheus figures: running totals become counter increments (never negative), labels, and the
text exposition parses back to the same numbers."""

from __future__ import annotations

import asyncio
import math
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents.detect.agent import DetectStats
from agents.ingest.stats import IngestStats
from agents.metrics import DELAY_BUCKETS_S, AlertDelays, Metrics
from schemas.alerts import make_alert
from streams.decide.engine import DecisionTally
from streams.detect.detectors import AlertTally


def tally(*kinds: tuple[str, str, str | None]) -> DecisionTally:
    t = DecisionTally()
    for action, outcome, gate in kinds:
        t.add(action, outcome, gate)
    return t


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def parsed(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the rendered text, keyed by name and sorted labels."""
    body, _ = m.render()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def test_ingest_totals_become_increments() -> None:
    m = Metrics(process=False)
    st = IngestStats(samples=100, frames_written=10, rejects=Counter({"late": 2}), lag=None)
    m.observe_ingest(st)
    m.observe_ingest(st)  # the same totals again: nothing new
    assert value(m, "flopwatch_samples_total") == 100
    assert value(m, "flopwatch_frames_written_total") == 10
    assert value(m, "flopwatch_rejects_total", reason="late") == 2
    assert math.isnan(value(m, "flopwatch_consumer_lag") or 0.0)  # not known yet: NaN, not a claimed 0
    st.samples, st.frames_written, st.lag = 250, 12, 7
    st.rejects["late"] += 1
    st.rejects["malformed_json"] = 4
    m.observe_ingest(st)
    assert value(m, "flopwatch_samples_total") == 250
    assert value(m, "flopwatch_frames_written_total") == 12
    assert value(m, "flopwatch_rejects_total", reason="late") == 3
    assert value(m, "flopwatch_rejects_total", reason="malformed_json") == 4
    assert value(m, "flopwatch_consumer_lag") == 7


def test_what_the_ingest_holds_open_is_a_gauge() -> None:
    m = Metrics(process=False)
    m.observe_ingest(IngestStats(open_cells=17_920, held=3, paced=5))
    assert value(m, "flopwatch_open_cells") == 17_920 and value(m, "flopwatch_held_messages") == 3
    assert value(m, "flopwatch_paced_partitions") == 5
    m.observe_ingest(IngestStats(open_cells=0, held=0))  # it goes down as the watermark passes
    assert value(m, "flopwatch_open_cells") == 0 and value(m, "flopwatch_held_messages") == 0
    assert value(m, "flopwatch_paced_partitions") == 0


def test_a_total_that_goes_down_is_a_reset_and_counters_never_go_back() -> None:
    m = Metrics(process=False)
    m.observe_ingest(IngestStats(samples=1000, rejects=Counter({"late": 5})))
    m.observe_ingest(IngestStats(samples=30, rejects=Counter({"late": 1})))  # a fresh ingest: counts from 0
    assert value(m, "flopwatch_samples_total") == 1030
    assert value(m, "flopwatch_rejects_total", reason="late") == 6
    m.observe_ingest(IngestStats(samples=40, rejects=Counter({"late": 1})))
    assert value(m, "flopwatch_samples_total") == 1040
    assert value(m, "flopwatch_rejects_total", reason="late") == 6


def test_every_reject_reason_starts_at_zero() -> None:
    # increase() over the first reject of a kind needs a 0 sample before it.
    m = Metrics(process=False)
    assert value(m, "flopwatch_rejects_total", reason="no_clock") == 0
    assert value(m, "flopwatch_rejects_total", reason="internal_error") == 0


def test_detect_totals_and_firing() -> None:
    m = Metrics(process=False)
    d = DetectStats(frames=5, firing=1, rejects=1, errors=1, alerts=AlertTally({"efficiency_drift": 2}))
    m.observe_detect(d)
    d.frames, d.firing = 9, 0
    d.alerts.by_rule["util_spike"] = 1
    m.observe_detect(d)
    assert value(m, "flopwatch_detect_frames_total") == 9
    assert value(m, "flopwatch_detect_rejects_total") == 2  # undecodable plus detector failures
    assert value(m, "flopwatch_alerts_firing") == 0  # a gauge: it follows the agent down
    assert value(m, "flopwatch_alerts_sent_total", rule="efficiency_drift") == 2
    assert value(m, "flopwatch_alerts_sent_total", rule="util_spike") == 1


def test_decisions_by_action_outcome_and_gate() -> None:
    m = Metrics(process=False)
    t = tally(("scale_up", "taken", None), ("scale_up", "taken", None), ("scale_down", "withheld", "l1_spike"))
    m.observe_decisions(t)
    m.observe_decisions(t)  # the same totals again add nothing
    assert value(m, "flopwatch_decisions_total", action="scale_up", outcome="taken", gate="none") == 2
    assert value(m, "flopwatch_decisions_total", action="scale_down", outcome="withheld", gate="l1_spike") == 1
    t.add("scale_up", "taken", None)
    m.observe_decisions(t)
    assert value(m, "flopwatch_decisions_total", action="scale_up", outcome="taken", gate="none") == 3
    with pytest.raises(ValueError, match="outcome"):
        m.observe_decisions(tally(("scale_up", "done", None)))
    with pytest.raises(ValueError, match="action"):
        m.observe_decisions(tally(("", "taken", None)))


def test_delay_histogram_in_seconds() -> None:
    m = Metrics(process=False)
    for s in (0.05, 2.5, 3.5):
        m.observe_delay("alert", s)
    m.observe_delay("trigger", 61.0)
    assert value(m, "flopwatch_detector_delay_seconds_count", kind="alert") == 3
    assert value(m, "flopwatch_detector_delay_seconds_sum", kind="alert") == pytest.approx(6.05)
    assert value(m, "flopwatch_detector_delay_seconds_bucket", kind="alert", le="3.0") == 2
    assert value(m, "flopwatch_detector_delay_seconds_bucket", kind="trigger", le="60.0") == 0
    assert value(m, "flopwatch_detector_delay_seconds_bucket", kind="trigger", le="90.0") == 1
    assert list(DELAY_BUCKETS_S) == sorted(DELAY_BUCKETS_S)
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="delay"):
            m.observe_delay("alert", bad)


def test_render_parses_back_to_the_same_values() -> None:
    m = Metrics()
    m.observe_ingest(IngestStats(samples=12345, frames_written=99, rejects=Counter({"too_old": 3}), lag=42))
    m.observe_detect(DetectStats(frames=7, firing=2, alerts=AlertTally({"sm_spike": 4})))
    m.observe_decisions(tally(("rebalance", "taken", None)))
    m.observe_delay("alert", 1.5)
    body, content_type = m.render()
    assert content_type.startswith("text/plain") and "version=" in content_type
    got = parsed(m)
    assert got[("flopwatch_samples_total", ())] == 12345
    assert got[("flopwatch_frames_written_total", ())] == 99
    assert got[("flopwatch_rejects_total", (("reason", "too_old"),))] == 3
    assert got[("flopwatch_consumer_lag", ())] == 42
    assert got[("flopwatch_alerts_firing", ())] == 2
    assert got[("flopwatch_alerts_sent_total", (("rule", "sm_spike"),))] == 4
    assert got[("flopwatch_decisions_total", (("action", "rebalance"), ("gate", "none"), ("outcome", "taken")))] == 1
    assert got[("flopwatch_detector_delay_seconds_count", (("kind", "alert"),))] == 1
    assert ("process_cpu_seconds_total", ()) in got  # the process collector rides along
    # The text format would carry counters' start times as extra gauge series; they are left out.
    assert not [name for name, _ in got if name.endswith("_created")]
    names = {fam.name for fam in text_string_to_metric_families(body.decode())}
    assert all(n.startswith(("flopwatch_", "process_")) for n in names)


def test_each_metrics_object_has_its_own_registry() -> None:
    a, b = Metrics(), Metrics()  # the same names twice: no clash, as there would be in the default registry
    a.observe_decisions(tally(("scale_up", "taken", None)))
    assert value(a, "flopwatch_decisions_total", action="scale_up", outcome="taken", gate="none") == 1
    assert value(b, "flopwatch_decisions_total", action="scale_up", outcome="taken", gate="none") is None


def test_alert_delays_sink_records_firing_alerts_only() -> None:
    m = Metrics(process=False)
    t0 = 1_796_200_000 * 10**9
    fired = make_alert("efficiency_drift", "warning", "node-1", "0", value=0.7, threshold=0.88,
                       onset_ts_ns=t0, ts_ns=t0 + 3_200_000_000)
    asyncio.run(AlertDelays(m).send([fired, fired.resolved(t0 + 60 * 10**9)]))
    assert value(m, "flopwatch_detector_delay_seconds_count", kind="alert") == 1
    assert value(m, "flopwatch_detector_delay_seconds_sum", kind="alert") == pytest.approx(3.2)
