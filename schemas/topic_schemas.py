"""JSON Schemas (draft 2020-12) of every topic flopwatch reads or writes, generated from ``schemas/``.

Inputs (what producer integrations write) are generated here from the catalog and the
codec's rules: one schema per sensor topic, carrying that sensor's valid range, and one
each for ``k8s.events`` and ``clock.sync``. Unknown extra fields are allowed, because
the pipeline ignores them. Outputs: ``flopwatch.frames``, ``flopwatch.alerts`` and
``flopwatch.triggers`` have their own modules and shipped files (loaded from there);
``flopwatch.workloads`` is generated from ``schemas.workload_samples``.
``flopwatch.dlq`` carries the rejected message's original bytes, which need not be JSON
at all: its schema accepts anything and documents the headers instead.

``schemas/json/<file>`` ships each generated schema (``SHIPPED``); a test keeps the
files equal to the generator.

>>> s = schema_for("sensors.power")
>>> s["$id"], s["properties"]["value"]["oneOf"][0]["maximum"]
('urn:flopwatch:schema:sensors.power:v1', 5000.0)
>>> sorted(TOPIC_NAMES)[:3]
['clock.sync', 'flopwatch.alerts', 'flopwatch.dlq']
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Final

from schemas.alerts import alert_schema
from schemas.catalog import BY_NAME, CATALOG, INT_LABELS, LABEL_COLUMNS, Sensor
from schemas.frame_messages import frame_schema
from schemas.records import UTC_CLOCK, WIRE_VERSION
from schemas.triggers import trigger_schema
from schemas.workload_samples import REQUIRED_FIELDS, WORKLOAD_SAMPLE_VERSION, DriftDetail, WorkloadSample

_DRAFT: Final = "https://json-schema.org/draft/2020-12/schema"
K8S_EVENTS: Final = "k8s.events"  # the names of agents.kafka.topics, before any prefix (a test keeps them equal)
CLOCK_SYNC: Final = "clock.sync"
FRAMES: Final = "flopwatch.frames"
WORKLOADS: Final = "flopwatch.workloads"
TRIGGERS: Final = "flopwatch.triggers"
ALERTS: Final = "flopwatch.alerts"
DLQ: Final = "flopwatch.dlq"
TOPIC_NAMES: Final = (*(s.topic for s in CATALOG), K8S_EVENTS, CLOCK_SYNC, FRAMES, WORKLOADS, TRIGGERS, ALERTS, DLQ)
_INT64: Final = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
_NAME: Final = {"type": "string", "minLength": 1}
_INTEGER_NOTE: Final = ("Integers must be written as integer literals: JSON Schema counts 5.0 as an integer, "
                        "the pipeline rejects it (wrong_type).")


class UnknownTopicError(KeyError):
    """No topic of that name; the message lists the topics there are."""

    def __str__(self) -> str:
        return str(self.args[0])


def _labels() -> dict[str, Any]:
    props = {k: ({"type": "integer"} if k in INT_LABELS else {"type": "string"}) for k in LABEL_COLUMNS}
    return {"type": "object", "properties": props, "additionalProperties": True,
            "description": "Optional; may be sent only when it changes. Unknown label keys are ignored."}


def sensor_schema(sensor: Sensor) -> dict[str, Any]:
    """One message of ``sensors.<name>``: a single sample, or a batch with ``ts_ns`` and ``value`` as arrays."""
    number = {"type": "number", "minimum": float(sensor.lo), "maximum": float(sensor.hi)}
    gpu_note = ' ("host" for this host-level stream)' if sensor.scope == "host" else ""
    return {
        "$schema": _DRAFT,
        "$id": f"urn:flopwatch:schema:{sensor.topic}:v1",
        "title": f"flopwatch {sensor.topic} message, version 1",
        "description": f"{sensor.name}: {sensor.kind} in {sensor.unit} ({sensor.source}), valid range "
                       f"[{sensor.lo:g}, {sensor.hi:g}]. UTF-8 JSON, Kafka key = node. One sample (ts_ns and "
                       "value numbers) or a batch (ts_ns and value arrays of equal length, which JSON Schema "
                       "cannot check). NaN and Infinity are not JSON and are rejected. Unknown extra fields are "
                       f"ignored. {_INTEGER_NOTE}",
        "type": "object",
        "required": ["v", "node", "gpu", "ts_ns", "value"],
        "additionalProperties": True,
        "properties": {
            "v": {"const": WIRE_VERSION},
            "sensor": {"const": sensor.name, "description": "Optional; when present, must name this topic's sensor."},
            "node": {**_NAME, "description": "The node's name; also the Kafka key."},
            "gpu": {**_NAME, "description": f"The GPU's UUID or index as a string{gpu_note}."},
            "clock": {**_NAME, "default": UTC_CLOCK,
                      "description": "Clock domain of ts_ns; 'utc' (the default) is Unix epoch time. Other "
                                     "domains need clock.sync beacons."},
            "ts_ns": {"oneOf": [_INT64, {"type": "array", "minItems": 1, "items": _INT64}],
                      "description": "Event time, integer nanoseconds in the clock domain."},
            "value": {"oneOf": [number, {"type": "array", "minItems": 1, "items": number}],
                      "description": f"The reading in {sensor.unit}."},
            "labels": _labels(),
        },
        # The two forms: both numbers, or both arrays.
        "oneOf": [
            {"properties": {"ts_ns": {"type": "integer"}, "value": {"type": "number"}}},
            {"properties": {"ts_ns": {"type": "array"}, "value": {"type": "array"}}},
        ],
    }


def k8s_event_schema() -> dict[str, Any]:
    """One message of ``k8s.events``."""
    text = {"type": "string"}
    return {
        "$schema": _DRAFT,
        "$id": f"urn:flopwatch:schema:{K8S_EVENTS}:v1",
        "title": f"flopwatch {K8S_EVENTS} message, version 1",
        "description": f"A Kubernetes event concerning a node (Kafka key = node). Unknown extra fields are ignored. "
                       f"{_INTEGER_NOTE}",
        "type": "object",
        "required": ["v", "node", "ts_ns", "type", "reason"],
        "additionalProperties": True,
        "properties": {
            "v": {"const": WIRE_VERSION},
            "node": _NAME,
            "ts_ns": {**_INT64, "description": "UTC, integer nanoseconds since the epoch."},
            "type": {**_NAME, "description": "Normal or Warning."},
            "reason": {**_NAME, "description": "The event's reason, e.g. OOMKilled."},
            "kind": text, "namespace": text, "pod": text, "workload": text, "message": text,
            "gpus": {"type": "array", "items": {"type": "string"}, "description": "GPUs (UUID or index) concerned."},
        },
    }


def clock_sync_schema() -> dict[str, Any]:
    """One message of ``clock.sync``."""
    return {
        "$schema": _DRAFT,
        "$id": f"urn:flopwatch:schema:{CLOCK_SYNC}:v1",
        "title": f"flopwatch {CLOCK_SYNC} message, version 1",
        "description": "One reading of clock domain 'clock' taken between two UTC readings of its host (Kafka "
                       "key = node); about one a second per domain. utc_after_ns must not be before utc_before_ns "
                       f"(checked by the pipeline, not by this schema). {_INTEGER_NOTE}",
        "type": "object",
        "required": ["v", "node", "clock", "domain_ns", "utc_before_ns", "utc_after_ns"],
        "additionalProperties": True,
        "properties": {
            "v": {"const": WIRE_VERSION},
            "node": _NAME,
            "clock": {**_NAME, "description": "The domain's name, as in the samples' clock field."},
            "domain_ns": _INT64,
            "utc_before_ns": _INT64,
            "utc_after_ns": _INT64,
        },
    }


def _field_schema(name: str, hint: Any) -> dict[str, Any]:
    nonneg_number = {"type": "number", "minimum": 0}
    if hint is str:
        return dict(_NAME) if name in ("namespace", "workload", "workload_class", "node") else {"type": "string"}
    if hint is int:
        return {"type": "integer", "minimum": 0}
    if hint is bool:
        return {"type": "boolean"}
    if hint == float | None:
        return {"oneOf": [nonneg_number, {"type": "null"}]}
    if hint == tuple[str, ...]:
        return {"type": "array", "items": {"type": "string"}}
    if hint == tuple[DriftDetail, ...]:
        number = {"type": "number"}
        return {"type": "array", "items": {
            "type": "object", "required": ["gpu", "value", "baseline", "load_w"], "additionalProperties": False,
            "properties": {"gpu": {"type": "string"}, "value": number, "baseline": number,
                           **{k: {"oneOf": [number, {"type": "null"}]} for k in ("load_w", "band_lo_w", "band_hi_w")}}}}
    raise TypeError(f"schemas/topic_schemas.py: no JSON Schema for WorkloadSample.{name}: {hint!r}")


def workload_schema() -> dict[str, Any]:
    """One message of ``flopwatch.workloads``, generated from the ``WorkloadSample`` fields."""
    hints = typing.get_type_hints(WorkloadSample)
    names = [f.name for f in dataclasses.fields(WorkloadSample)]
    return {
        "$schema": _DRAFT,
        "$id": f"urn:flopwatch:schema:{WORKLOADS}:v1",
        "title": f"flopwatch {WORKLOADS} message, version 1",
        "description": "One node's frame for one tick, summarised per workload (schemas/workload_samples.py); "
                       "Kafka key = namespace/workload, Kafka timestamp = tick. Written by the detection agent, "
                       "read by the decision agent.",
        "type": "object",
        "required": ["v", *REQUIRED_FIELDS],
        "additionalProperties": False,
        "properties": {"v": {"const": WORKLOAD_SAMPLE_VERSION}, **{n: _field_schema(n, hints[n]) for n in names}},
    }


def dlq_schema() -> dict[str, Any]:
    """``flopwatch.dlq``: raw bytes, so the schema accepts any value; the headers carry the contract."""
    return {
        "$schema": _DRAFT,
        "$id": f"urn:flopwatch:schema:{DLQ}:v1",
        "title": f"flopwatch {DLQ} message, version 1",
        "description": "The value is the rejected message's original bytes, untouched: not necessarily JSON, so "
                       "this schema accepts anything. The contract is in the Kafka headers: flopwatch.reason (a "
                       "stable reject reason: malformed_json, unknown_version, missing_field, wrong_type, "
                       "not_finite, out_of_range, length_mismatch, unknown_sensor, too_old, too_new, late, "
                       "no_clock, internal_error), flopwatch.detail, flopwatch.topic, flopwatch.partition, "
                       "flopwatch.offset, and for a partly rejected batch flopwatch.indices and "
                       "flopwatch.rejected. At-least-once: after a crash a reject may appear twice, with the "
                       "same origin headers.",
    }


def schema_for(topic: str) -> dict[str, Any]:
    """The schema of ``topic`` (its name without the configured prefix)."""
    if topic.startswith("sensors.") and topic[len("sensors."):] in BY_NAME:
        return sensor_schema(BY_NAME[topic[len("sensors."):]])
    makers = {K8S_EVENTS: k8s_event_schema, CLOCK_SYNC: clock_sync_schema, FRAMES: frame_schema,
              WORKLOADS: workload_schema, TRIGGERS: trigger_schema, ALERTS: alert_schema, DLQ: dlq_schema}
    maker = makers.get(topic)
    if maker is None:
        raise UnknownTopicError(f"no topic named {topic!r}; the topics are: {', '.join(TOPIC_NAMES)}")
    return maker()


def shipped_file(topic: str) -> str:
    """File name under ``schemas/json/`` of a topic whose schema this module generates."""
    return f"{topic.removeprefix('flopwatch.')}.v1.json"


# Topics whose schema this module generates and ships; frames, alerts and triggers ship their own.
SHIPPED: Final = tuple(t for t in TOPIC_NAMES if t not in (FRAMES, ALERTS, TRIGGERS))
