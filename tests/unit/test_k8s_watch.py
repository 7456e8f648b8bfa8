"""The K8s collector's pure logic: mapping, dedupe, bookmarks, 410 relists, restarts."""

from __future__ import annotations

import doctest
import random
from typing import Any

import orjson

import streams.formats.k8s_objects
import streams.formats.k8s_watch
from schemas.codec import decode_k8s_event, encode_k8s_event
from schemas.records import K8sEvent
from streams.formats.k8s_objects import WatchParams, gpu_ids, parse_time_ns, pod_info, workload_of
from streams.formats.k8s_watch import Publish, WatchState

T0 = 1_796_310_000 * 10**9  # 2026-12-03T15:00:00Z


def pod(uid: str, name: str, node: str | None = "node-07", rv: str = "10", gpus: int = 2,
        labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)},
                                                                          "requests": {"cpu": "4"}}},
                                           {"name": "sidecar", "resources": {}}]}
    if node:
        spec["nodeName"] = node
    return {"kind": "Pod", "metadata": {"uid": uid, "name": name, "namespace": "ml", "resourceVersion": rv,
                                        "labels": labels if labels is not None else
                                        {"app.kubernetes.io/name": "llm", "flopwatch.io/class": "training"}, **meta},
            "spec": spec, "status": {"phase": "Running"}}


def event(uid: str, pod_name: str = "trainer-0", count: int | None = 1, rv: str = "20", host: str | None = None,
          kind: str = "Pod", reason: str = "OOMKilled", type_: str = "Warning") -> dict[str, Any]:
    obj: dict[str, Any] = {"kind": "Event", "metadata": {"uid": uid, "name": f"{pod_name}.{uid}", "namespace": "ml",
                                                         "resourceVersion": rv},
                           "involvedObject": {"kind": kind, "name": pod_name, "namespace": "ml"},
                           "reason": reason, "type": type_, "message": "container main was OOM killed",
                           "firstTimestamp": "2026-12-03T15:00:00Z", "lastTimestamp": "2026-12-03T15:00:05Z"}
    if count is not None:
        obj["count"] = count
    if host:
        obj["source"] = {"component": "kubelet", "host": host}
    return obj


def ids(pubs: list[Publish]) -> list[str]:
    return [p.dedupe for p in pubs]


def test_doctests_pass() -> None:
    for module in (streams.formats.k8s_watch, streams.formats.k8s_objects):
        result = doctest.testmod(module, report=True)
        assert result.attempted > 0 and result.failed == 0


def test_event_of_a_known_pod_maps_to_the_wire_format() -> None:
    st = WatchState(WatchParams())
    st.on_list("pods", [pod("p1", "trainer-0", annotations={"flopwatch.io/gpus": "GPU-aa,GPU-bb"})], "11", T0)
    [out] = st.on_list("events", [event("e1")], "21", T0)
    assert out.node == "node-07" and out.dedupe == "event:e1:1"
    assert out.event == K8sEvent("node-07", T0 + 5 * 10**9, "Warning", "OOMKilled", "Pod", "ml", "trainer-0", "llm",
                                 ("GPU-aa", "GPU-bb"), "container main was OOM killed")
    assert decode_k8s_event(encode_k8s_event(out.event)) == out.event


def test_pod_records_carry_workload_class_and_gpus() -> None:
    st = WatchState(WatchParams())
    [out] = st.on_list("pods", [pod("p1", "trainer-0")], "11", T0)
    assert (out.event.reason, out.event.kind, out.event.pod, out.event.workload) == ("PodLabels", "Pod", "trainer-0", "llm")
    assert orjson.loads(out.event.message) == {"workload": "llm", "class": "training", "namespace": "ml",
                                               "pod": "trainer-0", "uid": "p1", "gpu_count": 2}
    assert isinstance(decode_k8s_event(encode_k8s_event(out.event)), K8sEvent)


def test_workload_from_owner_references() -> None:
    p = WatchParams()
    rs = {"ownerReferences": [{"kind": "ReplicaSet", "name": "chat-7d9f8c6b5", "controller": True}]}
    assert workload_of(rs, {"pod-template-hash": "7d9f8c6b5"}, p) == "chat"
    sts = {"ownerReferences": [{"kind": "StatefulSet", "name": "trainer", "controller": True}]}
    assert workload_of(sts, {}, p) == "trainer"
    assert workload_of({}, {"app": "x"}, p) == "x"
    assert workload_of({"ownerReferences": [{"kind": "Node", "name": "n", "controller": True}]}, {}, p) == ""


def test_gpu_count_takes_requests_or_limits_and_ids_from_annotations() -> None:
    obj = pod("p1", "a", gpus=0)
    obj["spec"]["containers"][1]["resources"] = {"requests": {"nvidia.com/gpu": 3}}
    info = pod_info(obj, WatchParams())
    assert info.gpu_count == 3 and info.gpus == ()
    assert gpu_ids({"nvidia.com/gpu.ids": "MIG-1a2b;MIG-3c4d"}, WatchParams().gpu_id_annotations) == ("MIG-1a2b", "MIG-3c4d")
    assert gpu_ids({"flopwatch.io/gpus": "junk"}, ("flopwatch.io/gpus",)) == ()


