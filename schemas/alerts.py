"""The alert contract: one JSON object (version ``v`` = 2) per message on ``flopwatch.alerts``.

An alert is one episode of one detection rule on one GPU (or a node's ``"host"``). Its
``id`` is derived from the rule, the node, the GPU and the onset tick only, so a detector
that replays its frames after a crash emits the same id again. An episode has one
``firing`` message and, when it ends, one ``resolved`` message with the same id; a replay
may repeat either, never with a different meaning. ``message_id`` (``"<id>:<state>"``)
names one of the two, for consumers that act exactly once per message. Version 2 adds
``causes`` (attribution): the first firing message has none, a second firing message with
the same id carries them (its ``message_id`` is ``<id>:firing:causes``), and the resolved message
repeats them. Version 1 messages still decode (with no causes). The Kafka key of
a message is its ``id`` (``alert_key``): both messages of an episode share a partition,
in order, and a compacted topic keeps the latest state of every episode.

Decoding checks the message as strictly as the JSON Schema ``schemas/json/alert.v2.json``
does (no unknown fields, every field present, ``null`` where a value is absent), plus what
a JSON Schema cannot say: ``ts_ns >= onset_ts_ns``.

>>> a = make_alert("util_spike", "warning", "node-07", "3", value=99.1, threshold=95.0,
...                onset_ts_ns=1_796_200_344_000_000_000, ts_ns=1_796_200_344_200_000_000)
>>> a.id
'b51a512adf192c07eedf2d50565988c4'
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, Final, Literal, get_args

import orjson

ALERT_VERSION: Final = 2
READ_VERSIONS: Final = (1, 2)  # version 1: no causes
MAX_CAUSES: Final = 16
# The leak and trap rules (streams.leaks): their names are part of the contract.
LEAK_RULES: Final = ("memory_fragmentation", "nccl_retransmit_storm", "nccl_slow_allreduce", "checkpoint_io_storm",
                     "batching_collapse", "pipeline_stall", "idle_allocated")
Severity = Literal["info", "warning", "critical"]
AlertState = Literal["firing", "resolved"]
EvidenceValue = int | float | str | bool | None
SEVERITIES: Final[tuple[str, ...]] = get_args(Severity)
STATES: Final[tuple[str, ...]] = get_args(AlertState)
MAX_TS_NS: Final = 2**63 - 1

ALERT_SCHEMA_PATH: Final[Traversable] = resources.files("schemas") / "json" / "alert.v2.json"
"""The JSON Schema (draft 2020-12) of one alert message, shipped as package data."""

_ID_RE: Final = re.compile(r"[0-9a-f]{32}")
_RULE_RE: Final = re.compile(r"[a-z][a-z0-9_]{0,63}")


class AlertDecodeError(ValueError):
    """A message that is not a valid v1 alert; ``reason`` is a stable code, the text says what is wrong.

    Reasons: ``malformed_json``, ``not_an_object``, ``unknown_version``, ``missing_field``,
    ``unknown_field``, ``wrong_type``, ``out_of_range``.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def alert_id(rule: str, node: str, gpu: str, onset_ts_ns: int) -> str:
    """The id of an episode: the first 32 hex digits of SHA-256 over the compact JSON array
    ``[rule, node, gpu, onset_ts_ns]`` (UTF-8, no spaces), so no choice of names can collide.

    >>> alert_id("util_spike", "node-07", "3", 1_796_200_344_000_000_000)
    'b51a512adf192c07eedf2d50565988c4'
    >>> alert_id("util_spike", "node-07", "3", 1_796_200_345_000_000_000)  # one second later: another episode
    'b1e900c7f0dc927ad7926c19e3978540'

    """
    return hashlib.sha256(orjson.dumps([rule, node, gpu, onset_ts_ns])).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Cause:
    """One likely cause of an episode: a sensor, a Kubernetes event reason, another rule or a label change.

    >>> Cause("disk_write", 0.8, {"source": "series", "lag_s": 2.0}).as_dict()["cause"]
    'disk_write'
    """

    cause: str
    confidence: float
    evidence: Mapping[str, EvidenceValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.cause, str) or not 1 <= len(self.cause) <= 128:
            raise _fail("out_of_range", f"causes[].cause must be a string of 1..128 characters, got {self.cause!r}")
        c = _number("causes[].confidence", self.confidence)
        if c is None or not 0.0 <= c <= 1.0:
            raise _fail("out_of_range", f"causes[].confidence must be in [0, 1], got {self.confidence!r}")
        object.__setattr__(self, "confidence", c)
        _check_evidence(self.evidence, "causes[].evidence")

    def as_dict(self) -> dict[str, Any]:
        return {"cause": self.cause, "confidence": self.confidence, "evidence": dict(self.evidence)}


