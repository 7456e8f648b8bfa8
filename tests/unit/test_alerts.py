"""The alert contract: codec round trip, the shipped JSON Schema, stable ids."""

from __future__ import annotations

import dataclasses
import doctest
from typing import Any

import jsonschema
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

import schemas.alerts
from schemas.alerts import (
    ALERT_SCHEMA_PATH,
    SEVERITIES,
    STATES,
    Alert,
    AlertDecodeError,
    Cause,
    alert_id,
    alert_key,
    alert_schema,
    decode_alert,
    encode_alert,
    make_alert,
)

VALIDATOR = jsonschema.Draft202012Validator(alert_schema())
MAX_NS = 2**63 - 1

names = st.text(min_size=1, max_size=20)
finite = st.floats(allow_nan=False, allow_infinity=False)
evidence_values = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), finite, st.text(max_size=10))


@st.composite
def alerts(draw: st.DrawFn) -> Alert:
    rule = draw(st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True))
    node, gpu = draw(names), draw(names)
    onset = draw(st.integers(0, MAX_NS))
    return Alert(id=alert_id(rule, node, gpu, onset), rule=rule, severity=draw(st.sampled_from(SEVERITIES)),
                 state=draw(st.sampled_from(STATES)), node=node, gpu=gpu,
                 workload=draw(st.none() | names), namespace=draw(st.none() | names),
                 value=draw(finite), threshold=draw(finite), baseline=draw(st.none() | finite),
                 onset_ts_ns=onset, ts_ns=draw(st.integers(onset, MAX_NS)),
                 evidence=draw(st.dictionaries(names, evidence_values, max_size=5)))


def example() -> Alert:
    return make_alert("efficiency_drift", "warning", "node-07", "GPU-1f2e0b8a", value=0.71, threshold=0.88,
                      baseline=1.0, onset_ts_ns=1_796_200_344_000_000_000, ts_ns=1_796_200_347_000_000_000,
                      workload="llm-pretrain", namespace="ml", evidence={"drop_pct": 29.0, "below_s": 3})


def test_doctests_pass() -> None:
    result = doctest.testmod(schemas.alerts, report=True)
    assert result.attempted >= 5 and result.failed == 0


@given(alerts())
def test_encode_decode_round_trip(a: Alert) -> None:
    raw = encode_alert(a)
    back = decode_alert(raw)
    assert back == a
    assert encode_alert(back) == raw
    assert back.message_id == f"{a.id}:{a.state}"


@given(alerts())
def test_every_encoded_alert_validates_against_the_schema(a: Alert) -> None:
    VALIDATOR.validate(orjson.loads(encode_alert(a)))


def test_encoding_is_compact_with_sorted_keys() -> None:
    raw = encode_alert(example())
    doc = orjson.loads(raw)
    assert list(doc) == sorted(doc)
    assert b" " not in raw.replace(b"llm-pretrain", b"")
    assert alert_key(example()) == example().id.encode()


def test_the_schema_is_valid_documented_and_matches_the_dataclass() -> None:
    schema = alert_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert ALERT_SCHEMA_PATH.is_file()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] is False
    fields = [f.name for f in dataclasses.fields(Alert)]
    assert set(schema["required"]) == set(schema["properties"]) == set(fields)
    assert all(p.get("description") for p in schema["properties"].values())
    assert schema["properties"]["severity"]["enum"] == list(SEVERITIES)
    assert schema["properties"]["state"]["enum"] == list(STATES)
    assert {schema["properties"][n]["type"] for n in ("onset_ts_ns", "ts_ns")} == {"integer"}


def test_the_schema_examples_are_valid_messages_with_their_ids() -> None:
    for doc in alert_schema()["examples"]:
        VALIDATOR.validate(doc)
        a = decode_alert(orjson.dumps(doc))
        assert a.id == alert_id(a.rule, a.node, a.gpu, a.onset_ts_ns)


def good() -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(encode_alert(example()))
    return out


def _with(**changes: Any) -> dict[str, Any]:
    return good() | changes


def _without(name: str) -> dict[str, Any]:
    doc = good()
    del doc[name]
    return doc


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("version 3", _with(v=3), "unknown_version"),
    ("version 2 without causes", _without("causes"), "missing_field"),
    ("version 1 with causes", _with(v=1), "unknown_field"),
    ("causes an object", _with(causes={"cause": "x"}), "wrong_type"),
    ("cause without confidence", _with(causes=[{"cause": "x", "evidence": {}}]), "missing_field"),
    ("cause with an extra key", _with(causes=[{"cause": "x", "confidence": 0.5, "evidence": {}, "why": 1}]),
     "unknown_field"),
    ("confidence above 1", _with(causes=[{"cause": "x", "confidence": 1.5, "evidence": {}}]), "out_of_range"),
    ("cause empty", _with(causes=[{"cause": "", "confidence": 0.5, "evidence": {}}]), "out_of_range"),
    ("cause evidence nested", _with(causes=[{"cause": "x", "confidence": 0.5, "evidence": {"a": [1]}}]),
     "wrong_type"),
    ("version as text", _with(v="1"), "unknown_version"),
    ("version true", _with(v=True), "unknown_version"),
    ("no version", _without("v"), "missing_field"),
    ("no id", _without("id"), "missing_field"),
    ("no evidence", _without("evidence"), "missing_field"),
    ("no baseline (null must be explicit)", _without("baseline"), "missing_field"),
    ("extra field", _with(color="red"), "unknown_field"),
    ("id not hex", _with(id="X" * 32), "out_of_range"),
    ("id too short", _with(id="ab12"), "out_of_range"),
    ("rule with capitals", _with(rule="UtilSpike"), "out_of_range"),
    ("severity unknown", _with(severity="page"), "out_of_range"),
    ("state unknown", _with(state="pending"), "out_of_range"),
    ("node empty", _with(node=""), "out_of_range"),
    ("gpu a number", _with(gpu=3), "wrong_type"),
    ("workload empty", _with(workload=""), "out_of_range"),
    ("value a string", _with(value="99"), "wrong_type"),
    ("value a boolean", _with(value=True), "wrong_type"),
    ("threshold null", _with(threshold=None), "wrong_type"),
    ("baseline a string", _with(baseline="1"), "wrong_type"),
    ("ts with a fraction", _with(ts_ns=1.5), "wrong_type"),
    ("ts a string", _with(ts_ns="1796200347000000000"), "wrong_type"),
    ("onset negative", _with(onset_ts_ns=-1), "out_of_range"),
    ("ts beyond int64", _with(ts_ns=2**63), "out_of_range"),
    ("evidence a list", _with(evidence=[1, 2]), "wrong_type"),
    ("evidence nested", _with(evidence={"window": {"s": 3}}), "wrong_type"),
    ("evidence empty key", _with(evidence={"": 1}), "wrong_type"),
]


