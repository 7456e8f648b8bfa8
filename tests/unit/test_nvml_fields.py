"""streams.formats.nvml_fields: NVML -> catalog mapping, unit conversions, the unsupported memo, cgroup parsing."""

from __future__ import annotations

import pytest

from schemas.catalog import BY_NAME
from streams.formats import nvml_fields as nf

UID = "1b2c3d4e-0000-4a5b-8c9d-0123456789ab"
CID = "0f" * 32


def test_every_field_feeds_catalog_sensors() -> None:
    fed = {s for f in nf.FIELDS for s in f.sensors}
    assert fed <= BY_NAME.keys()
    assert {"gpu_util", "fb_used", "power", "temperature", "sm_clock", "pcie_tx", "pcie_rx", "nvlink_tx",
            "nvlink_rx", "ecc_errors", "xid_errors"} == fed
    assert len(set(nf.FIELD_NAMES)) == len(nf.FIELDS)


def test_unit_conversions_match_catalog_units() -> None:
    assert BY_NAME["power"].unit == "W" and nf.mw_to_w(312_450) == pytest.approx(312.45)
    assert BY_NAME["fb_used"].unit == "MiB" and nf.bytes_to_mib(20 * 1024**3) == 20 * 1024
    assert BY_NAME["pcie_tx"].unit == "B/s" and nf.kb_per_s_to_b_per_s(2000) == 2_048_000.0


def test_nvlink_counter_rate_and_resets() -> None:
    kib = nf.KIB
    assert nf.counter_rate((10**9, 1000), 2 * 10**9, 2000, kib) == 1000 * 1024
    assert nf.counter_rate((10**9, 1000), 10**9 + 10**8, 1100, kib) == pytest.approx(100 * 1024 * 10)
    assert nf.counter_rate((10**9, 1000), 2 * 10**9, 3000) == 2000.0  # bytes
    assert nf.counter_rate((10**9, 5000), 2 * 10**9, 10, kib) is None  # counter restarted
    assert nf.counter_rate((10**9, 5000), 10**9, 6000, kib) is None  # no time passed
    assert nf.counter_rate(None, 10**9, 6000, kib) is None


def test_pcie_fallback_is_staggered_once_per_period() -> None:
    every = 10
    for gpu in range(8):
        assert sum(nf.pcie_fallback_due(t, gpu, every) for t in range(100)) == 10
    for t in range(20):
        assert sum(nf.pcie_fallback_due(t, g, every) for g in range(8)) <= 1
    assert all(nf.pcie_fallback_due(t, 3, 0) for t in range(5))


def test_ecc_total() -> None:
    assert nf.ecc_total(5, 2) == 7.0
    assert nf.ecc_total(0, 0) == 0.0
    assert nf.ecc_total(None, None) is None


def test_in_range_uses_catalog() -> None:
    assert nf.in_range("gpu_util", 100.0) and not nf.in_range("gpu_util", 101.0)
    assert not nf.in_range("temperature", -41.0)


def test_unsupported_memo_reports_once_per_gpu_and_field() -> None:
    memo = nf.UnsupportedMemo()
    assert memo.mark("A", "power") is True
    assert memo.mark("A", "power") is False
    assert memo.mark("A", "nvlink") is True
    assert not memo.wanted("A", "power") and memo.wanted("B", "power")
    assert memo.off("A") == ["power", "nvlink"]
    assert memo.off("B") == []


@pytest.mark.parametrize("text", [
    # cgroup v2, systemd driver, containerd
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
    f"cri-containerd-{CID}.scope\n",
    # guaranteed QoS (no QoS slice), CRI-O
    f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope",
    # best effort, docker
    f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/"
    f"docker-{CID}.scope",
    # cgroup v1, cgroupfs driver, several hierarchies
    f"12:pids:/kubepods/burstable/pod{UID}/{CID}\n11:memory:/kubepods/burstable/pod{UID}/{CID}\n"
    f"1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n",
    # v1 guaranteed
    f"4:cpu,cpuacct:/kubepods/pod{UID}/{CID}",
    # kind / nested: the node itself in a container
    f"0::/docker/{'aa' * 32}/kubepods/besteffort/pod{UID}/{CID}",
    # v1 systemd driver
    f"10:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
    f"cri-containerd-{CID}.scope",
])
def test_parse_cgroup_finds_pod_and_container(text: str) -> None:
    assert nf.parse_cgroup(text) == nf.PodRef(UID, CID)


def test_parse_cgroup_pod_without_container_and_outside_kubernetes() -> None:
    assert nf.parse_cgroup(f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice") == nf.PodRef(UID)
    # a hybrid host: the line with the container wins over a pod-only one
    mixed = f"3:cpu:/kubepods/pod{UID}\n2:memory:/kubepods/pod{UID}/{CID}\n"
    assert nf.parse_cgroup(mixed) == nf.PodRef(UID, CID)
    for text in ("0::/system.slice/containerd.service", "0::/user.slice/user-1000.slice/session-2.scope",
                 "12:memory:/docker/" + CID, "", "garbage"):
        assert nf.parse_cgroup(text) is None


def test_attribution_labels() -> None:
    base = {"gpu_model": "NVIDIA H200", "region": "us-east"}
    a = nf.ProcessUse(11, 2**30, nf.PodRef("pod-a"))
    a2 = nf.ProcessUse(12, 2**30, nf.PodRef("pod-a"))
    b = nf.ProcessUse(21, 2**30, nf.PodRef("pod-b"))
    host = nf.ProcessUse(31, 2**30, None)
    assert nf.gpu_labels(base, [a]) == {**base, "pod": "pod-a", "pid": 11}
    assert nf.gpu_labels(base, [a, a2]) == {**base, "pod": "pod-a"}
    assert nf.gpu_labels(base, [a, b]) == base  # time-sliced between pods: no single owner
    assert nf.gpu_labels(base, [a, host]) == base
    assert nf.gpu_labels(base, [host]) == {**base, "pid": 31}
    assert nf.process_labels(base, b) == {**base, "pid": 21, "pod": "pod-b"}
    assert nf.process_labels(base, host) == {**base, "pid": 31}
    assert nf.process_gpu_id("MIG-1", 5) == "MIG-1/pid:5"


def test_merge_processes() -> None:
    assert nf.merge_processes([(1, 10), (2, None), (1, 5)]) == [(1, 15), (2, None)]
    assert nf.merge_processes([]) == []