def test_node_from_source_host_node_object_or_skipped() -> None:
    st = WatchState(WatchParams())
    [a] = st.on_list("events", [event("e1", pod_name="other", host="node-03")], "21", T0)
    assert a.node == "node-03" and a.event.workload == ""  # an unknown pod: node from the kubelet's source
    [b] = st.on_event("events", "ADDED", event("e2", pod_name="node-05", kind="Node", reason="NodeNotReady"), T0).publish
    assert b.node == "node-05" and b.event.pod == ""
    dep = event("e3", pod_name="chat", kind="Deployment", reason="ScalingReplicaSet")
    assert st.on_event("events", "ADDED", dep, T0).publish == []
    assert st.stats.no_node == 1


def test_event_waits_for_its_pod_to_be_bound() -> None:
    st = WatchState(WatchParams(pending_max_ns=10**9))
    st.on_list("pods", [pod("p1", "trainer-0", node=None)], "11", T0)
    assert st.on_event("events", "ADDED", event("e1", reason="Scheduled", type_="Normal"), T0).publish == []
    out = st.on_event("pods", "MODIFIED", pod("p1", "trainer-0", rv="12"), T0).publish
    assert [(p.event.reason, p.node) for p in out] == [("PodLabels", "node-07"), ("Scheduled", "node-07")]
    st.on_event("events", "ADDED", event("e2", pod_name="never"), T0)
    st.expire(T0 + 2 * 10**9)
    assert st.stats.no_node == 1 and st.snapshot()["pending"] == []


def test_repeats_publish_once_per_occurrence() -> None:
    st = WatchState(WatchParams())
    st.on_list("pods", [pod("p1", "trainer-0")], "11", T0)
    assert ids(st.on_event("events", "ADDED", event("e1", rv="21"), T0).publish) == ["event:e1:1"]
    assert st.on_event("events", "MODIFIED", event("e1", rv="22"), T0).publish == []  # same count
    assert ids(st.on_event("events", "MODIFIED", event("e1", count=2, rv="23"), T0).publish) == ["event:e1:2"]
    assert st.on_event("events", "DELETED", event("e1", count=2, rv="24"), T0).publish == []  # TTL expiry
    series = event("e9", count=None, rv="25")
    series["series"] = {"count": 4, "lastObservedTime": "2026-12-03T15:00:09.000000Z"}
    assert ids(st.on_event("events", "ADDED", series, T0).publish) == ["event:e9:4"]
    assert ids(st.on_event("events", "ADDED", event("e8", count=None, rv="26"), T0).publish) == ["event:e8:rv26"]


def test_pod_changes_flopwatch_does_not_use_publish_nothing() -> None:
    st = WatchState(WatchParams())
    st.on_list("pods", [pod("p1", "trainer-0")], "11", T0)
    status_only = pod("p1", "trainer-0", rv="12")
    status_only["status"] = {"phase": "Succeeded"}
    assert st.on_event("pods", "MODIFIED", status_only, T0).publish == []
    relabel = pod("p1", "trainer-0", rv="13", labels={"app.kubernetes.io/name": "llm", "flopwatch.io/class": "batch"})
    [out] = st.on_event("pods", "MODIFIED", relabel, T0).publish
    assert out.dedupe == "pod:p1:13" and orjson.loads(out.event.message)["class"] == "batch"
    [gone] = st.on_event("pods", "DELETED", pod("p1", "trainer-0", rv="14"), T0).publish
    assert (gone.event.reason, gone.dedupe) == ("PodDeleted", "pod:p1:deleted")
    # an event about the pod after its deletion still finds its node (tombstone)
    assert st.on_event("events", "ADDED", event("e1"), T0).publish[0].node == "node-07"


def test_bookmark_advances_and_errors_end_the_watch() -> None:
    st = WatchState(WatchParams())
    st.on_list("events", [], "21", T0)
    assert st.on_event("events", "BOOKMARK", {"kind": "Event", "metadata": {"resourceVersion": "90"}}, T0).publish == []
    assert st.request("events").resource_version == "90"
    step = st.on_event("events", "ERROR", {"kind": "Status", "code": 500, "reason": "InternalError"}, T0)
    assert step.end_watch and not step.relist and st.request("events").resource_version == "90"
    step = st.on_event("events", "ERROR", {"kind": "Status", "code": 410, "reason": "Expired"}, T0)
    assert step.end_watch and step.relist and st.request("events").resource_version is None
    assert st.stats.relists == 1


