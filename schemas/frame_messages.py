"""The frames contract: one JSON object (version ``v`` = 1) per node and grid tick on ``flopwatch.frames``.

The ingest publishes every closed frame here as well as to ClickHouse; detection
agents and any other consumer read it. The Kafka key is the node, the Kafka timestamp
the tick (ms), so a consumer can seek by event time. A message carries all of the
node's GPUs (and its ``host`` pseudo-GPU) for that tick.

Identity is deterministic: a message's ``id`` hashes (node, tick_ns), a GPU frame's
``id`` hashes (node, gpu, tick_ns). A replay after a crash may publish a message again,
unchanged; consumers deduplicate by id (or keep the newest tick per node, which is
what the detection agents do).

``values`` holds only the sampled aggregates (a missing key is an empty cell, NULL in
ClickHouse); ``derived`` holds every derived column, null where an input is missing,
and ``note`` says which input (``schemas.frames.NOTE_CODES``). ``fpw_sub``, optional, is
the tick's FLOPS/W in 100 ms buckets (null where a bucket had no sample): what the drift
rule times a hold by (``streams.efficiency.subticks``); not stored in ClickHouse.

>>> m = FrameMessage("node-1", 1_796_200_344_000_000_000, 1_000_000_000,
...                  (GpuFrame("0", {"workload": "llm"}, {"power": 512.5}, {"tflops": 400.0}, ""),))
>>> decode_frame_message(encode_frame_message(m)) == m
True
>>> m.id, m.gpus[0].id == frame_id("node-1", "0", m.tick_ns)
('d5470c62c93a11696cb3e3f0d217bc5f', True)
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, Final

import orjson

from schemas.catalog import INT_LABELS, LABEL_COLUMNS
from schemas.frames import DERIVED_COLUMNS, NOTE_CODES, VALUE_COLUMNS

FRAME_VERSION: Final = 1
FRAME_SCHEMA_PATH: Final[Traversable] = resources.files("schemas") / "json" / "frame.v1.json"
_VALUES: Final = frozenset(VALUE_COLUMNS)
_DERIVED: Final = frozenset(DERIVED_COLUMNS)
_TOP: Final = ("v", "id", "node", "tick_ns", "grid_ns", "gpus")
_GPU: Final = ("gpu", "id", "labels", "values", "derived", "note", "clock_uncertainty_us")
_GPU_OPTIONAL: Final = ("fpw_sub",)
_MAX_SUB: Final = 600  # buckets per tick: a 60 s grid in 100 ms buckets
_FIELD_SETS: Final[dict[tuple[str, ...], frozenset[str]]] = {names: frozenset(names) for names in (_TOP, _GPU)}
_STR_LABELS: Final = frozenset(LABEL_COLUMNS) - INT_LABELS
_NOTES: Final = frozenset(NOTE_CODES) | {""}


class FrameDecodeError(ValueError):
    """Not a valid v1 frames message; ``reason`` is a stable code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def message_id(node: str, tick_ns: int) -> str:
    """First 32 hex digits of SHA-256 over the compact JSON ``[node, tick_ns]``."""
    return hashlib.sha256(orjson.dumps([node, tick_ns])).hexdigest()[:32]


def frame_id(node: str, gpu: str, tick_ns: int) -> str:
    """First 32 hex digits of SHA-256 over the compact JSON ``[node, gpu, tick_ns]``."""
    return hashlib.sha256(orjson.dumps([node, gpu, tick_ns])).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class GpuFrame:
    gpu: str
    labels: Mapping[str, str | int]
    values: Mapping[str, float]  # sampled aggregates only
    derived: Mapping[str, float | None]
    note: str
    clock_uncertainty_us: float = 0.0
    id: str = ""  # frame_id(node, gpu, tick): set by the FrameMessage that holds it
    fpw_sub: tuple[float | None, ...] = ()  # the tick's FLOPS/W in 100 ms buckets; () when not sent

    def value(self, column: str) -> float | None:
        return self.values.get(column)


