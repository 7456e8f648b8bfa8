"""``flopwatch collect k8s`` against a local API server double (tests/k8s_fake_apiserver.py) and
real Kafka: bookmarks, a dropped watch connection, a SIGKILL, a 410 Gone (as an ERROR
event and as HTTP 410), and every expected record on k8s.events exactly once."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from agents.kafka.topics import Topics, confluent_config
from agents.settings import Settings, settings_env
from schemas.codec import decode_k8s_event
from schemas.records import K8sEvent
from tests.k8s_fake_apiserver import FakeApiServer, FakeCluster

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def pod(uid: str, name: str, node: str | None, gpus: int, labels: dict[str, str], **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x",
                                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"uid": uid, "name": name, "namespace": "ml", "labels": labels, **meta}, "spec": spec,
            "status": {"phase": "Running" if node else "Pending"}}


def event(uid: str, involved: tuple[str, str], reason: str, count: int = 1, host: str | None = None,
          type_: str = "Warning") -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"uid": uid, "name": f"{involved[1]}.{uid}", "namespace": "ml"},
                           "involvedObject": {"kind": involved[0], "name": involved[1], "namespace": "ml"},
                           "reason": reason, "type": type_, "message": f"{reason} #{count}", "count": count,
                           "firstTimestamp": "2026-12-03T15:00:00Z", "lastTimestamp": f"2026-12-03T15:00:{count:02d}Z"}
    if host:
        obj["source"] = {"component": "kubelet", "host": host}
    return obj


class Collector:
    """The collector as a subprocess (``python -m agents.collect.k8s``), its log in a file."""

    def __init__(self, settings: Settings, kubeconfig: Path, state: Path, log: Path) -> None:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLOPWATCH_")}, **settings_env(settings)}
        self.log = log
        self._fh = open(log, "ab")  # noqa: SIM115  (closed in stop/kill)
        self.proc = subprocess.Popen([sys.executable, "-m", "agents.collect.k8s", "--kubeconfig", str(kubeconfig),
                                      "--state", str(state)], env=env, cwd=ROOT, stdout=self._fh,
                                     stderr=subprocess.STDOUT)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._fh.close()

    def stop(self) -> dict[str, Any]:
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(60)
        finally:
            self.proc.kill()
            self._fh.close()
        text = self.log.read_text()
        assert rc == 0, text[-4000:]
        last = [ln for ln in text.splitlines() if ln.startswith('{"event":"k8s_collector_stopped"')]
        assert last, text[-4000:]
        out: dict[str, Any] = orjson.loads(last[-1])
        return out


def read_topic(settings: Settings) -> list[tuple[str, bytes, str]]:
    """(key, value, dedupe id) of every message on k8s.events, oldest first per partition."""
    topic = Topics(settings.topic_prefix).k8s_events
    c = Consumer(confluent_config(settings) | {"group.id": "test-read", "enable.auto.commit": False,
                                               "enable.partition.eof": True})
    try:
        parts = sorted(c.list_topics(topic, timeout=30).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        todo, out = set(parts), []
        deadline = time.monotonic() + 30
        while todo and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                todo.discard(msg.partition())
                continue
            raw = dict(msg.headers() or {}).get("flopwatch.k8s.id")
            dedupe = raw.decode() if isinstance(raw, bytes) else str(raw)
            out.append(((msg.key() or b"").decode(), msg.value() or b"", dedupe))
        assert not todo, f"partitions {todo} not read to the end"
        return out
    finally:
        c.close()


def wait_for_ids(settings: Settings, want: set[str], collector: Collector, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    got: set[str] = set()
    while time.monotonic() < deadline:
        got = {d for _, _, d in read_topic(settings)}
        if want <= got:
            return
        assert collector.proc.poll() is None, collector.log.read_text()[-4000:]
        time.sleep(0.3)
    raise AssertionError(f"missing {sorted(want - got)}; collector log:\n{collector.log.read_text()[-4000:]}")


def test_collector_publishes_each_event_once_across_drops_kills_and_gone(base_settings: Settings,
                                                                         tmp_path: Path) -> None:
    cluster = FakeCluster(bookmark_s=0.3)
    gpu_ids = {"flopwatch.io/gpus": "GPU-aaaa,GPU-bbbb"}
    with FakeApiServer(cluster) as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        state = tmp_path / "state" / "k8s.json"
        rv: dict[str, str] = {}

        def put(resource: str, type_: str, obj: dict[str, Any]) -> str:
            out = cluster.apply(resource, type_, obj)
            rv[out["metadata"]["uid"]] = out["metadata"]["resourceVersion"]
            return str(out["metadata"]["resourceVersion"])

        trainer = pod("p1", "trainer-0", "node-01", 2, {"app.kubernetes.io/name": "llm", "flopwatch.io/class": "training"},
                      annotations=gpu_ids)
        chat = pod("p2", "chat-7d9f8c6b5-x2x", "node-02", 1, {"pod-template-hash": "7d9f8c6b5"},
                   ownerReferences=[{"kind": "ReplicaSet", "name": "chat-7d9f8c6b5", "controller": True}])
        batch = pod("p3", "batch-0", None, 1, {"app": "batch"})
        for p in (trainer, chat, batch):
            put("pods", "ADDED", p)
        put("events", "ADDED", event("e1", ("Pod", "trainer-0"), "OOMKilled", host="node-01"))
        put("events", "ADDED", event("e2", ("Pod", "chat-7d9f8c6b5-x2x"), "Scheduled", type_="Normal"))
        put("events", "ADDED", event("e3", ("Node", "node-03"), "NodeNotReady"))
        want = {f"pod:p1:{rv['p1']}", f"pod:p2:{rv['p2']}", "event:e1:1", "event:e2:1", "event:e3:1"}

        # 1. a first run: the lists, then watches; the events watch is cut after one event
        a = Collector(base_settings, kubeconfig, state, tmp_path / "a.log")
        wait_for_ids(base_settings, want, a)
        cluster.drop_watch("events", after=1)
        put("events", "MODIFIED", event("e1", ("Pod", "trainer-0"), "OOMKilled", count=2, host="node-01"))
        put("events", "ADDED", event("e4", ("Pod", "trainer-0"), "XidError", host="node-01"))
        batch["spec"]["nodeName"] = "node-03"
        put("pods", "MODIFIED", batch)
        put("events", "ADDED", event("e5", ("Pod", "batch-0"), "Scheduled", type_="Normal"))  # node via the pod
        chat["metadata"]["labels"]["flopwatch.io/class"] = "inference"
        put("pods", "MODIFIED", chat)
        status_only = dict(trainer, status={"phase": "Running", "podIP": "10.0.0.7"})
        put("pods", "MODIFIED", status_only)  # nothing flopwatch uses: no record
        want |= {"event:e1:2", "event:e4:1", f"pod:p3:{rv['p3']}", "event:e5:1", f"pod:p2:{rv['p2']}"}
        wait_for_ids(base_settings, want, a)
        a.kill()  # maybe before its last save: the restart must find what it sent since

        # 2. while it is down: changes, then the versions it knows are compacted (410 on its watch)
        put("events", "ADDED", event("e6", ("Pod", "chat-7d9f8c6b5-x2x"), "BackOff", host="node-02"))
        put("events", "MODIFIED", event("e4", ("Pod", "trainer-0"), "XidError", count=2, host="node-01"))
        put("pods", "DELETED", status_only)
        cluster.compact()
        want |= {"event:e6:1", "event:e4:2", "pod:p1:deleted"}
        b = Collector(base_settings, kubeconfig, state, tmp_path / "b.log")
        wait_for_ids(base_settings, want, b)
        put("events", "ADDED", event("e7", ("Pod", "trainer-0"), "Killing", host="node-01"))  # after the relist
        want.add("event:e7:1")
        wait_for_ids(base_settings, want, b)
        stats_b = b.stop()

        # 3. a clean restart whose resourceVersion is gone as an HTTP 410
        cluster.gone_as_http = True
        put("events", "ADDED", event("e8", ("Pod", "batch-0"), "Started", type_="Normal", host="node-03"))
        cluster.compact()
        c = Collector(base_settings, kubeconfig, state, tmp_path / "c.log")
        want.add("event:e8:1")
        wait_for_ids(base_settings, want, c)
        last_pod_rv = put("pods", "MODIFIED", dict(batch, status={"phase": "Succeeded"}))  # nothing to publish
        time.sleep(1.5)  # bookmarks carry the events watch past the pod change; a save follows
        stats_c = c.stop()

    records = read_topic(base_settings)
    ids = collections.Counter(d for _, _, d in records)
    assert {d: n for d, n in ids.items() if n > 1} == {}, "duplicates"
    assert set(ids) == want
    decoded: dict[str, K8sEvent] = {}
    for key, value, dedupe in records:
        ev = decode_k8s_event(value)
        assert isinstance(ev, K8sEvent), (ev, value)
        assert key == ev.node
        decoded[dedupe] = ev
    assert decoded["event:e1:2"].gpus == ("GPU-aaaa", "GPU-bbbb") and decoded["event:e1:2"].workload == "llm"
    assert decoded["event:e5:1"].node == "node-03" and decoded["event:e5:1"].workload == "batch"
    assert decoded["event:e2:1"].node == "node-02" and decoded["event:e2:1"].workload == "chat"
    assert decoded["event:e3:1"].node == "node-03" and decoded["event:e3:1"].kind == "Node"
    assert orjson.loads(decoded[f"pod:p2:{rv['p2']}"].message)["class"] == "inference"
    assert decoded["pod:p1:deleted"].reason == "PodDeleted"
    assert stats_b["relists"] >= 1 and stats_c["relists"] >= 1
    saved = orjson.loads(state.read_bytes())["watch"]["resource_versions"]
    assert int(saved["events"]) >= int(last_pod_rv), saved  # advanced by a BOOKMARK, not by an event
    watches = [r for r in cluster.requests if "watch=" in r]
    assert watches and all("allowWatchBookmarks=true" in r for r in watches)
    assert "events watch:" in (tmp_path / "a.log").read_text()  # the cut connection, retried