def test_relist_after_gone_publishes_only_what_is_new_and_deletions() -> None:
    st = WatchState(WatchParams())
    st.on_list("pods", [pod("p1", "trainer-0"), pod("p2", "trainer-1", node="node-08")], "11", T0)
    st.on_list("events", [event("e1", rv="21")], "21", T0)
    st.on_gone("pods")
    st.on_gone("events")
    # meanwhile: p2 deleted, p3 created, e1 repeated, e2 new, e1's list copy unchanged elsewhere
    out = st.on_list("pods", [pod("p1", "trainer-0"), pod("p3", "trainer-2", rv="30")], "31", T0)
    assert sorted(ids(out)) == ["pod:p2:deleted", "pod:p3:30"]
    out = st.on_list("events", [event("e1", count=3, rv="32"), event("e2", rv="33")], "33", T0)
    assert sorted(ids(out)) == ["event:e1:3", "event:e2:1"]
    assert st.on_list("events", [event("e1", count=3, rv="32"), event("e2", rv="33")], "34", T0) == []


def test_restart_from_a_snapshot_resumes_without_duplicates() -> None:
    st = WatchState(WatchParams())
    st.on_list("pods", [pod("p1", "trainer-0")], "11", T0)
    st.on_list("events", [event("e1", rv="21")], "21", T0)
    snap = orjson.loads(orjson.dumps(st.snapshot()))  # as the state file holds it
    # sent after the snapshot, then killed before the next save
    sent_after = st.on_event("events", "ADDED", event("e2", rv="22"), T0).publish
    sent_after += st.on_event("pods", "MODIFIED", pod("p1", "trainer-0", rv="23", labels={"app": "x"}), T0).publish
    again = WatchState(WatchParams(), snap)
    assert again.request("events").resource_version == "21" and again.request("pods").resource_version == "11"
    again.mark_seen(ids(sent_after))  # read back from the topic
    assert again.on_event("events", "ADDED", event("e2", rv="22"), T0).publish == []
    assert again.on_event("pods", "MODIFIED", pod("p1", "trainer-0", rv="23", labels={"app": "x"}), T0).publish == []
    assert again.pods["p1"].workload == "x"  # the cache moved on even though nothing was sent
    assert ids(again.on_event("events", "ADDED", event("e3", rv="24"), T0).publish) == ["event:e3:1"]


def test_seen_ids_are_bounded() -> None:
    st = WatchState(WatchParams(seen_max=3, pending_max=0))
    for i in range(5):
        st.on_event("events", "ADDED", event(f"e{i}", host="n1", rv=str(i)), T0)
    assert st.snapshot()["seen"] == ["event:e2:1", "event:e3:1", "event:e4:1"]


def test_parse_time_ns_refuses_naive_and_bad_times() -> None:
    assert parse_time_ns("2026-12-03T15:00:00") is None
    assert parse_time_ns("yesterday") is None and parse_time_ns(None) is None
    assert parse_time_ns("2026-12-03T15:00:00+00:00") == T0


def test_random_drops_gones_and_restarts_publish_each_occurrence_once() -> None:
    """A history of event occurrences consumed through random reconnects, 410 relists and restarts
    (each from the last snapshot, with the ids sent since read back): no id twice, none missing
    among those a watch delivered or the final list holds."""
    for seed in range(30):
        rnd = random.Random(seed)
        history: list[tuple[int, dict[str, Any]]] = []  # (rv, event object) in version order
        counts: dict[str, int] = {}
        for rv in range(100, 160):
            uid = f"e{rnd.randrange(12)}"
            counts[uid] = counts.get(uid, 0) + 1
            history.append((rv, event(uid, count=counts[uid], rv=str(rv), host="n1")))
        st = WatchState(WatchParams())
        sent: list[str] = []
        snap, sent_at_snap = st.snapshot(), 0
        pos = 0  # index into history: what the "server" has reached
        while pos < len(history):
            req = st.request("events")
            if req.resource_version is None:  # a relist at the server's current version
                pos = min(len(history), pos + rnd.randrange(4))
                latest: dict[str, dict[str, Any]] = {}
                for _, obj in history[:pos]:
                    latest[obj["metadata"]["uid"]] = obj
                sent += ids(st.on_list("events", list(latest.values()), str(history[pos - 1][0] if pos else 99), T0))
                continue
            start = next(i for i, (rv, _) in enumerate(history) if rv > int(req.resource_version)) \
                if int(req.resource_version) < history[-1][0] else len(history)
            for rv, obj in history[start:start + rnd.randrange(1, 8)]:
                sent += ids(st.on_event("events", "ADDED" if obj["count"] == 1 else "MODIFIED", obj, T0).publish)
                pos = max(pos, history.index((rv, obj)) + 1)
            roll = rnd.random()
            if roll < 0.2:
                st.on_gone("events")
            elif roll < 0.35:  # killed: back to the last save, plus what the topic holds since
                st = WatchState(WatchParams(), orjson.loads(orjson.dumps(snap)))
                st.mark_seen(sent[sent_at_snap:])
            elif roll < 0.6:
                snap, sent_at_snap = st.snapshot(), len(sent)
        assert len(sent) == len(set(sent)), f"seed {seed}: duplicates"
        final = {f"event:{o['metadata']['uid']}:{o['count']}" for _, o in history if o["count"] == counts[o["metadata"]["uid"]]}
        assert final <= set(sent), f"seed {seed}: missing {sorted(final - set(sent))}"