@dataclass(frozen=True, slots=True)
class FrameMessage:
    node: str
    tick_ns: int
    grid_ns: int
    gpus: tuple[GpuFrame, ...]

    def __post_init__(self) -> None:
        # Each GPU frame's id comes from the message's node and tick (never trusted from the wire),
        # and every derived column is present (null where absent), so equal frames compare equal.
        fixed = tuple(_normal(g, self.node, self.tick_ns) for g in self.gpus)
        object.__setattr__(self, "gpus", fixed)

    @property
    def id(self) -> str:
        return message_id(self.node, self.tick_ns)


def _normal(g: GpuFrame, node: str, tick_ns: int) -> GpuFrame:
    """``g`` with its id from (node, gpu, tick) and every derived column present, null where absent."""
    derived = g.derived if g.derived.keys() == _DERIVED else {c: g.derived.get(c) for c in DERIVED_COLUMNS}
    return GpuFrame(g.gpu, g.labels, g.values, derived, g.note, g.clock_uncertainty_us,
                    frame_id(node, g.gpu, tick_ns), g.fpw_sub)


def encode_frame_message(m: FrameMessage) -> bytes:
    """Compact JSON with sorted keys: equal messages give equal bytes."""
    return encode_frame_doc(m.node, m.tick_ns, m.grid_ns, [
        gpu_doc(g.gpu, g.id, dict(g.labels), dict(g.values), {c: g.derived.get(c) for c in DERIVED_COLUMNS}, g.note,
                g.clock_uncertainty_us, g.fpw_sub) for g in m.gpus])


def gpu_doc(gpu: str, id: str, labels: Mapping[str, str | int], values: Mapping[str, float],
            derived: Mapping[str, float | None], note: str, clock_uncertainty_us: float,
            fpw_sub: tuple[float | None, ...] = ()) -> dict[str, object]:
    """One GPU frame of a message, as JSON; ``encode_frame_message`` and the writer's columnar encoder
    (``agents.sinks.frames_out``) both build it here, so their bytes cannot drift apart."""
    doc: dict[str, object] = {"gpu": gpu, "id": id, "labels": labels, "values": values, "derived": derived,
                              "note": note, "clock_uncertainty_us": clock_uncertainty_us}
    if fpw_sub.count(None) < len(fpw_sub):  # some bucket has a value (count runs in C: ~10 per GPU frame)
        doc["fpw_sub"] = list(fpw_sub)
    return doc


def encode_frame_doc(node: str, tick_ns: int, grid_ns: int, gpus: list[dict[str, object]]) -> bytes:
    """The message of one node's tick from its ``gpu_doc`` entries: compact JSON with sorted keys, the GPUs in
    ``gpu_order``. The frames of a tick come out of the aligner in the order their series first arrived, which a
    replay need not repeat; sorted, a replayed message is byte-identical (docs/contracts.md).

    >>> a, b = gpu_doc("10", "x", {}, {}, {}, "", 0.0), gpu_doc("host", "y", {}, {}, {}, "", 0.0)
    >>> encode_frame_doc("n", 0, 1, [b, a]) == encode_frame_doc("n", 0, 1, [a, b])
    True
    """
    return orjson.dumps({"v": FRAME_VERSION, "id": message_id(node, tick_ns), "node": node, "tick_ns": tick_ns,
                         "grid_ns": grid_ns, "gpus": sorted(gpus, key=_gpu_order)}, option=orjson.OPT_SORT_KEYS)


def gpu_order(gpu: str) -> tuple[int, str]:
    """A message's GPUs in index order, the node's ``host`` row last: by the name's length, then the name.

    >>> sorted(["host", "10", "2", "0"], key=gpu_order)
    ['0', '2', '10', 'host']
    """
    return len(gpu), gpu


def _gpu_order(doc: dict[str, object]) -> tuple[int, str]:
    return gpu_order(doc["gpu"])  # type: ignore[arg-type]


