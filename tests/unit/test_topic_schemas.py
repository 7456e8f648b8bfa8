"""The JSON Schemas of every topic: shipped files equal the generator, real messages validate, bad ones fail."""

from __future__ import annotations

import dataclasses
import doctest
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from click.testing import CliRunner

import schemas.topic_schemas
from agents.cli.schema import export_command, schema_command
from agents.collect.simulator import batch_messages
from agents.kafka.topics import Topics
from agents.settings import Settings
from schemas.catalog import BY_NAME, CATALOG
from schemas.codec import decode_samples, encode_beacon, encode_k8s_event
from schemas.records import ClockBeacon, K8sEvent, SampleBatch
from schemas.topic_schemas import SHIPPED, TOPIC_NAMES, UnknownTopicError, schema_for, shipped_file
from schemas.workload_samples import (
    DriftDetail,
    WorkloadSample,
    WorkloadSampleDecodeError,
    decode_workload_sample,
    encode_workload_sample,
)
from streams.sim.simulate import ClusterSimulator, SimParams

JSON_DIR = Path(schemas.topic_schemas.__file__).parent / "json"
T0 = 1_796_200_000 * 10**9


def validator(topic: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema_for(topic))


def test_doctests_pass() -> None:
    assert doctest.testmod(schemas.topic_schemas).failed == 0


def test_every_topic_of_agents_topics_has_a_valid_schema() -> None:
    assert sorted(Topics().all) == sorted(TOPIC_NAMES)
    for topic in Topics().all:
        schema = schema_for(topic)
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["description"], topic
    with pytest.raises(UnknownTopicError, match=r"no topic named 'sensors\.fan'"):
        schema_for("sensors.fan")


def test_the_shipped_files_are_what_the_generator_makes() -> None:
    for topic in SHIPPED:
        path = JSON_DIR / shipped_file(topic)
        hint = "regenerate with `flopwatch schema export schemas/json`"
        assert path.exists(), f"{path} missing: {hint}"
        assert orjson.loads(path.read_bytes()) == schema_for(topic), f"{path} differs from schema_for({topic!r}): {hint}"
    # frames, alerts and triggers come from their own shipped files
    for topic, name in (("flopwatch.frames", "frame.v1"), ("flopwatch.alerts", "alert.v2"),
                        ("flopwatch.triggers", "trigger.v1")):
        assert orjson.loads((JSON_DIR / f"{name}.json").read_bytes()) == schema_for(topic)


def simulated_batches() -> list[SampleBatch]:
    sim = ClusterSimulator(SimParams(nodes=2, gpus=2, seed=3, start_ns=T0))
    return sim.advance(T0 + 12 * 10**9)  # the framework and inference streams start a few seconds in


def test_simulator_messages_of_every_sensor_validate_single_and_batch_form() -> None:
    batches = simulated_batches()
    assert {b.sensor for b in batches} == set(BY_NAME)
    for b in batches:
        v = validator(BY_NAME[b.sensor].topic)
        for size in (1, 7):
            for raw in batch_messages(b, size):
                v.validate(orjson.loads(raw))
                assert not hasattr(decode_samples(raw, b.sensor), "reason")  # and the pipeline takes them


def good_sample() -> dict[str, Any]:
    return {"v": 1, "node": "node-07", "gpu": "0", "ts_ns": T0, "clock": "utc", "value": 312.5,
            "labels": {"gpu_model": "H200", "rank": 3, "custom": "ignored"}, "extra": "ignored"}


@pytest.mark.parametrize(("change", "why"), [
    ({"value": 5000.5}, "out of range"),
    ({"value": -1}, "out of range"),
    ({"value": "312.5"}, "wrong type"),
    ({"value": True}, "a boolean is no number"),
    ({"ts_ns": 1.5}, "float time"),
    ({"ts_ns": 2**63}, "overflows int64"),
    ({"node": ""}, "empty node"),
    ({"v": 2}, "unknown version"),
    ({"labels": {"rank": "3"}}, "rank must be an integer"),
    ({"ts_ns": [T0, T0 + 1], "value": 300.0}, "mixed forms"),
    ({"ts_ns": [], "value": []}, "empty batch"),
    ({"ts_ns": [T0], "value": [6000.0]}, "out of range in a batch"),
])
def test_bad_sensor_messages_fail(change: dict[str, Any], why: str) -> None:
    v = validator("sensors.power")
    v.validate(good_sample())
    doc = good_sample() | change
    assert not v.is_valid(doc), why
    assert hasattr(decode_samples(orjson.dumps(doc), "power"), "reason"), why  # the pipeline refuses it too


@pytest.mark.parametrize("missing", ["v", "node", "gpu", "ts_ns", "value"])
def test_a_sample_without_a_required_field_fails(missing: str) -> None:
    doc = good_sample()
    del doc[missing]
    assert not validator("sensors.power").is_valid(doc)


def test_each_sensor_topic_carries_its_own_range() -> None:
    for s in CATALOG:
        v = validator(s.topic)
        base = {"v": 1, "node": "n", "gpu": "host" if s.scope == "host" else "0", "ts_ns": T0}
        assert v.is_valid(base | {"value": s.hi}) and v.is_valid(base | {"value": s.lo})
        assert not v.is_valid(base | {"value": s.hi * 1.5 + 1})
        assert v.is_valid(base | {"sensor": s.name, "value": s.lo})
        assert not v.is_valid(base | {"sensor": "other", "value": s.lo})