@dataclass(frozen=True, slots=True)
class Alert:
    """One message of the ``flopwatch.alerts`` topic. Construction validates every field.

    ``ts_ns`` is when the message was made: for ``firing`` the tick at which the rule
    confirmed the episode, for ``resolved`` the tick at which it ended.
    """

    id: str
    rule: str
    severity: Severity
    state: AlertState
    node: str
    gpu: str
    workload: str | None
    namespace: str | None
    value: float
    threshold: float
    baseline: float | None
    onset_ts_ns: int
    ts_ns: int
    evidence: Mapping[str, EvidenceValue] = field(default_factory=dict)
    causes: tuple[Cause, ...] = ()
    v: int = ALERT_VERSION

    def __post_init__(self) -> None:
        _check(self)

    @property
    def message_id(self) -> str:
        """``"<id>:<state>"``: the firing and the resolved message of an episode differ; replays do not.
        A firing message with causes is ``"<id>:firing:causes"``: the attribution that follows a firing (the
        resolved message, which repeats the causes, stays ``"<id>:resolved"``)."""
        return f"{self.id}:firing:causes" if self.causes and self.state == "firing" else f"{self.id}:{self.state}"

    def attributed(self, causes: tuple[Cause, ...]) -> Alert:
        """This message again, with its causes (most likely first)."""
        return dataclasses.replace(self, causes=causes)

    def resolved(self, ts_ns: int, value: float | None = None,
                 evidence: Mapping[str, EvidenceValue] | None = None) -> Alert:
        """The resolved message of this episode (same id), at ``ts_ns``.

        >>> a = make_alert("sm_spike", "info", "n", "0", value=1.0, threshold=0.9, onset_ts_ns=5, ts_ns=6)
        >>> r = a.resolved(9)
        >>> (r.id == a.id, r.state, r.message_id == a.message_id)
        (True, 'resolved', False)
        """
        return dataclasses.replace(self, state="resolved", ts_ns=ts_ns,
                                   value=self.value if value is None else value,
                                   evidence=self.evidence if evidence is None else evidence)


def make_alert(rule: str, severity: Severity, node: str, gpu: str, *, value: float, threshold: float,
               onset_ts_ns: int, ts_ns: int, baseline: float | None = None, workload: str | None = None,
               namespace: str | None = None, evidence: Mapping[str, EvidenceValue] | None = None) -> Alert:
    """A firing alert with its id computed by ``alert_id``."""
    return Alert(id=alert_id(rule, node, gpu, onset_ts_ns), rule=rule, severity=severity, state="firing",
                 node=node, gpu=gpu, workload=workload, namespace=namespace, value=value, threshold=threshold,
                 baseline=baseline, onset_ts_ns=onset_ts_ns, ts_ns=ts_ns, evidence=dict(evidence or {}))


def alert_key(alert: Alert) -> bytes:
    """The Kafka key of an alert message: its id."""
    return alert.id.encode()


def encode_alert(alert: Alert) -> bytes:
    """Compact JSON with sorted keys: equal alerts give equal bytes.

    >>> a = make_alert("sm_spike", "critical", "n", "0", value=1, threshold=0.9, onset_ts_ns=5, ts_ns=6)
    >>> decode_alert(encode_alert(a)) == a
    True
    """
    return orjson.dumps(_as_dict(alert), option=orjson.OPT_SORT_KEYS)


def decode_alert(data: bytes) -> Alert:
    """Parse and validate one message; raises ``AlertDecodeError`` (a ``ValueError``) naming the fault.

    >>> try:
    ...     decode_alert(b'{"v": 3}')
    ... except ValueError as exc:
    ...     print(exc)
    unknown_version: v=3, this consumer reads versions 1 and 2
    """
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise AlertDecodeError("malformed_json", str(exc)) from None
    if not isinstance(obj, dict):
        raise AlertDecodeError("not_an_object", f"expected a JSON object, got {type(obj).__name__}")
    if "v" not in obj:
        raise AlertDecodeError("missing_field", "v")
    if obj["v"] not in READ_VERSIONS or isinstance(obj["v"], bool):
        raise AlertDecodeError("unknown_version", f"v={obj['v']!r}, this consumer reads versions 1 and 2")
    fields = _FIELDS if obj["v"] == ALERT_VERSION else _V1_FIELDS
    missing = [n for n in fields if n not in obj]
    if missing:
        raise AlertDecodeError("missing_field", ", ".join(missing))
    unknown = sorted(set(obj) - set(fields))
    if unknown:
        raise AlertDecodeError("unknown_field", ", ".join(unknown))
    doc = {**obj, "v": ALERT_VERSION, "causes": _causes(obj.get("causes", []))}
    return Alert(**doc)


def alert_schema() -> dict[str, Any]:
    """The JSON Schema of one alert message (draft 2020-12)."""
    schema: dict[str, Any] = orjson.loads(ALERT_SCHEMA_PATH.read_bytes())
    return schema


# --- validation ---------------------------------------------------------------------------------------------------

_FIELDS: Final = tuple(f.name for f in dataclasses.fields(Alert))
_V1_FIELDS: Final = tuple(n for n in _FIELDS if n != "causes")


def _as_dict(alert: Alert) -> dict[str, Any]:
    out = {name: getattr(alert, name) for name in _FIELDS}
    out["evidence"] = dict(alert.evidence)
    out["causes"] = [c.as_dict() for c in alert.causes]
    return out