def decode_frame_message(data: bytes) -> FrameMessage:
    """Parse and validate one message; raises ``FrameDecodeError`` naming the fault.

    >>> try:
    ...     decode_frame_message(b'{"v": 1, "node": "n"}')
    ... except ValueError as exc:
    ...     print(exc)
    missing_field: id, tick_ns, grid_ns, gpus
    """
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise FrameDecodeError("malformed_json", str(exc)) from None
    if not isinstance(obj, dict):
        raise FrameDecodeError("not_an_object", f"expected a JSON object, got {type(obj).__name__}")
    if obj.get("v") != FRAME_VERSION or isinstance(obj.get("v"), bool):
        raise FrameDecodeError("unknown_version", f"v={obj.get('v')!r}, this consumer reads version {FRAME_VERSION}")
    _fields(obj, _TOP, "message")
    node, tick, grid = obj["node"], obj["tick_ns"], obj["grid_ns"]
    if not isinstance(node, str) or not node:
        raise FrameDecodeError("wrong_type", "node must be a non-empty string")
    for name, val in (("tick_ns", tick), ("grid_ns", grid)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 0:
            raise FrameDecodeError("wrong_type", f"{name} must be a non-negative integer, got {val!r}")
    if not isinstance(obj["gpus"], list):
        raise FrameDecodeError("wrong_type", "gpus must be an array")
    msg = FrameMessage(node, tick, grid, tuple(_gpu(g) for g in obj["gpus"]))  # its __post_init__ sets the ids
    if obj["id"] != msg.id:
        raise FrameDecodeError("wrong_id", f"id {obj['id']!r} is not the id of ({node!r}, {tick})")
    return msg


def _fields(obj: dict[str, Any], names: tuple[str, ...], what: str) -> None:
    if obj.keys() == _FIELD_SETS[names]:
        return
    missing = [n for n in names if n not in obj]
    if missing:
        raise FrameDecodeError("missing_field", ", ".join(missing))
    unknown = sorted(set(obj) - set(names) - {"v"})
    if unknown:
        raise FrameDecodeError("unknown_field", f"{what}: {', '.join(unknown)}")


def _gpu(g: object) -> GpuFrame:
    if not isinstance(g, dict):
        raise FrameDecodeError("wrong_type", "each entry of gpus must be an object")
    sub = g.pop("fpw_sub", None)
    _fields(g, _GPU, "gpu frame")
    if not isinstance(g["gpu"], str) or not g["gpu"]:
        raise FrameDecodeError("wrong_type", "gpu must be a non-empty string")
    labels, values, derived = g["labels"], g["values"], g["derived"]
    if not (type(labels) is dict and type(values) is dict and type(derived) is dict):
        raise FrameDecodeError("wrong_type", "labels, values and derived must be objects")
    if not (labels.keys() <= _STR_LABELS and set(map(type, labels.values())) <= {str}):  # else: any int labels
        for k, v in labels.items():
            want = int if k in INT_LABELS else str
            if k not in LABEL_COLUMNS or isinstance(v, bool) or not isinstance(v, want):
                raise FrameDecodeError("wrong_type", f"label {k!r}={v!r} is not a known label of its type")
    vals = _numbers(values, _VALUES, nullable=False)
    der = _numbers(derived, _DERIVED, nullable=True)
    note = g["note"]
    if not isinstance(note, str) or (note and not set(note.split(",")) <= _NOTES):
        raise FrameDecodeError("wrong_type", f"note {note!r} is not a comma-separated list of note codes")
    unc = _num("clock_uncertainty_us", g["clock_uncertainty_us"], frozenset({"clock_uncertainty_us"}))
    return GpuFrame(g["gpu"], labels, vals, der, note, unc, fpw_sub=_sub(sub))


def _sub(sub: object) -> tuple[float | None, ...]:
    if sub is None:
        return ()
    if isinstance(sub, list) and len(sub) <= _MAX_SUB and (types := _number_types(sub, nullable=True)) is not None:
        return tuple(sub) if int not in types else tuple(None if x is None else float(x) for x in sub)
    raise FrameDecodeError("wrong_type", f"fpw_sub must be a list of at most {_MAX_SUB} numbers or nulls")


_NUMBER_TYPES: Final = frozenset({int, float})  # exactly: bool is an int subclass, and not a number here
_NONE: Final = type(None)


def _number_types(vs: Collection[Any], nullable: bool) -> set[type] | None:
    """The types of ``vs`` if every one is a finite number (or None, where ``nullable``), else None.

    In bulk with C-level builtins: a frames consumer checks ~40 per GPU frame; the per-item loops
    only name a fault.

    >>> _number_types([1, 2.5, None], nullable=True) == {int, float}, _number_types([1, None], nullable=False)
    (True, None)
    >>> _number_types([True], nullable=False), _number_types([float("nan")], nullable=True)
    (None, None)
    """
    types = set(map(type, vs))
    nums = vs
    if nullable and _NONE in types:
        types.discard(_NONE)
        nums = [v for v in vs if v is not None]
    return types if types <= _NUMBER_TYPES and all(map(math.isfinite, nums)) else None


def _numbers(obj: dict[str, Any], allowed: frozenset[str], nullable: bool) -> dict[str, Any]:
    """``obj``'s numbers as floats (None kept where ``nullable``)."""
    types = _number_types(obj.values(), nullable)
    if obj.keys() <= allowed and types is not None:
        return obj if int not in types else {k: (None if v is None else float(v)) for k, v in obj.items()}
    return {k: (None if v is None and nullable else _num(k, v, allowed)) for k, v in obj.items()}  # raises


def _num(name: str, v: object, allowed: frozenset[str]) -> float:
    if name not in allowed:
        raise FrameDecodeError("unknown_field", f"{name!r} is not a column of this object")
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise FrameDecodeError("wrong_type", f"{name} must be a finite number, got {v!r}")
    return float(v)


def frame_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one frames message, generated from the frame's columns;
    ``schemas/json/frame.v1.json`` is this, written out (a test keeps the two equal)."""
    number = {"type": "number"}
    labels = {k: {"type": "integer"} if k in INT_LABELS else {"type": "string"} for k in LABEL_COLUMNS}
    gpu = {
        "type": "object", "additionalProperties": False, "required": list(_GPU),
        "properties": {
            "gpu": {"type": "string", "minLength": 1, "description": "GPU index or UUID, or 'host'."},
            "id": {"type": "string", "pattern": "^[0-9a-f]{32}$",
                   "description": "SHA-256 of the compact JSON [node, gpu, tick_ns], first 32 hex digits."},
            "labels": {"type": "object", "additionalProperties": False, "properties": labels},
            "values": {"type": "object", "additionalProperties": False,
                       "properties": {c: number for c in VALUE_COLUMNS},
                       "description": "Sampled aggregates; a missing key is an empty cell."},
            "derived": {"type": "object", "additionalProperties": False, "required": list(DERIVED_COLUMNS),
                        "properties": {c: {"type": ["number", "null"]} for c in DERIVED_COLUMNS}},
            "note": {"type": "string", "pattern": f"^(({'|'.join(NOTE_CODES)})(,({'|'.join(NOTE_CODES)}))*)?$",
                     "description": "Why derived values are null, comma-separated; empty when none is."},
            "clock_uncertainty_us": {"type": "number", "minimum": 0},
            "fpw_sub": {"type": "array", "maxItems": _MAX_SUB, "items": {"type": ["number", "null"]},
                        "description": "Optional: the tick's FLOPS/W in 100 ms buckets, null where a bucket had "
                                       "no sample (what the drift rule times a hold by)."},
        },
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:flopwatch:schema:frames:v1",
        "title": "flopwatch frames message, version 1",
        "description": "One message of the flopwatch.frames topic: one node's aligned frames for one grid tick "
                       "(Kafka key = node, Kafka timestamp = tick in ms). A replay may repeat a message unchanged; "
                       "deduplicate by id.",
        "type": "object", "additionalProperties": False, "required": list(_TOP),
        "properties": {
            "v": {"const": FRAME_VERSION},
            "id": {"type": "string", "pattern": "^[0-9a-f]{32}$",
                   "description": "SHA-256 of the compact JSON [node, tick_ns], first 32 hex digits."},
            "node": {"type": "string", "minLength": 1},
            "tick_ns": {"type": "integer", "minimum": 0, "description": "Start of the grid cell, ns since the epoch."},
            "grid_ns": {"type": "integer", "minimum": 1},
            "gpus": {"type": "array", "items": gpu},
        },
    }