def test_k8s_events_and_beacons_validate_and_bad_ones_fail() -> None:
    ev = orjson.loads(encode_k8s_event(K8sEvent("node-07", T0, "Warning", "OOMKilled", "Pod", "ml", "trainer-0",
                                                "llm", ("GPU-1",), "out of memory")))
    v = validator("k8s.events")
    v.validate(ev)
    v.validate({"v": 1, "node": "n", "ts_ns": T0, "type": "Normal", "reason": "Started"})  # the optional ones absent
    for bad in ({"gpus": "GPU-1"}, {"ts_ns": "now"}, {"reason": ""}, {"pod": 7}):
        assert not v.is_valid(ev | bad), bad
    beacon = orjson.loads(encode_beacon(ClockBeacon("node-07", "nvml:node-07", 5_123_456_789, T0, T0 + 80_000)))
    vb = validator("clock.sync")
    vb.validate(beacon)
    assert not vb.is_valid({k: v for k, v in beacon.items() if k != "domain_ns"})
    assert not vb.is_valid(beacon | {"utc_before_ns": 1.5})


def test_workload_summaries_validate_and_bad_ones_fail() -> None:
    s = WorkloadSample("serving", "chat", "inference", "node-1", T0, 10**9, 4, ("chat-0",), 0.5, None, None,
                       80.0, 900.0, False, ("0",))
    doc = orjson.loads(encode_workload_sample(s))
    v = validator("flopwatch.workloads")
    v.validate(doc)
    for bad in ({"spike": 1}, {"qps": -1.0}, {"pods": "chat-0"}, {"unknown": 1}):
        assert not v.is_valid(doc | bad), bad
    assert not v.is_valid({k: x for k, x in doc.items() if k != "present"})


def test_workload_summaries_carry_power_and_drift_figures_and_older_ones_still_decode() -> None:
    s = WorkloadSample("serving", "chat", "inference", "node-1", T0, 10**9, 4, ("chat-0",), 0.5, None, None,
                       80.0, 900.0, False, ("0", "2"), power_w=412.5,
                       drift_detail=(DriftDetail("0", 7.5e11, 1e12, 410.0, 400.0, 420.0), DriftDetail("2", 8e11, 1e12, None)))
    raw = encode_workload_sample(s)
    doc = orjson.loads(raw)
    v = validator("flopwatch.workloads")
    v.validate(doc)
    assert decode_workload_sample(raw) == s
    no_band = doc | {"drift_detail": [{k: d[k] for k in ("gpu", "value", "baseline", "load_w")}
                                      for d in doc["drift_detail"]]}
    v.validate(no_band)
    assert decode_workload_sample(orjson.dumps(no_band)).drift_detail[0] == DriftDetail("0", 7.5e11, 1e12, 410.0)
    older = {k: x for k, x in doc.items() if k not in ("power_w", "drift_detail")}  # written before they existed
    v.validate(older)
    assert decode_workload_sample(orjson.dumps(older)) == dataclasses.replace(s, power_w=None, drift_detail=())
    for bad in ({"power_w": -1.0}, {"drift_detail": [{"gpu": "0"}]}, {"drift_detail": "0"},
                {"drift_detail": [{"gpu": "0", "value": 1.0, "baseline": 1.0, "load_w": None, "x": 1}]}):
        assert not v.is_valid(doc | bad), bad
        with pytest.raises(WorkloadSampleDecodeError):
            decode_workload_sample(orjson.dumps(doc | bad))


def test_the_dlq_schema_accepts_raw_bytes_and_documents_the_headers() -> None:
    s = schema_for("flopwatch.dlq")
    assert jsonschema.Draft202012Validator(s).is_valid("not json at all")
    assert "flopwatch.reason" in s["description"]


def test_the_schema_command_prints_a_topic_with_or_without_the_prefix() -> None:
    runner = CliRunner()
    out = runner.invoke(schema_command, ["sensors.gpu_util"], obj=Settings())
    assert out.exit_code == 0, out.output
    assert orjson.loads(out.output) == schema_for("sensors.gpu_util")
    out = runner.invoke(schema_command, ["staging.k8s.events"], obj=Settings(topic_prefix="staging."))
    assert out.exit_code == 0 and orjson.loads(out.output)["$id"] == "urn:flopwatch:schema:k8s.events:v1"
    out = runner.invoke(schema_command, ["nope"], obj=Settings())
    assert out.exit_code == 2 and "no topic named 'nope'" in out.output


def test_export_writes_what_is_shipped_and_leaves_equal_files_alone(tmp_path: Path) -> None:
    out = CliRunner().invoke(export_command, [str(tmp_path)])
    assert out.exit_code == 0 and out.output.count("wrote ") == len(SHIPPED)
    for topic in SHIPPED:
        assert (tmp_path / shipped_file(topic)).read_bytes() == (JSON_DIR / shipped_file(topic)).read_bytes()
    assert CliRunner().invoke(export_command, [str(tmp_path)]).output == ""
