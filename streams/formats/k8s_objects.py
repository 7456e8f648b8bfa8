"""Kubernetes API objects -> what flopwatch uses of them: a pod's node, workload, class and GPUs,
and the ``k8s.events`` record of a pod; the watch state machine is ``streams.formats.k8s_watch``.

Objects are the JSON dicts of the API server (``/api/v1/pods``, ``/api/v1/events``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import orjson

from schemas.records import K8sEvent

GPU_RESOURCE: Final = "nvidia.com/gpu"
_GPU_ID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")
_WORKLOAD_OWNERS: Final = frozenset({"ReplicaSet", "StatefulSet", "DaemonSet", "Job", "ReplicationController"})


@dataclass(frozen=True, slots=True)
class WatchParams:
    """Labels and bounds of the mapping; defaults suit most clusters."""

    workload_labels: tuple[str, ...] = ("app.kubernetes.io/name", "app")
    """First label present names the pod's workload; else its owner reference."""
    class_labels: tuple[str, ...] = ("flopwatch.io/class", "workload-class")
    gpu_id_annotations: tuple[str, ...] = ("flopwatch.io/gpus", "nvidia.com/gpu.ids", "hami.io/vgpu-devices-allocated")
    """Annotations a device plugin or webhook writes with the assigned GPU UUIDs or indices."""
    seen_max: int = 50_000
    """Dedupe ids remembered (and persisted); must exceed the events a relist can return."""
    pending_max_ns: int = 10 * 10**9
    """How long an event for a pod not yet bound to a node waits for the pod's node."""
    pending_max: int = 10_000
    tombstones_max: int = 4_096
    """Deleted pods kept so late events about them still find their node."""
    message_max: int = 4_096


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What flopwatch uses of a pod."""

    uid: str
    namespace: str
    name: str
    node: str
    workload: str
    klass: str
    gpus: tuple[str, ...]
    gpu_count: int

    def labels_json(self) -> str:
        return orjson.dumps({"workload": self.workload, "class": self.klass, "namespace": self.namespace,
                             "pod": self.name, "uid": self.uid, "gpu_count": self.gpu_count}).decode()


def parse_time_ns(text: object) -> int | None:
    """RFC 3339 as the API server writes it -> Unix ns; None when absent or unreadable.

    >>> parse_time_ns("2026-12-03T15:00:00Z"), parse_time_ns("2026-12-03T15:00:00.000001Z") % 10**9
    (1796310000000000000, 1000)
    """
    if not isinstance(text, str) or not text:
        return None
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    if dt.tzinfo is None:
        return None  # the API server always writes a zone; a naive time is not to be guessed
    return int(dt.timestamp()) * 10**9 + dt.microsecond * 1000


def metadata_of(obj: dict[str, Any]) -> dict[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def _quantity(text: object) -> int:
    """A GPU count quantity ("2", 2); extended resources are whole numbers."""
    try:
        return max(int(str(text)), 0)
    except ValueError:
        return 0


def gpu_ids(annotations: dict[str, Any], names: tuple[str, ...]) -> tuple[str, ...]:
    """GPU UUIDs (or, without any, indices) in the first of ``names`` that is set.

    >>> gpu_ids({"hami.io/vgpu-devices-allocated": "GPU-a1,NVIDIA,10240,100:GPU-b2,NVIDIA,10240,100:;"},
    ...         ("hami.io/vgpu-devices-allocated",))
    ('GPU-a1', 'GPU-b2')
    >>> gpu_ids({"flopwatch.io/gpus": "0, 3"}, ("flopwatch.io/gpus",))
    ('0', '3')
    """
    for name in names:
        raw = annotations.get(name)
        if not isinstance(raw, str) or not raw:
            continue
        tokens = [t for t in re.split(r"[\s,;:]+", raw) if t]
        uuids = [t for t in tokens if _GPU_ID.match(t)]
        picked = uuids or [t for t in tokens if t.isdigit()]
        return tuple(dict.fromkeys(picked))
    return ()


def workload_of(meta: dict[str, Any], labels: dict[str, Any], params: WatchParams) -> str:
    """The workload label, else the controlling owner (a ReplicaSet's Deployment name)."""
    for key in params.workload_labels:
        val = labels.get(key)
        if isinstance(val, str) and val:
            return val
    owners = meta.get("ownerReferences") or []
    for ref in owners:
        if isinstance(ref, dict) and ref.get("controller") and ref.get("kind") in _WORKLOAD_OWNERS:
            name = str(ref.get("name", ""))
            hash_ = labels.get("pod-template-hash")
            if ref["kind"] == "ReplicaSet" and isinstance(hash_, str) and name.endswith("-" + hash_):
                return name[: -len(hash_) - 1]  # the Deployment's name
            return name
    return ""


def pod_info(obj: dict[str, Any], params: WatchParams) -> PodInfo:
    meta = metadata_of(obj)
    labels = meta.get("labels") or {}
    spec = obj.get("spec") or {}
    count = 0
    for c in spec.get("containers") or []:
        res = (c or {}).get("resources") or {}
        # Extended resources need limits == requests; take the larger if a manifest differs.
        count += max(_quantity((res.get("limits") or {}).get(GPU_RESOURCE, 0)),
                     _quantity((res.get("requests") or {}).get(GPU_RESOURCE, 0)))
    klass = next((str(labels[k]) for k in params.class_labels if labels.get(k)), "")
    return PodInfo(str(meta.get("uid", "")), str(meta.get("namespace", "")), str(meta.get("name", "")),
                   str(spec.get("nodeName") or ""), workload_of(meta, labels, params), klass,
                   gpu_ids(meta.get("annotations") or {}, params.gpu_id_annotations), count)


def pod_record(p: PodInfo, reason: str, ts_ns: int) -> K8sEvent:
    return K8sEvent(p.node, ts_ns, "Normal", reason, "Pod", p.namespace, p.name, p.workload, p.gpus,
                    p.labels_json())
