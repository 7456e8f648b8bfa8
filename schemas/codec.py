"""orjson codec of the wire contract, with a msgspec fast path for sample messages.

Decoding never raises: it returns the record or a ``Reject`` with a stable reason,
so an agent can dead-letter bad input and keep going. A sample message is decoded
first by msgspec into a typed struct (the type checks in C); whatever that path does
not accept at once goes through the checked orjson path, which names the reason, so
the reasons and details are the same whichever path a message took.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import orjson

from schemas.catalog import BY_NAME, INT_LABELS, LABEL_COLUMNS
from schemas.records import (
    UTC_CLOCK,
    WIRE_VERSION,
    ClockBeacon,
    K8sEvent,
    Labels,
    Reject,
    RejectReason,
    Sample,
    SampleBatch,
)

R = RejectReason
_NUMBER: Final = frozenset({int, float})
_BOOLS: Final = frozenset({bool})
_DAY_NS: Final = 86_400 * 10**9


@dataclass(frozen=True, slots=True)
class TimeLimits:
    """Plausible UTC event times around ``now_ns``; outside them a sample is rejected.

    >>> TimeLimits(now_ns=10**18).max_future_ns // 10**9
    300
    """

    now_ns: int
    max_age_ns: int = 7 * _DAY_NS
    max_future_ns: int = 300 * 10**9


class _Refused(Exception):
    """Raised inside this module only; each public decoder turns it into a ``Reject``."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(detail)
        self.reject = Reject(reason, detail)


