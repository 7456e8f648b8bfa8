"""Workload labels from the Kubernetes collector, for samples whose producer does not know them.

An NVML collector sees GPUs and processes, not Deployments: its samples carry no
``workload`` or ``class``. ``flopwatch collect k8s`` publishes a ``PodLabels`` record on
``k8s.events`` whenever what flopwatch uses of a pod changes (and ``PodDeleted`` when it
goes), with the pod's node, GPUs (when the device plugin says which) and, in ``message``,
its workload, class and GPU count. The ingest feeds those records here, and fills the
labels of each sample it places from them, so frames carry the workload and class the
decision engine works with. A label the producer did send always wins.

Which pod a GPU belongs to: the pod whose record lists that GPU (UUID or index); failing
that, the pod named by the sample's own ``pod`` label (a name, or the pod UID that
``flopwatch collect nvml`` reads from a process's cgroup; a sample's UID is then replaced
by the pod's name). Nothing else: guessing "the only GPU pod on the node" would credit its
idle neighbours to it.

>>> book = PodLabelBook()
>>> ev = K8sEvent("n1", 1, "Normal", "PodLabels", "Pod", "serving", "chat-0", "chat", ("GPU-1",),
...               '{"workload": "chat", "class": "inference", "namespace": "serving", "pod": "chat-0", '
...               '"gpu_count": 1}')
>>> book.on_event(ev)
True
>>> book.fill("n1", "GPU-1", {"gpu_model": "H100"})
{'gpu_model': 'H100', 'namespace': 'serving', 'pod': 'chat-0', 'workload': 'chat', 'class': 'inference'}
>>> book.fill("n1", "GPU-1", {"workload": "mine"})["workload"]
'mine'
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

import orjson

from schemas.records import K8sEvent, Labels

POD_LABELS: Final = "PodLabels"
POD_DELETED: Final = "PodDeleted"


@dataclass(frozen=True, slots=True)
class _Pod:
    labels: Labels  # namespace, pod, workload, class: what fills a sample's missing labels
    gpus: tuple[str, ...]
    gpu_count: int
    uid: str = ""


class PodLabelBook:
    """Pods per node, bounded (the least recently updated nodes go first)."""

    def __init__(self, max_nodes: int = 100_000) -> None:
        self.max_nodes = max_nodes
        self._nodes: OrderedDict[str, dict[tuple[str, str], _Pod]] = OrderedDict()

    def on_event(self, ev: K8sEvent) -> bool:
        """Take a ``PodLabels`` / ``PodDeleted`` record; whether it was one."""
        if ev.reason not in (POD_LABELS, POD_DELETED) or not ev.pod:
            return False
        pods = self._nodes.setdefault(ev.node, {})
        self._nodes.move_to_end(ev.node)
        key = (ev.namespace, ev.pod)
        if ev.reason == POD_DELETED:
            pods.pop(key, None)
            return True
        try:
            doc = orjson.loads(ev.message) if ev.message else {}
        except orjson.JSONDecodeError:
            doc = {}
        doc = doc if isinstance(doc, dict) else {}
        labels: Labels = {"namespace": ev.namespace, "pod": ev.pod}
        workload = doc.get("workload") or ev.workload
        if isinstance(workload, str) and workload:
            labels["workload"] = workload
        klass = doc.get("class")
        if isinstance(klass, str) and klass:
            labels["class"] = klass
        count = doc.get("gpu_count")
        uid = doc.get("uid")
        pods[key] = _Pod(labels, tuple(ev.gpus), count if isinstance(count, int) else len(ev.gpus),
                         uid if isinstance(uid, str) else "")
        if len(self._nodes) > self.max_nodes:
            self._nodes.popitem(last=False)
        return True

    def has(self, node: str) -> bool:
        return bool(self._nodes.get(node))

    @property
    def known(self) -> bool:
        """Whether any node's pods are known (until then every ``filled`` is a no-op)."""
        return bool(self._nodes)

    def filled(self, node: str, gpu: str, labels: Labels | None) -> Labels | None:
        """``fill`` for a sample message's labels, which may be absent: the same object when nothing is added."""
        if not self.has(node):
            return labels
        given = labels or {}
        got = self.fill(node, gpu, given)
        return labels if got is given else got

    def fill(self, node: str, gpu: str, labels: Labels) -> Labels:
        """``labels`` with the GPU's pod's labels added where missing (the same object when nothing is known)."""
        pods = self._nodes.get(node)
        if not pods:
            return labels
        pod = self._pod_of(pods, gpu, labels)
        if pod is None:
            return labels
        missing = {k: v for k, v in pod.labels.items() if k not in labels}
        if pod.uid and labels.get("pod") == pod.uid:
            missing["pod"] = pod.labels["pod"]  # the name people query by
        return {**labels, **missing} if missing else labels

    @staticmethod
    def _pod_of(pods: dict[tuple[str, str], _Pod], gpu: str, labels: Labels) -> _Pod | None:
        for p in pods.values():
            if gpu in p.gpus:
                return p
        name = labels.get("pod")  # a name, or the pod UID an NVML collector reads from the cgroup
        if name:
            for (_, pod_name), p in pods.items():
                if name in (pod_name, p.uid):
                    return p
        # No guess from "the only GPU pod on the node": its idle neighbours would be credited to it.
        return None