@pytest.mark.parametrize(("doc", "reason"), [pytest.param(d, r, id=name) for name, d, r in BAD])
def test_bad_messages_are_refused_by_schema_and_decoder_alike(doc: dict[str, Any], reason: str) -> None:
    assert not VALIDATOR.is_valid(doc)
    with pytest.raises(AlertDecodeError) as err:
        decode_alert(orjson.dumps(doc))
    assert err.value.reason == reason
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize(("raw", "reason"), [
    (b"{not json", "malformed_json"),
    (b'{"value": NaN}', "malformed_json"),
    (b"[1, 2]", "not_an_object"),
    (b"", "malformed_json"),
])
def test_unparsable_messages_raise_value_error(raw: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        decode_alert(raw)


def test_resolution_before_onset_is_refused_where_the_schema_cannot_say_it() -> None:
    doc = _with(state="resolved", ts_ns=good()["onset_ts_ns"] - 1)
    assert VALIDATOR.is_valid(doc)
    with pytest.raises(AlertDecodeError, match="before onset"):
        decode_alert(orjson.dumps(doc))


def test_times_must_be_integer_literals_not_exponent_floats() -> None:
    # JSON Schema counts 1.5e18 as an integer; a float cannot hold every nanosecond, so the decoder refuses it.
    doc = _with(ts_ns=1.5e18)
    assert VALIDATOR.is_valid(doc)
    with pytest.raises(AlertDecodeError, match="ts_ns must be an integer"):
        decode_alert(orjson.dumps(doc))


def test_non_finite_numbers_cannot_be_built_or_encoded() -> None:
    with pytest.raises(ValueError, match="finite"):
        dataclasses.replace(example(), value=float("nan"))
    with pytest.raises(ValueError, match="finite"):
        dataclasses.replace(example(), evidence={"x": float("inf")})


def test_ids_are_deterministic_and_resolution_keeps_them() -> None:
    a = example()
    assert a.id == alert_id("efficiency_drift", "node-07", "GPU-1f2e0b8a", 1_796_200_344_000_000_000)
    assert make_alert("efficiency_drift", "critical", "node-07", "GPU-1f2e0b8a", value=0.5, threshold=0.88,
                      onset_ts_ns=a.onset_ts_ns, ts_ns=a.ts_ns + 10).id == a.id  # a replay, other details
    r = a.resolved(a.ts_ns + 5, value=0.95)
    assert (r.id, r.state, r.ts_ns, r.value) == (a.id, "resolved", a.ts_ns + 5, 0.95)
    assert r.message_id != a.message_id


@given(st.tuples(names, names, names, st.integers(0, MAX_NS)), st.tuples(names, names, names, st.integers(0, MAX_NS)))
def test_ids_differ_whenever_rule_entity_or_onset_differ(x: tuple[str, str, str, int],
                                                         y: tuple[str, str, str, int]) -> None:
    assert (alert_id(*x) == alert_id(*y)) == (x == y)


def test_ids_do_not_collide_across_field_boundaries() -> None:
    assert alert_id("a", "b|c", "d", 1) != alert_id("a|b", "c", "d", 1)
    assert alert_id("a", "b", "1", 2) != alert_id("a", "b", "12", 0)
    ids = {alert_id(rule, node, gpu, onset) for rule in ("util_spike", "sm_spike") for node in ("n1", "n2")
           for gpu in ("0", "1") for onset in (0, 1, 10**18)}
    assert len(ids) == 24


def test_a_version_1_message_still_decodes_without_causes() -> None:
    doc = good()
    del doc["causes"]
    doc["v"] = 1
    a = decode_alert(orjson.dumps(doc))
    assert a.causes == () and a.v == 2 and a.message_id == f"{a.id}:firing"


def test_causes_make_a_second_message_of_the_same_episode() -> None:
    a = example()
    b = a.attributed((Cause("disk_write", 0.9, {"lag_s": 2.0}), Cause("OOMKilled", 0.4, {"source": "k8s"})))
    assert b.id == a.id and b.message_id == f"{a.id}:firing:causes" != a.message_id
    raw = encode_alert(b)
    VALIDATOR.validate(orjson.loads(raw))
    assert decode_alert(raw) == b and [c.cause for c in decode_alert(raw).causes] == ["disk_write", "OOMKilled"]