def _loads(raw: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        msg = str(exc)
        # orjson refuses NaN/Infinity literals and overflowing numbers; they are a
        # numeric problem for the producer, not a syntax one, so say so.
        if "infinity" in msg or b"NaN" in raw or b"Infinity" in raw:
            raise _Refused(R.NOT_FINITE, msg) from None
        raise _Refused(R.MALFORMED_JSON, msg) from None
    if type(obj) is not dict:
        raise _Refused(R.MALFORMED_JSON, f"expected a JSON object, got {type(obj).__name__}")
    v = obj.get("v")
    if v is None:
        raise _Refused(R.MISSING_FIELD, "v")
    if v != WIRE_VERSION or type(v) is not int:
        raise _Refused(R.UNKNOWN_VERSION, f"v={v!r}, this pipeline reads v={WIRE_VERSION}")
    return obj


def _str(obj: dict[str, Any], key: str, default: str | None = None) -> str:
    val = obj.get(key, default)
    if val is None:
        raise _Refused(R.MISSING_FIELD, key)
    if type(val) is not str or not val:
        raise _Refused(R.WRONG_TYPE, f"{key} must be a non-empty string")
    return val


def _int(obj: dict[str, Any], key: str) -> int:
    val = obj.get(key)
    if val is None:
        raise _Refused(R.MISSING_FIELD, key)
    if type(val) is not int:
        raise _Refused(R.WRONG_TYPE, f"{key} must be an integer")
    return val


# Validated labels by their raw JSON (the fast path's key): producers repeat a series' labels on every
# message, and a lookup is cheaper than re-validating. Cleared when it grows large. The checked path,
# which only messages the fast one refused take, validates afresh.
_LABELS_BY_RAW: dict[bytes, Labels | None] = {}
_LABEL_CACHE_MAX: Final = 65_536


def _labels(obj: dict[str, Any]) -> Labels | None:
    return _valid_labels(obj.get("labels"))


def _valid_labels(raw: Any) -> Labels | None:
    if raw is None:
        return None
    if type(raw) is not dict:
        raise _Refused(R.WRONG_TYPE, "labels must be an object")
    out: Labels = {}
    for key, val in raw.items():
        if key not in LABEL_COLUMNS:
            continue  # unknown labels are ignored like unknown fields
        want = int if key in INT_LABELS else str
        if type(val) is not want:
            raise _Refused(R.WRONG_TYPE, f"labels.{key} must be {want.__name__}")
        out[key] = val
    return out


def _labels_of_raw(raw: bytes) -> Labels | None:
    """The labels of a message by their raw JSON (``null`` when absent), validated once per distinct text."""
    try:
        return _LABELS_BY_RAW[raw]
    except KeyError:
        pass
    labels = _valid_labels(orjson.loads(raw))
    if len(_LABELS_BY_RAW) >= _LABEL_CACHE_MAX:
        _LABELS_BY_RAW.clear()
    _LABELS_BY_RAW[raw] = labels
    return labels


def _check_times(lo: int, hi: int, clock: str, limits: TimeLimits | None) -> None:
    if limits is None or clock != UTC_CLOCK:
        return
    if lo < limits.now_ns - limits.max_age_ns:
        raise _Refused(R.TOO_OLD, f"ts_ns={lo} is older than the accepted age")
    if hi > limits.now_ns + limits.max_future_ns:
        raise _Refused(R.TOO_NEW, f"ts_ns={hi} is further in the future than accepted")


class _Wire(msgspec.Struct):
    """A sample message as msgspec checks it: the happy path only (see ``_fast``)."""

    v: int
    node: str
    gpu: str
    ts_ns: list[int] | int
    value: list[float] | float
    clock: str = UTC_CLOCK
    # Kept as the raw JSON: producers repeat a series' labels on every message, so their bytes find the
    # labels validated before without building a dict.
    labels: msgspec.Raw = msgspec.Raw(b"null")
    sensor: str | None = None


_WIRE: Final = msgspec.json.Decoder(_Wire)


def decode_samples(raw: bytes, sensor: str, limits: TimeLimits | None = None, fast: bool = True
                   ) -> SampleBatch | Reject:
    """Decode one ``sensors.<sensor>`` message, single or batch form, into a batch; ``fast=False`` skips the msgspec
    path (for a message it has refused already: the checked path names the reason)."""
    try:
        got = _fast(raw, sensor, limits) if fast else None  # not `or`: a batch's truth is its __len__
        return got if got is not None else _samples(raw, sensor, limits)
    except _Refused as refused:
        return refused.reject


def _fast(raw: bytes, sensor: str, limits: TimeLimits | None) -> SampleBatch | None:
    """The batch of a message every check accepts, or None: then ``_samples`` decides, and says why.

    msgspec refuses what the checked path refuses (bad JSON, NaN, booleans and floats where
    integers go, numbers beyond a double) and takes duplicate keys as orjson does (the last).
    """
    spec = BY_NAME.get(sensor)
    if spec is None:
        return None
    try:
        w = _WIRE.decode(raw)
    except msgspec.DecodeError:
        return None
    if w.v != WIRE_VERSION or not w.node or not w.gpu or not w.clock \
            or (w.sensor is not None and w.sensor != sensor):
        return None
    values, stamps = w.value, w.ts_ns
    if type(values) is list:
        if type(stamps) is not list or len(stamps) != len(values) or not values:
            return None
    elif type(stamps) is list:
        return None
    else:
        values, stamps = [values], [stamps]  # type: ignore[list-item]
    try:
        packed_ts = array("q", stamps)
    except OverflowError:
        return None
    lo, hi = min(stamps), max(stamps)
    # No NaN can come through JSON, so min and max bound every value.
    if min(values) < spec.lo or max(values) > spec.hi:
        return None
    try:
        _check_times(lo, hi, w.clock, limits)
        labels = _labels_of_raw(bytes(w.labels))
    except _Refused:
        return None
    return SampleBatch(sensor, w.node, w.gpu, packed_ts, array("d", values), w.clock,
                       labels, lo, hi)


def _samples(raw: bytes, sensor: str, limits: TimeLimits | None) -> SampleBatch:
    spec = BY_NAME.get(sensor)
    if spec is None:
        raise _Refused(R.UNKNOWN_SENSOR, f"no sensor named {sensor!r} in the catalog")
    obj = _loads(raw)
    named = obj.get("sensor")
    if named is not None and named != sensor:
        raise _Refused(R.UNKNOWN_SENSOR, f"message names sensor {named!r} on the topic of {sensor!r}")
    node = _str(obj, "node")
    gpu = _str(obj, "gpu")
    clock = _str(obj, "clock", UTC_CLOCK)
    ts = obj.get("ts_ns")
    if ts is None:
        raise _Refused(R.MISSING_FIELD, "ts_ns")
    value = obj.get("value")
    if value is None:
        raise _Refused(R.MISSING_FIELD, "value")
    if type(ts) is list:
        if type(value) is not list:
            raise _Refused(R.WRONG_TYPE, "value must be an array when ts_ns is one")
        if len(ts) != len(value):
            raise _Refused(R.LENGTH_MISMATCH, f"{len(ts)} timestamps, {len(value)} values")
        if not ts:
            raise _Refused(R.LENGTH_MISMATCH, "empty batch")
        values: list[Any] = value
        stamps: list[Any] = ts
    elif type(value) is list:
        raise _Refused(R.WRONG_TYPE, "ts_ns must be an array when value is one")
    else:
        values, stamps = [value], [ts]
    # Packing into machine arrays is the type check (C speed, and the aligner takes the
    # buffers as they are): 'd' refuses strings and nulls, 'q' refuses floats and overflow.
    try:
        packed_values = array("d", values)
        packed_ts = array("q", stamps)
    except (TypeError, OverflowError):
        raise _Refused(R.WRONG_TYPE, _type_problem(values, stamps)) from None
    # Booleans are ints to Python; only a message that spells true/false can hold one.
    if (b"true" in raw or b"false" in raw) and (not _BOOLS.isdisjoint(map(type, values))
                                                or not _BOOLS.isdisjoint(map(type, stamps))):
        raise _Refused(R.WRONG_TYPE, _type_problem(values, stamps))
    if min(values) < spec.lo or max(values) > spec.hi:
        bad = next(x for x in values if not spec.lo <= x <= spec.hi)
        raise _Refused(R.OUT_OF_RANGE, f"{sensor}={bad} outside [{spec.lo:g}, {spec.hi:g}] {spec.unit}")
    lo, hi = min(stamps), max(stamps)
    _check_times(lo, hi, clock, limits)
    return SampleBatch(sensor, node, gpu, packed_ts, packed_values, clock, _labels(obj), lo, hi)


def _type_problem(values: list[Any], stamps: list[Any]) -> str:
    for x in values:
        if type(x) not in _NUMBER:
            return f"value must be a number, got {type(x).__name__}"
    for t in stamps:
        if type(t) is not int:
            return f"ts_ns must hold integers (nanoseconds), got {type(t).__name__}"
        if not -(2**63) <= t < 2**63:
            return "ts_ns must fit in a signed 64-bit integer"
    return "value must be a finite 64-bit number"


def decode_beacon(raw: bytes) -> ClockBeacon | Reject:
    """Decode one ``clock.sync`` message."""
    try:
        obj = _loads(raw)
        beacon = ClockBeacon(_str(obj, "node"), _str(obj, "clock"), _int(obj, "domain_ns"),
                             _int(obj, "utc_before_ns"), _int(obj, "utc_after_ns"))
    except _Refused as refused:
        return refused.reject
    if beacon.utc_after_ns < beacon.utc_before_ns:
        return Reject(R.OUT_OF_RANGE, "utc_after_ns is before utc_before_ns")
    return beacon


def decode_k8s_event(raw: bytes) -> K8sEvent | Reject:
    """Decode one ``k8s.events`` message."""
    try:
        obj = _loads(raw)
        node, ts, typ, reason = _str(obj, "node"), _int(obj, "ts_ns"), _str(obj, "type"), _str(obj, "reason")
        opt: dict[str, str] = {}
        for key in ("kind", "namespace", "pod", "workload", "message"):
            val = obj.get(key, "")
            if type(val) is not str:
                raise _Refused(R.WRONG_TYPE, f"{key} must be a string")
            opt[key] = val
        gpus = obj.get("gpus", [])
        if type(gpus) is not list or any(type(g) is not str for g in gpus):
            raise _Refused(R.WRONG_TYPE, "gpus must be an array of strings")
    except _Refused as refused:
        return refused.reject
    return K8sEvent(node, ts, typ, reason, opt["kind"], opt["namespace"], opt["pod"], opt["workload"],
                    tuple(gpus), opt["message"])


def encode_sample(s: Sample) -> bytes:
    obj: dict[str, Any] = {"v": WIRE_VERSION, "node": s.node, "gpu": s.gpu, "ts_ns": s.ts_ns,
                           "clock": s.clock, "value": s.value}
    if s.labels:
        obj["labels"] = s.labels
    return orjson.dumps(obj)


def encode_batch(b: SampleBatch) -> bytes:
    obj: dict[str, Any] = {"v": WIRE_VERSION, "node": b.node, "gpu": b.gpu, "clock": b.clock,
                           "ts_ns": list(b.ts_ns), "value": list(b.value)}
    if b.labels:
        obj["labels"] = b.labels
    return orjson.dumps(obj)


def encode_beacon(b: ClockBeacon) -> bytes:
    return orjson.dumps({"v": WIRE_VERSION, "node": b.node, "clock": b.clock, "domain_ns": b.domain_ns,
                         "utc_before_ns": b.utc_before_ns, "utc_after_ns": b.utc_after_ns})


def encode_k8s_event(e: K8sEvent) -> bytes:
    return orjson.dumps({"v": WIRE_VERSION, "node": e.node, "ts_ns": e.ts_ns, "type": e.type,
                         "reason": e.reason, "kind": e.kind, "namespace": e.namespace, "pod": e.pod,
                         "workload": e.workload, "gpus": list(e.gpus), "message": e.message})
