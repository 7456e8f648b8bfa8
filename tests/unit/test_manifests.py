"""Every manifest in deploy/k8s/ against the Kubernetes OpenAPI schemas (offline, kubernetes-validate),
and what flopwatch needs of them beyond the schema: commands, RBAC, probes, secrets, hostPID.

KEDA's ScaledObject is a CRD the Kubernetes schemas do not hold; its required fields are
checked here by hand. (``kubectl apply --dry-run=client`` is no substitute: it still asks an
API server for discovery, and Debian's kubectl is 1.20.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate  # the dev extra's kubernetes-validate: the OpenAPI schemas of each release, offline
import pytest
import yaml

K8S_DIR = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
K8S_VERSION = "1.30.0"  # the oldest release the manifests promise to work on (runtimeClassName, seccompProfile GA)


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text(encoding="utf-8"))):
            if doc is not None:
                out.append((f"{path.name}#{i}", doc))
    return out


DOCS = documents()
BY_KIND = {(d["kind"], d["metadata"]["name"]): d for _, d in DOCS}


def test_the_folder_holds_every_piece() -> None:
    assert {("DaemonSet", "flopwatch-nvml-collector"), ("Deployment", "flopwatch-k8s-collector"),
            ("ServiceAccount", "flopwatch-k8s-collector"), ("ClusterRole", "flopwatch-k8s-collector"),
            ("ClusterRoleBinding", "flopwatch-k8s-collector"), ("Deployment", "flopwatch-worker"),
            ("Service", "flopwatch-worker"), ("ScaledObject", "chat")} <= set(BY_KIND)


@pytest.mark.parametrize(("where", "doc"), [d for d in DOCS if d[1]["kind"] != "ScaledObject"], ids=lambda x: x
                         if isinstance(x, str) else "")
def test_each_manifest_is_valid_against_the_kubernetes_schema(where: str, doc: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # strict: unknown fields are errors too
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"deploy/k8s/{where} ({doc['kind']} {doc['metadata']['name']}): {exc.message} at "
                    f"{'.'.join(map(str, exc.path))}")


def test_the_keda_scaled_object_has_what_keda_requires() -> None:
    so = BY_KIND[("ScaledObject", "chat")]
    assert so["apiVersion"] == "keda.sh/v1alpha1" and so["metadata"]["namespace"]
    spec = so["spec"]
    assert spec["scaleTargetRef"]["name"]
    assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    trigger = spec["triggers"][0]
    assert trigger["type"] == "metrics-api"
    meta = trigger["metadata"]
    assert {"url", "valueLocation", "targetValue"} <= set(meta) and all(isinstance(v, str) for v in meta.values())
    svc = BY_KIND[("Service", "flopwatch-worker")]
    host = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local:{svc['spec']['ports'][0]['port']}"
    assert meta["url"].startswith(f"http://{host}/keda/")  # it calls the worker Service shipped here


def container(kind: str, name: str) -> dict[str, Any]:
    c: dict[str, Any] = BY_KIND[(kind, name)]["spec"]["template"]["spec"]["containers"][0]
    return c


def env_names(c: dict[str, Any]) -> set[str]:
    return {e["name"] for e in c.get("env", [])}


def test_the_nvml_daemonset_runs_the_collector_with_host_pids_and_gpus() -> None:
    ds = BY_KIND[("DaemonSet", "flopwatch-nvml-collector")]["spec"]["template"]["spec"]
    c = container("DaemonSet", "flopwatch-nvml-collector")
    assert c["args"] == ["collect", "nvml"]
    assert ds["hostPID"] is True and ds["nodeSelector"] and ds["tolerations"]
    assert ds.get("runtimeClassName") == "nvidia" or "NVIDIA_VISIBLE_DEVICES" in env_names(c)
    node = next(e for e in c["env"] if e["name"] == "NODE_NAME")
    assert node["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    proc = next(m for m in c["volumeMounts"] if m["name"] == "host-proc")
    assert proc["readOnly"] is True
    assert next(v for v in ds["volumes"] if v["name"] == "host-proc")["hostPath"]["path"] == "/proc"
    assert "nvidia.com/gpu" not in c["resources"].get("requests", {})  # it must not take a GPU from workloads
    assert c["resources"]["requests"]["cpu"] and c["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_the_k8s_collector_is_read_only_on_pods_and_events() -> None:
    role = BY_KIND[("ClusterRole", "flopwatch-k8s-collector")]
    grants = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
              for v in rule["verbs"]}
    assert grants == {(g, r, v) for g, r in (("", "pods"), ("", "events"), ("events.k8s.io", "events"))
                      for v in ("get", "list", "watch")}
    binding = BY_KIND[("ClusterRoleBinding", "flopwatch-k8s-collector")]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    dep = BY_KIND[("Deployment", "flopwatch-k8s-collector")]["spec"]
    assert dep["template"]["spec"]["serviceAccountName"] == binding["subjects"][0]["name"]
    assert dep["replicas"] == 1 and dep["strategy"]["type"] == "Recreate"
    assert container("Deployment", "flopwatch-k8s-collector")["args"][:2] == ["collect", "k8s"]


def test_the_workers_serve_metrics_and_keda_and_take_passwords_from_a_secret() -> None:
    c = container("Deployment", "flopwatch-worker")
    assert c["args"] == ["worker"]
    assert any(p["containerPort"] == 6066 for p in c["ports"])
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["path"] == "/metrics"
    assert {"name": "FLOPWATCH_WEB_BIND", "value": "0.0.0.0"} in c["env"]
    secret = next(s["secretRef"]["name"] for s in c["envFrom"] if "secretRef" in s)
    example = BY_KIND[("Secret", secret)]
    assert {"FLOPWATCH_KAFKA_SASL_PASSWORD", "FLOPWATCH_CLICKHOUSE_PASSWORD"} <= set(example["stringData"])
    assert not any("PASSWORD" in e["name"] for e in c.get("env", []))  # never in plain env
    pod = BY_KIND[("Deployment", "flopwatch-worker")]["spec"]["template"]["metadata"]
    assert pod["annotations"]["prometheus.io/scrape"] == "true" and pod["annotations"]["prometheus.io/port"] == "6066"
    svc = BY_KIND[("Service", "flopwatch-worker")]["spec"]
    assert svc["selector"] == BY_KIND[("Deployment", "flopwatch-worker")]["spec"]["selector"]["matchLabels"]