def _causes(raw: object) -> tuple[Cause, ...]:
    if not isinstance(raw, list):
        raise _fail("wrong_type", f"causes must be an array, got {raw!r}")
    if len(raw) > MAX_CAUSES:
        raise _fail("out_of_range", f"causes holds at most {MAX_CAUSES} entries, got {len(raw)}")
    out = []
    for c in raw:
        if not isinstance(c, dict):
            raise _fail("wrong_type", f"causes[] must be objects, got {c!r}")
        keys = set(c)
        if keys != {"cause", "confidence", "evidence"}:
            raise _fail("missing_field" if keys < {"cause", "confidence", "evidence"} else "unknown_field",
                        f"causes[] has {sorted(keys)}, wants cause, confidence, evidence")
        if not isinstance(c["evidence"], dict):
            raise _fail("wrong_type", f"causes[].evidence must be an object, got {c['evidence']!r}")
        out.append(Cause(c["cause"], c["confidence"], c["evidence"]))
    return tuple(out)


def _fail(reason: str, detail: str) -> AlertDecodeError:
    return AlertDecodeError(reason, detail)


def _text(name: str, val: object, optional: bool = False) -> None:
    if val is None and optional:
        return
    if not isinstance(val, str):
        raise _fail("wrong_type", f"{name} must be a string{' or null' if optional else ''}, got {val!r}")
    if not val:
        raise _fail("out_of_range", f"{name} must not be empty")


def _number(name: str, val: object, optional: bool = False) -> float | None:
    if val is None and optional:
        return None
    if isinstance(val, bool) or not isinstance(val, int | float):
        raise _fail("wrong_type", f"{name} must be a number{' or null' if optional else ''}, got {val!r}")
    if not math.isfinite(val):
        raise _fail("out_of_range", f"{name} must be finite, got {val!r}")
    return float(val)


def _ts(name: str, val: object) -> None:
    if isinstance(val, bool) or not isinstance(val, int):
        raise _fail("wrong_type", f"{name} must be an integer (nanoseconds since the Unix epoch), got {val!r}")
    if not 0 <= val <= MAX_TS_NS:
        raise _fail("out_of_range", f"{name}={val} is outside 0..2^63-1")


def _check(a: Alert) -> None:
    if a.v != ALERT_VERSION or isinstance(a.v, bool):
        raise _fail("unknown_version", f"v={a.v!r}, this consumer reads version {ALERT_VERSION}")
    for name in ("id", "rule", "node", "gpu"):
        _text(name, getattr(a, name))
    if not _ID_RE.fullmatch(a.id):
        raise _fail("out_of_range", f"id must be 32 lower-case hex digits, got {a.id!r}")
    if not _RULE_RE.fullmatch(a.rule):
        raise _fail("out_of_range", f"rule must be a lower-case identifier of at most 64 characters, got {a.rule!r}")
    if a.severity not in SEVERITIES:
        raise _fail("out_of_range", f"severity must be one of {', '.join(SEVERITIES)}, got {a.severity!r}")
    if a.state not in STATES:
        raise _fail("out_of_range", f"state must be one of {', '.join(STATES)}, got {a.state!r}")
    _text("workload", a.workload, optional=True)
    _text("namespace", a.namespace, optional=True)
    # JSON integers arrive as int: hold every number as float, so equal alerts compare equal.
    object.__setattr__(a, "value", _number("value", a.value))
    object.__setattr__(a, "threshold", _number("threshold", a.threshold))
    object.__setattr__(a, "baseline", _number("baseline", a.baseline, optional=True))
    _ts("onset_ts_ns", a.onset_ts_ns)
    _ts("ts_ns", a.ts_ns)
    if a.ts_ns < a.onset_ts_ns:
        raise _fail("out_of_range", f"ts_ns={a.ts_ns} is before onset_ts_ns={a.onset_ts_ns}")
    _check_evidence(a.evidence, "evidence")
    if not isinstance(a.causes, tuple) or not all(isinstance(c, Cause) for c in a.causes):
        raise _fail("wrong_type", f"causes must be a tuple of Cause, got {a.causes!r}")
    if len(a.causes) > MAX_CAUSES:
        raise _fail("out_of_range", f"causes holds at most {MAX_CAUSES} entries, got {len(a.causes)}")


def _check_evidence(evidence: object, name: str) -> None:
    if not isinstance(evidence, Mapping):
        raise _fail("wrong_type", f"{name} must be an object, got {evidence!r}")
    for key, val in evidence.items():
        if not isinstance(key, str) or not key:
            raise _fail("wrong_type", f"{name} keys must be non-empty strings, got {key!r}")
        if val is None or isinstance(val, str | bool):
            continue
        if not isinstance(val, int | float):
            raise _fail("wrong_type", f"{name}[{key!r}] must be a number, string, boolean or null, got {val!r}")
        if not math.isfinite(val):
            raise _fail("out_of_range", f"{name}[{key!r}] must be finite, got {val!r}")
