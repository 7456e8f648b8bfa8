"""The trigger contract: one JSON object (version ``v`` = 1) per message on ``flopwatch.triggers``.

A trigger is one scaling decision that was taken for one workload (namespace + name):
``scale_up``, ``scale_down``, ``rollback`` (undoes an earlier scale-down; ``reverses``
names it) or ``rebalance`` (a confirmed efficiency drift: move or restart the work, the
replica count stays). Decisions that were withheld are not triggers; they are rows of
ClickHouse ``scale_decisions`` with the gate that held them.

Identity is deterministic: ``id`` hashes (namespace, workload, action, ts_ns), and the
decision engine is a function of the frame sequence, so a worker that replays frames
after a crash makes the same decision with the same id. ``idempotency_key`` is what a
consumer acts on at most once (today ``"<namespace>/<workload>/<action>/<ts_ns>"``; treat
it as opaque). The Kafka key is ``"<namespace>/<workload>"``: one workload's triggers
stay in order on one partition.

Decoding validates against the shipped JSON Schema ``schemas/json/trigger.v1.json``
(triggers are few, so the full validator is cheap) plus what it cannot say.

>>> t = make_trigger("scale_up", "serving", "chat", "inference", ts_ns=1_796_200_344_000_000_000,
...                  current=4, desired=6, reasons=("qps",),
...                  evidence={"qps": {"value": 1050.0, "threshold": 800.0, "window_s": 30.0}})
>>> t.id, t.idempotency_key, t.delta
('12a8aef3b0af8900885774e65a17163e', 'serving/chat/scale_up/1796200344000000000', 2)
>>> decode_trigger(encode_trigger(t)) == t
True
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, Final, Literal, get_args

import orjson

TRIGGER_VERSION: Final = 1
Action = Literal["scale_up", "scale_down", "rollback", "rebalance"]
ACTIONS: Final[tuple[str, ...]] = get_args(Action)
TRIGGER_SCHEMA_PATH: Final[Traversable] = resources.files("schemas") / "json" / "trigger.v1.json"
"""The JSON Schema (draft 2020-12) of one trigger message, shipped as package data."""

Evidence = Mapping[str, Mapping[str, float | int | str | bool | None]]


class TriggerDecodeError(ValueError):
    """Not a valid v1 trigger; ``reason`` is a stable code (``malformed_json``, ``unknown_version``, ``invalid``)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def trigger_id(namespace: str, workload: str, action: str, ts_ns: int) -> str:
    """First 32 hex digits of SHA-256 over the compact JSON ``[namespace, workload, action, ts_ns]``."""
    return hashlib.sha256(orjson.dumps([namespace, workload, action, ts_ns])).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Before:
    """What the engine knew before the decision: the replicas it saw and the last action taken."""

    replicas: int
    desired: int
    last_action: str | None = None
    last_action_ts_ns: int | None = None


@dataclass(frozen=True, slots=True)
class Trigger:
    """One message of ``flopwatch.triggers``; build it with ``make_trigger``."""

    id: str
    ts_ns: int  # end of the tick at which the decision was made (event time)
    action: Action
    namespace: str
    workload: str
    workload_class: str
    current: int
    desired: int
    delta: int
    reasons: tuple[str, ...]
    evidence: Evidence
    idempotency_key: str
    reverses: str | None = None
    before: Before = field(default_factory=lambda: Before(0, 0))
    v: int = TRIGGER_VERSION

    @property
    def key(self) -> bytes:
        """The Kafka key: one workload's triggers share a partition, in order."""
        return f"{self.namespace}/{self.workload}".encode()


def make_trigger(action: Action, namespace: str, workload: str, workload_class: str, *, ts_ns: int, current: int,
                 desired: int, reasons: tuple[str, ...], evidence: Evidence, reverses: str | None = None,
                 before: Before | None = None) -> Trigger:
    return Trigger(trigger_id(namespace, workload, action, ts_ns), ts_ns, action, namespace, workload, workload_class,
                   current, desired, desired - current, tuple(reasons), evidence,
                   f"{namespace}/{workload}/{action}/{ts_ns}", reverses,
                   before if before is not None else Before(current, current))


def trigger_dict(t: Trigger) -> dict[str, Any]:
    out = {f.name: getattr(t, f.name) for f in dataclasses.fields(Trigger)}
    out["class"] = out.pop("workload_class")
    out["reasons"] = list(t.reasons)
    out["evidence"] = {k: dict(v) for k, v in t.evidence.items()}
    out["before"] = dataclasses.asdict(t.before)
    return out


def encode_trigger(t: Trigger) -> bytes:
    """Compact JSON with sorted keys: equal triggers give equal bytes."""
    return orjson.dumps(trigger_dict(t), option=orjson.OPT_SORT_KEYS)


def decode_trigger(data: bytes) -> Trigger:
    """Parse and validate one message; raises ``TriggerDecodeError`` naming the fault.

    >>> try:
    ...     decode_trigger(b'{"v": 2}')
    ... except ValueError as exc:
    ...     print(str(exc)[:60])
    unknown_version: v=2, this consumer reads version 1
    """
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise TriggerDecodeError("malformed_json", str(exc)) from None
    if isinstance(obj, dict) and obj.get("v", TRIGGER_VERSION) != TRIGGER_VERSION:
        raise TriggerDecodeError("unknown_version", f"v={obj['v']!r}, this consumer reads version {TRIGGER_VERSION}")
    _validate(obj)
    obj["workload_class"] = obj.pop("class")
    obj["reasons"] = tuple(obj["reasons"])
    obj["before"] = Before(**obj["before"])
    t = Trigger(**obj)
    if t.id != trigger_id(t.namespace, t.workload, t.action, t.ts_ns):
        raise TriggerDecodeError("invalid", f"id {t.id} is not the hash of its namespace, workload, action, ts_ns")
    if t.delta != t.desired - t.current:
        raise TriggerDecodeError("invalid", f"delta {t.delta} != desired - current ({t.desired} - {t.current})")
    return t


def trigger_schema() -> dict[str, Any]:
    """The JSON Schema of one trigger message (draft 2020-12)."""
    schema: dict[str, Any] = orjson.loads(TRIGGER_SCHEMA_PATH.read_bytes())
    return schema


_VALIDATOR: Any = None


def _validate(obj: Any) -> None:
    global _VALIDATOR
    if _VALIDATOR is None:
        import jsonschema  # a runtime dependency: triggers are validated in full

        _VALIDATOR = jsonschema.Draft202012Validator(trigger_schema())
    err = next(iter(sorted(_VALIDATOR.iter_errors(obj), key=lambda e: list(e.absolute_path))), None)
    if err is not None:
        where = "/".join(str(p) for p in err.absolute_path) or "top level"
        raise TriggerDecodeError("invalid", f"{err.message} (at {where})")
