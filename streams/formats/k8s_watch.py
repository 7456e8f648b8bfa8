"""The Kubernetes collector's pure logic: the list/watch resume state machine that publishes each
``k8s.events`` record exactly once (what a pod or an Event object maps to: ``streams.formats.k8s_objects``).

The collector (``agents/collect/k8s.py``) feeds every list response and watch event in
here and publishes what comes out; it keeps no state of its own. Objects are the JSON
dicts of the API server (``/api/v1/pods``, ``/api/v1/events``), so tests need no HTTP.

Identity of what was published (the *dedupe id*, sent as a Kafka header too):

- a core/v1 Event occurrence: ``event:<uid>:<count>`` (``series.count`` for new-style
  events, the object's resourceVersion when neither is set). An Event repeated by the
  kubelet is the same object with a higher count: a new occurrence. An update that does
  not change the count (a relist after ``410 Gone``, a managedFields edit) is not.
- a pod's labels as of a resourceVersion: ``pod:<uid>:<rv>``; a pod record is made
  only when what flopwatch uses of the pod (node, workload, class, GPUs) changed.
- a pod deletion: ``pod:<uid>:deleted``.

>>> st = WatchState(WatchParams())
>>> st.request("pods")
Request(resource='pods', resource_version=None)
>>> pod = {"metadata": {"uid": "u1", "name": "trainer-0", "namespace": "ml", "resourceVersion": "5",
...        "labels": {"app.kubernetes.io/name": "llm", "flopwatch.io/class": "training"}},
...        "spec": {"nodeName": "node-07", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}
>>> [(p.node, p.event.reason, p.event.workload, p.dedupe) for p in st.on_list("pods", [pod], "7", 0)]
[('node-07', 'PodLabels', 'llm', 'pod:u1:5')]
>>> st.on_list("pods", [pod], "9", 0)  # a relist of an unchanged pod publishes nothing
[]
>>> st.on_event("pods", "BOOKMARK", {"metadata": {"resourceVersion": "12"}}, 0).publish
[]
>>> st.request("pods")
Request(resource='pods', resource_version='12')
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from schemas.counters import Counters
from schemas.records import K8sEvent
from streams.formats.k8s_objects import PodInfo, WatchParams, metadata_of, parse_time_ns, pod_info, pod_record

Resource = Literal["pods", "events"]
RESOURCES: Final[tuple[Resource, ...]] = ("pods", "events")
GONE: Final = 410
SNAPSHOT_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class Request:
    """What to ask the API server next: a list (``resource_version`` None) or a watch from it."""

    resource: Resource
    resource_version: str | None


@dataclass(frozen=True, slots=True)
class Publish:
    """One record to send: Kafka key ``node``, value ``event``, header ``dedupe``."""

    node: str
    event: K8sEvent
    dedupe: str


@dataclass(frozen=True, slots=True)
class Step:
    """The outcome of one watch event: records to publish, and whether this watch must end
    (``relist``: the resourceVersion expired, list again; otherwise reconnect from it)."""

    publish: list[Publish]
    end_watch: bool = False
    relist: bool = False


@dataclass(slots=True)
class _Stats(Counters):
    published: int = 0
    duplicates: int = 0
    no_node: int = 0
    relists: int = 0
    counts: dict[str, int] = field(default_factory=dict)


class WatchState:
    """Both watches (pods, events), the pod cache and the dedupe ids; ``snapshot()`` is JSON."""

    def __init__(self, params: WatchParams, snapshot: dict[str, Any] | None = None) -> None:
        self.params = params
        self.rv: dict[str, str | None] = dict.fromkeys(RESOURCES)
        self.pods: dict[str, PodInfo] = {}  # by uid
        self._by_name: dict[tuple[str, str], str] = {}  # (namespace, name) -> uid
        self._tombstones: OrderedDict[tuple[str, str], PodInfo] = OrderedDict()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._pending: list[tuple[int, dict[str, Any]]] = []  # (deadline_ns, event object)
        self.stats = _Stats()
        if snapshot is not None:
            self._restore(snapshot)

    # -- what to do next -------------------------------------------------------------
    def request(self, resource: Resource) -> Request:
        return Request(resource, self.rv[resource])

    def on_gone(self, resource: Resource) -> None:
        """The watch answered HTTP 410: its resourceVersion is too old; list again."""
        self.rv[resource] = None
        self.stats.relists += 1

    # -- inputs ----------------------------------------------------------------------
    def on_list(self, resource: Resource, items: list[dict[str, Any]], list_rv: str, now_ns: int) -> list[Publish]:
        """A complete list (all pages) at ``list_rv``; the watch goes on from there."""
        out: list[Publish] = []
        if resource == "pods":
            listed = set()
            for obj in items:
                info = pod_info(obj, self.params)
                listed.add(info.uid)
                out += self._pod_changed(info, str(metadata_of(obj).get("resourceVersion", "")), now_ns)
            for uid in [u for u in self.pods if u not in listed]:  # deleted while we were not watching
                out += self._pod_deleted(self.pods[uid], now_ns)
            out += self._release_pending(now_ns)
        else:
            for obj in items:
                out += self._event(obj, now_ns)
        self.rv[resource] = list_rv
        return out

    def on_event(self, resource: Resource, kind: str, obj: dict[str, Any], now_ns: int) -> Step:
        """One watch event (``kind`` = ADDED, MODIFIED, DELETED, BOOKMARK or ERROR)."""
        if kind == "ERROR":
            if obj.get("code") == GONE:
                self.on_gone(resource)
                return Step([], end_watch=True, relist=True)
            return Step([], end_watch=True)  # reconnect from the last resourceVersion
        rv = metadata_of(obj).get("resourceVersion")
        out: list[Publish] = []
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            if resource == "pods":
                info = pod_info(obj, self.params)
                if kind == "DELETED":
                    known = self.pods.get(info.uid)
                    out = self._pod_deleted(known or info, now_ns)
                else:
                    out = self._pod_changed(info, str(rv or ""), now_ns) + self._release_pending(now_ns)
            elif kind != "DELETED":  # an Event expiring (its TTL) is not something that happened
                out = self._event(obj, now_ns)
        if isinstance(rv, str) and rv:  # BOOKMARKs carry nothing but this
            self.rv[resource] = rv
        return Step(out)

    def expire(self, now_ns: int) -> None:
        """Give up on pending events whose pod never got a node (counted as ``no_node``)."""
        keep = [(d, o) for d, o in self._pending if d > now_ns]
        self.stats.no_node += len(self._pending) - len(keep)
        self._pending = keep

    def mark_seen(self, dedupe_ids: list[str]) -> None:
        """Ids found on the topic after the last snapshot (a crash between send and save)."""
        for d in dedupe_ids:
            self._remember(d)

    # -- pods --------------------------------------------------------------------------
    def _pod_changed(self, info: PodInfo, rv: str, now_ns: int) -> list[Publish]:
        old = self.pods.get(info.uid)
        self.pods[info.uid] = info
        self._by_name[(info.namespace, info.name)] = info.uid
        if old == info or not info.node:
            return []  # nothing flopwatch uses changed, or not scheduled yet (no node to key on)
        return self._emit(f"pod:{info.uid}:{rv}", pod_record(info, "PodLabels", now_ns))

    def _pod_deleted(self, info: PodInfo, now_ns: int) -> list[Publish]:
        self.pods.pop(info.uid, None)
        key = (info.namespace, info.name)
        if self._by_name.get(key) == info.uid:
            del self._by_name[key]
        self._tombstones[key] = info
        while len(self._tombstones) > self.params.tombstones_max:
            self._tombstones.popitem(last=False)
        if not info.node:
            return []
        return self._emit(f"pod:{info.uid}:deleted", pod_record(info, "PodDeleted", now_ns))

    def _pod_named(self, namespace: str, name: str) -> PodInfo | None:
        uid = self._by_name.get((namespace, name))
        return self.pods.get(uid) if uid else self._tombstones.get((namespace, name))

    # -- events ------------------------------------------------------------------------
    def _event(self, obj: dict[str, Any], now_ns: int, pending_ok: bool = True) -> list[Publish]:
        meta = metadata_of(obj)
        series = obj.get("series") or {}
        occurrence = series.get("count") or obj.get("count") or f"rv{meta.get('resourceVersion', '')}"
        dedupe = f"event:{meta.get('uid', '')}:{occurrence}"
        if dedupe in self._seen:
            self.stats.duplicates += 1
            return []
        inv = obj.get("involvedObject") or obj.get("regarding") or {}
        kind, name = str(inv.get("kind", "")), str(inv.get("name", ""))
        namespace = str(inv.get("namespace") or meta.get("namespace") or "")
        pod = self._pod_named(namespace, name) if kind == "Pod" else None
        source = obj.get("source") or obj.get("deprecatedSource") or {}
        node = name if kind == "Node" else str(source.get("host") or "") or (pod.node if pod else "")
        if not node:
            if kind == "Pod" and pending_ok and len(self._pending) < self.params.pending_max:
                # The scheduler's events come before the pod watch shows the binding.
                self._pending.append((now_ns + self.params.pending_max_ns, obj))
            else:
                self.stats.no_node += 1
            return []
        ts = next((t for t in (parse_time_ns(obj.get(k)) for k in ("lastTimestamp", "eventTime", "firstTimestamp"))
                   if t is not None), None)
        ts = ts or parse_time_ns(series.get("lastObservedTime")) or parse_time_ns(meta.get("creationTimestamp"))
        workload = pod.workload if pod else (name if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job") else "")
        message = str(obj.get("message") or obj.get("note") or "")[: self.params.message_max]
        ev = K8sEvent(node, ts or now_ns, str(obj.get("type") or "Normal"), str(obj.get("reason") or "Unknown"),
                      kind, namespace, name if kind == "Pod" else "", workload, pod.gpus if pod else (), message)
        return self._emit(dedupe, ev)

    def _release_pending(self, now_ns: int) -> list[Publish]:
        if not self._pending:
            return []
        waiting, self._pending = self._pending, []
        out: list[Publish] = []
        for deadline, obj in waiting:
            inv = obj.get("involvedObject") or obj.get("regarding") or {}
            pod = self._pod_named(str(inv.get("namespace") or metadata_of(obj).get("namespace") or ""),
                                  str(inv.get("name", "")))
            if pod is not None and pod.node:
                out += self._event(obj, now_ns, pending_ok=False)
            else:
                self._pending.append((deadline, obj))
        return out

    # -- dedupe --------------------------------------------------------------------------
    def _emit(self, dedupe: str, ev: K8sEvent) -> list[Publish]:
        if dedupe in self._seen:
            self.stats.duplicates += 1
            return []
        self._remember(dedupe)
        self.stats.published += 1
        self.stats.counts[ev.reason] = self.stats.counts.get(ev.reason, 0) + 1
        return [Publish(ev.node, ev, dedupe)]

    def _remember(self, dedupe: str) -> None:
        self._seen[dedupe] = None
        self._seen.move_to_end(dedupe)
        while len(self._seen) > self.params.seen_max:
            self._seen.popitem(last=False)

    # -- persistence -------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        def pod(p: PodInfo) -> list[Any]:
            return [p.uid, p.namespace, p.name, p.node, p.workload, p.klass, list(p.gpus), p.gpu_count]

        return {"version": SNAPSHOT_VERSION, "resource_versions": dict(self.rv),
                "pods": [pod(p) for p in self.pods.values()], "tombstones": [pod(p) for p in self._tombstones.values()],
                "seen": list(self._seen), "pending": [[d, o] for d, o in self._pending]}

    def _restore(self, snap: dict[str, Any]) -> None:
        if snap.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"state version {snap.get('version')!r}, this collector reads {SNAPSHOT_VERSION}")

        def pod(row: list[Any]) -> PodInfo:
            uid, ns, name, node, workload, klass, gpus, count = row
            return PodInfo(uid, ns, name, node, workload, klass, tuple(gpus), count)

        for res in RESOURCES:
            self.rv[res] = snap.get("resource_versions", {}).get(res)
        for row in snap.get("pods", []):
            p = pod(row)
            self.pods[p.uid] = p
            self._by_name[(p.namespace, p.name)] = p.uid
        for row in snap.get("tombstones", []):
            p = pod(row)
            self._tombstones[(p.namespace, p.name)] = p
        self.mark_seen(list(snap.get("seen", [])))
        self._pending = [(int(d), o) for d, o in snap.get("pending", [])]
