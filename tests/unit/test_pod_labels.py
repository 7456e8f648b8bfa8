"""Workload labels from the Kubernetes collector's pod records, filled into samples that lack them."""

from __future__ import annotations

import orjson

from schemas.records import K8sEvent, Labels
from streams.formats.pod_labels import PodLabelBook


def pod(node: str, name: str, gpus: tuple[str, ...] = (), count: int = 1, reason: str = "PodLabels",
        workload: str = "chat", klass: str = "inference") -> K8sEvent:
    msg = orjson.dumps({"workload": workload, "class": klass, "namespace": "serving", "pod": name,
                        "gpu_count": count}).decode()
    return K8sEvent(node, 1, "Normal", reason, "Pod", "serving", name, workload, gpus, msg)


def test_a_gpu_named_by_a_pod_record_gets_its_workload_and_class() -> None:
    book = PodLabelBook()
    book.on_event(pod("n1", "a-0", ("GPU-a",), workload="a"))
    book.on_event(pod("n1", "b-0", ("GPU-b",), workload="b", klass="training"))
    assert book.fill("n1", "GPU-b", {})["workload"] == "b"
    assert book.fill("n1", "GPU-a", {})["class"] == "inference"
    assert book.fill("n2", "GPU-a", {}) == {}  # another node


def test_without_gpu_ids_only_the_sample_pod_label_decides() -> None:
    book = PodLabelBook()
    book.on_event(pod("n1", "a-0"))
    assert book.fill("n1", "0", {}) == {}  # an idle GPU beside the pod is not credited to it
    book.on_event(pod("n1", "b-0", workload="b"))
    assert book.fill("n1", "0", {"pod": "b-0"})["workload"] == "b"


def test_a_producer_label_wins_and_a_deleted_pod_is_forgotten() -> None:
    book = PodLabelBook()
    book.on_event(pod("n1", "a-0", ("0",)))
    labels: Labels = {"workload": "own"}
    assert book.fill("n1", "0", labels)["workload"] == "own"
    book.on_event(pod("n1", "a-0", reason="PodDeleted"))
    assert book.fill("n1", "0", labels) is labels
    assert not book.on_event(K8sEvent("n1", 1, "Warning", "OOMKilled", "Pod", "serving", "a-0"))


def test_an_nvml_collectors_pod_uid_finds_the_pod_and_becomes_its_name() -> None:
    book = PodLabelBook()
    ev = pod("n1", "chat-0")
    book.on_event(K8sEvent(ev.node, 1, "Normal", "PodLabels", "Pod", "serving", "chat-0", "chat", (),
                           orjson.dumps({**orjson.loads(ev.message), "uid": "6b1f-uid"}).decode()))
    book.on_event(pod("n1", "other-0", workload="other"))  # two GPU pods: the uid decides
    filled = book.fill("n1", "GPU-x/pid:42", {"pod": "6b1f-uid", "pid": 42})
    assert (filled["pod"], filled["workload"], filled["pid"]) == ("chat-0", "chat", 42)
