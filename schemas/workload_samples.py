"""The ``flopwatch.workloads`` contract: one node's frame for one tick, summarised per workload.

Frames are keyed by node, but a scaling decision is about a workload, which spans
nodes. The detection agent, which sees each node's frames in order and knows which
of its GPUs are spiking or drifting, publishes one summary per (workload, node, tick)
keyed by ``"<namespace>/<workload>"``; the decision agent reads them per workload. A
node whose frame no longer holds a workload it held on its previous tick sends one
summary with ``present = false`` (the workload left the node: not a stale node).

Summaries are deterministic functions of the frames and the detector state, so a
replay publishes the same bytes again; the decision engine ignores a (workload, node)
tick it has already seen.

>>> s = WorkloadSample("serving", "chat", "inference", "node-1", 1_000_000_000, 1_000_000_000, 4,
...                    ("chat-0", "chat-1"), 0.5, 0.1, None, 80.0, 900.0, False, ())
>>> decode_workload_sample(encode_workload_sample(s)) == s
True
>>> s.key
b'serving/chat'

Two fields came later and may be absent from a message (they default): ``power_w`` and
``drift_detail``, the figures behind each drifting GPU, which a ``rebalance`` states.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Final

import orjson

WORKLOAD_SAMPLE_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class DriftDetail:
    """One GPU's open efficiency drift, as confirmed: what a ``rebalance`` trigger states."""

    gpu: str
    value: float  # FLOPS/W at the confirming tick
    baseline: float  # what this GPU achieved at the same load (FLOPS/W)
    load_w: float | None  # the power it was judged at; None: judged without its power
    band_lo_w: float | None = None  # the healthy loads (powers) the baseline was read between
    band_hi_w: float | None = None


class WorkloadSampleDecodeError(ValueError):
    """Not a valid v1 workload summary."""


@dataclass(frozen=True, slots=True)
class WorkloadSample:
    namespace: str
    workload: str
    workload_class: str
    node: str
    tick_ns: int
    grid_ns: int
    gpus: int  # the workload's GPUs on this node that reported at this tick
    pods: tuple[str, ...]  # sorted pod names
    sm_active: float | None  # mean over the GPUs, 0-1
    pcie_util: float | None  # mean over the GPUs of max(tx, rx) / link capacity, 0-1
    nccl_ms: float | None  # highest mean AllReduce latency of a GPU, ms
    latency_ms: float | None  # highest request latency (p99 per tick) of a GPU, ms
    qps: float | None  # requests/s summed over the GPUs
    spike: bool  # an L1 spike on one of the GPUs at this tick
    drift: tuple[str, ...]  # GPUs with a confirmed efficiency drift open
    present: bool = True
    power_w: float | None = None  # mean power over the GPUs, W
    drift_detail: tuple[DriftDetail, ...] = ()  # for each GPU of ``drift``, by GPU

    @property
    def key(self) -> bytes:
        return f"{self.namespace}/{self.workload}".encode()


_FIELDS: Final = tuple(f.name for f in dataclasses.fields(WorkloadSample))
LATER_FIELDS: Final = ("power_w", "drift_detail")  # may be missing: written since the load-conditioned drift
REQUIRED_FIELDS: Final = tuple(n for n in _FIELDS if n not in LATER_FIELDS)
_OPTIONAL: Final = ("sm_active", "pcie_util", "nccl_ms", "latency_ms", "qps", "power_w")


def encode_workload_sample(s: WorkloadSample) -> bytes:
    d: dict[str, Any] = {"v": WORKLOAD_SAMPLE_VERSION}
    for name in _FIELDS:
        d[name] = getattr(s, name)
    d["pods"], d["drift"] = list(s.pods), list(s.drift)
    d["drift_detail"] = [dataclasses.asdict(x) for x in s.drift_detail]
    return orjson.dumps(d, option=orjson.OPT_SORT_KEYS)


def decode_workload_sample(data: bytes) -> WorkloadSample:
    """Parse and check one summary; raises ``WorkloadSampleDecodeError`` naming the fault."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise WorkloadSampleDecodeError(f"malformed_json: {exc}") from None
    if not isinstance(obj, dict) or obj.get("v") != WORKLOAD_SAMPLE_VERSION:
        raise WorkloadSampleDecodeError("unknown_version: expected an object with v = 1")
    missing = [n for n in REQUIRED_FIELDS if n not in obj]
    if missing:
        raise WorkloadSampleDecodeError(f"missing_field: {', '.join(missing)}")
    for name in ("namespace", "workload", "workload_class", "node"):
        if not isinstance(obj[name], str) or not obj[name]:
            raise WorkloadSampleDecodeError(f"wrong_type: {name} must be a non-empty string")
    for name in ("tick_ns", "grid_ns", "gpus"):
        if type(obj[name]) is not int or obj[name] < 0:
            raise WorkloadSampleDecodeError(f"wrong_type: {name} must be a non-negative integer")
    if obj["grid_ns"] == 0:
        raise WorkloadSampleDecodeError("out_of_range: grid_ns must be greater than 0")
    obj.setdefault("power_w", None)
    obj["drift_detail"] = _details(obj.get("drift_detail", []))
    for name in _OPTIONAL:
        v = obj[name]
        if v is not None and (type(v) not in (int, float) or not math.isfinite(v) or v < 0):
            raise WorkloadSampleDecodeError(f"wrong_type: {name} must be a non-negative number or null")
        obj[name] = None if v is None else float(v)
    for name in ("pods", "drift"):
        if not isinstance(obj[name], list) or not all(isinstance(p, str) for p in obj[name]):
            raise WorkloadSampleDecodeError(f"wrong_type: {name} must be a list of strings")
        obj[name] = tuple(obj[name])
    for name in ("spike", "present"):
        if type(obj[name]) is not bool:
            raise WorkloadSampleDecodeError(f"wrong_type: {name} must be a boolean")
    return WorkloadSample(**{n: obj[n] for n in _FIELDS})


def _details(raw: object) -> tuple[DriftDetail, ...]:
    def number(x: object) -> bool:
        return type(x) in (int, float) and math.isfinite(x)  # type: ignore[arg-type]

    if not isinstance(raw, list):
        raise WorkloadSampleDecodeError("wrong_type: drift_detail must be a list")
    def maybe(x: object) -> float | None:
        return None if x is None else float(x)  # type: ignore[arg-type]

    out = []
    for d in raw:
        if (not isinstance(d, dict) or not {"gpu", "value", "baseline", "load_w"} <= set(d) <= _DETAIL_KEYS
                or not isinstance(d["gpu"], str) or not number(d["value"]) or not number(d["baseline"])
                or not all(d.get(k) is None or number(d[k]) for k in ("load_w", "band_lo_w", "band_hi_w"))):
            raise WorkloadSampleDecodeError("wrong_type: drift_detail items must be {gpu, value, baseline, load_w"
                                            "[, band_lo_w, band_hi_w]}")
        out.append(DriftDetail(d["gpu"], float(d["value"]), float(d["baseline"]), maybe(d["load_w"]),
                               maybe(d.get("band_lo_w")), maybe(d.get("band_hi_w"))))
    return tuple(out)


_DETAIL_KEYS: Final = frozenset(f.name for f in dataclasses.fields(DriftDetail))
