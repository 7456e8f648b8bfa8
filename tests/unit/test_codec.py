import orjson
import pytest

from schemas.codec import (
    TimeLimits,
    decode_beacon,
    decode_k8s_event,
    decode_samples,
    encode_batch,
    encode_beacon,
    encode_k8s_event,
    encode_sample,
)
from schemas.records import ClockBeacon, K8sEvent, Reject, RejectReason, Sample, SampleBatch

NOW = 1_796_200_344_000_000_000
OK = {"v": 1, "node": "node-07", "gpu": "GPU-1f2e", "ts_ns": NOW, "clock": "utc", "value": 312.5,
      "labels": {"gpu_model": "H200", "region": "us-east", "rank": 3, "pid": 4711, "extra": "ignored"}}


def dec(obj: object, sensor: str = "power", limits: TimeLimits | None = None) -> SampleBatch | Reject:
    raw = obj if isinstance(obj, bytes) else orjson.dumps(obj)
    return decode_samples(raw, sensor, limits)


def reason(obj: object, sensor: str = "power", limits: TimeLimits | None = None) -> RejectReason:
    res = dec(obj, sensor, limits)
    assert isinstance(res, Reject), res
    assert res.detail
    return res.reason


def test_single_sample_decodes_to_a_batch_of_one_and_ignores_unknown_fields() -> None:
    res = dec({**OK, "unknown_extra": [1, 2]})
    assert isinstance(res, SampleBatch)
    assert (res.node, res.gpu, list(res.ts_ns), list(res.value), res.clock) == ("node-07", "GPU-1f2e", [NOW], [312.5], "utc")
    assert res.labels == {"gpu_model": "H200", "region": "us-east", "rank": 3, "pid": 4711}


def test_batch_form_and_default_clock() -> None:
    obj = {"v": 1, "node": "n", "gpu": "0", "ts_ns": [NOW, NOW + 1], "value": [1, 2.5]}
    res = dec(obj)
    assert isinstance(res, SampleBatch) and len(res) == 2 and res.clock == "utc"
    assert [s.value for s in res.samples()] == [1, 2.5]


def test_encoders_round_trip() -> None:
    s = Sample("power", "n", "0", NOW, 300.0, "utc", {"region": "eu"})
    b = dec(encode_sample(s))
    assert isinstance(b, SampleBatch) and b.samples() == [s]
    batch = SampleBatch("power", "n", "host", [NOW, NOW + 5], [1.0, 2.0], "nvml:n")
    back = dec(encode_batch(batch))
    assert isinstance(back, SampleBatch) and back.samples() == batch.samples()
    beacon = ClockBeacon("n", "nvml:n", 5, NOW, NOW + 80_000)
    assert decode_beacon(encode_beacon(beacon)) == beacon
    ev = K8sEvent("n", NOW, "Warning", "OOMKilled", "Pod", "ml", "p-0", "llm", ("GPU-1",), "boom")
    assert decode_k8s_event(encode_k8s_event(ev)) == ev


@pytest.mark.parametrize(("raw", "want"), [
    (b"{not json", RejectReason.MALFORMED_JSON),
    (b"[1, 2]", RejectReason.MALFORMED_JSON),
    (b"", RejectReason.MALFORMED_JSON),
    ({**OK, "v": 2}, RejectReason.UNKNOWN_VERSION),
    ({**OK, "v": "1"}, RejectReason.UNKNOWN_VERSION),
    ({k: v for k, v in OK.items() if k != "v"}, RejectReason.MISSING_FIELD),
    ({k: v for k, v in OK.items() if k != "node"}, RejectReason.MISSING_FIELD),
    ({k: v for k, v in OK.items() if k != "value"}, RejectReason.MISSING_FIELD),
    ({k: v for k, v in OK.items() if k != "ts_ns"}, RejectReason.MISSING_FIELD),
    ({**OK, "value": "312"}, RejectReason.WRONG_TYPE),
    ({**OK, "value": True}, RejectReason.WRONG_TYPE),
    ({**OK, "ts_ns": 1.5e18}, RejectReason.WRONG_TYPE),
    ({**OK, "node": 7}, RejectReason.WRONG_TYPE),
    ({**OK, "labels": {"rank": "three"}}, RejectReason.WRONG_TYPE),
    ({**OK, "ts_ns": [NOW], "value": 1.0}, RejectReason.WRONG_TYPE),
    (b'{"v": 1, "node": "n", "gpu": "0", "ts_ns": 1, "value": NaN}', RejectReason.NOT_FINITE),
    (b'{"v": 1, "node": "n", "gpu": "0", "ts_ns": 1, "value": Infinity}', RejectReason.NOT_FINITE),
    (b'{"v": 1, "node": "n", "gpu": "0", "ts_ns": 1, "value": 1e999}', RejectReason.NOT_FINITE),
    ({**OK, "value": -1.0}, RejectReason.OUT_OF_RANGE),
    ({**OK, "value": 5001}, RejectReason.OUT_OF_RANGE),
    ({**OK, "ts_ns": [NOW, NOW + 1], "value": [1.0]}, RejectReason.LENGTH_MISMATCH),
    ({**OK, "ts_ns": [], "value": []}, RejectReason.LENGTH_MISMATCH),
    ({**OK, "sensor": "voltage"}, RejectReason.UNKNOWN_SENSOR),
])
def test_each_reject_reason(raw: object, want: RejectReason) -> None:
    assert reason(raw) == want


def test_unknown_sensor_topic_and_range_of_another_sensor() -> None:
    assert reason(OK, sensor="voltage") == RejectReason.UNKNOWN_SENSOR
    assert reason({**OK, "value": 1.5}, sensor="sm_active") == RejectReason.OUT_OF_RANGE
    assert isinstance(dec({**OK, "value": 0.5}, sensor="sm_active"), SampleBatch)


def test_too_old_and_too_new_apply_to_utc_only() -> None:
    limits = TimeLimits(now_ns=NOW, max_age_ns=10**9, max_future_ns=10**9)
    assert reason({**OK, "ts_ns": NOW - 2 * 10**9}, limits=limits) == RejectReason.TOO_OLD
    assert reason({**OK, "ts_ns": NOW + 2 * 10**9}, limits=limits) == RejectReason.TOO_NEW
    assert isinstance(dec({**OK, "ts_ns": NOW + 10**8}, limits=limits), SampleBatch)
    # A domain clock's raw time means nothing before correction.
    assert isinstance(dec({**OK, "clock": "nvml:n", "ts_ns": 5}, limits=limits), SampleBatch)


def test_beacon_and_event_rejects() -> None:
    b = {"v": 1, "node": "n", "clock": "nvml:n", "domain_ns": 1, "utc_before_ns": 10, "utc_after_ns": 5}
    res = decode_beacon(orjson.dumps(b))
    assert isinstance(res, Reject) and res.reason == RejectReason.OUT_OF_RANGE
    res = decode_beacon(orjson.dumps({**b, "domain_ns": "x"}))
    assert isinstance(res, Reject) and res.reason == RejectReason.WRONG_TYPE
    ev = decode_k8s_event(orjson.dumps({"v": 1, "node": "n", "ts_ns": NOW, "type": "Normal"}))
    assert isinstance(ev, Reject) and ev.reason == RejectReason.MISSING_FIELD
    ev = decode_k8s_event(orjson.dumps({"v": 1, "node": "n", "ts_ns": NOW, "type": "N", "reason": "R",
                                        "gpus": [1]}))
    assert isinstance(ev, Reject) and ev.reason == RejectReason.WRONG_TYPE
