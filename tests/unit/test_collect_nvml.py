"""agents.collect.nvml against the pynvml double and a recording sink (no Kafka, no GPU)."""

from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agents.cli import nvml as cli_nvml
from agents.collect.nvml import NoDriver, NvmlCollector
from schemas.records import Labels
from tests.doubles import fake_pynvml as fake
from tests.doubles.fake_pynvml import FakeGpu, FakeNvml, ProcessInfo

UID_A = "1b2c3d4e-0000-4a5b-8c9d-0123456789ab"
UID_B = "99999999-1111-4222-8333-444444444444"
CID = "ab" * 32


class Sink:
    def __init__(self) -> None:
        self.samples: list[tuple[str, str, str, int, float, Labels | None, str]] = []
        self.beacons: list[tuple[str, str, int, int, int]] = []
        self.polls = 0
        self.pending_sent = 0

    def send(self, sensor: str, node: str, gpu: str, ts_ns: int, value: float, labels: Labels | None = None,
             clock: str = "utc") -> bool:
        self.samples.append((sensor, node, gpu, ts_ns, value, labels, clock))
        return True

    def beacon(self, node: str, clock: str, domain_ns: int, utc_before_ns: int, utc_after_ns: int) -> bool:
        self.beacons.append((node, clock, domain_ns, utc_before_ns, utc_after_ns))
        return True

    def poll(self) -> None:
        self.polls += 1

    def send_pending(self) -> None:
        self.pending_sent += 1

    def by(self, sensor: str, gpu: str) -> list[tuple[float, Labels | None]]:
        return [(v, lb) for s, _, g, _, v, lb, _ in self.samples if s == sensor and g == gpu]


class Clock:
    """Domain (monotonic) time advancing 100 ms per reading, so rates are exact; UTC 1 us per reading."""

    def __init__(self) -> None:
        self.t = 5 * 10**9
        self.utc = iter(range(10**18, 10**19, 1000))

    def mono_ns(self) -> int:
        self.t += 100_000_000
        return self.t

    def wall_ns(self) -> int:
        return next(self.utc)


def _collector(nv: FakeNvml, tmp_path: Path, **kw: Any) -> tuple[NvmlCollector, Sink]:
    sink = Sink()
    c = NvmlCollector(nv, sink, "node-7", region="us-east", proc_root=tmp_path, clock=Clock(), **kw)
    return c, sink


def test_values_units_labels_and_clock(tmp_path: Path) -> None:
    gpus = fake.gpus(2)
    nv = FakeNvml(gpus)
    c, sink = _collector(nv, tmp_path)
    assert c.open() == [g.uuid for g in gpus]
    c.tick()
    c.tick()
    u0 = gpus[0].uuid
    want = {"gpu_util": 57.0, "fb_used": 20 * 1024.0, "power": 312.45, "temperature": 61.0, "sm_clock": 1980.0,
            "ecc_errors": 3.0, "xid_errors": 0.0}
    for sensor, value in want.items():
        got = sink.by(sensor, u0)
        assert [v for v, _ in got] == [value, value], sensor
    # NVLink: a rate from the second reading on; 10 MiB per 100 ms of domain time.
    ntx = sink.by("nvlink_tx", u0)
    assert len(ntx) == 1
    # one domain reading per GPU per tick, 100 ms apart: 200 ms between this GPU's reads
    assert ntx[0][0] == pytest.approx(10_240 * 1024 * 1e9 / 200_000_000)
    # PCIe from the byte counters: 1 MB (TX) and 2 MB (RX) per read
    assert [v for v, _ in sink.by("pcie_tx", u0)] == [pytest.approx(5e6)]
    assert [v for v, _ in sink.by("pcie_rx", u0)] == [pytest.approx(1e7)]
    assert nv.calls[(u0, "nvmlDeviceGetPcieThroughput")] == 0
    for _, node, _, _, _, labels, clock in sink.samples:
        assert node == "node-7" and clock == "nvml:node-7"
        assert labels == {"gpu_model": "NVIDIA H200", "region": "us-east"}
    c.close()
    assert len(sink.beacons) == 1
    node, clock, dom, before, after = sink.beacons[0]
    assert (node, clock) == ("node-7", "nvml:node-7") and before <= after
    assert dom > max(s[3] for s in sink.samples)  # the last beacon comes after every sample
    assert not nv.initialized


def test_unsupported_field_is_logged_once_and_never_asked_again(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    gpus = fake.gpus(2)
    gpus[1].unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetFieldValues", "nvmlDeviceRegisterEvents"}
    nv = FakeNvml(gpus)
    c, sink = _collector(nv, tmp_path)
    with caplog.at_level(logging.INFO, logger="agents.collect.nvml"):
        c.open()
        for _ in range(5):
            c.tick()
    u0, u1 = gpus[0].uuid, gpus[1].uuid
    assert nv.calls[(u1, "nvmlDeviceGetPowerUsage")] == 1
    assert nv.calls[(u1, "nvmlDeviceGetFieldValues")] == 2  # once for the PCIe counters, once for NVLink
    assert nv.calls[(u0, "nvmlDeviceGetPowerUsage")] == 5
    assert sink.by("power", u1) == [] and len(sink.by("power", u0)) == 5
    assert sink.by("xid_errors", u1) == [] and len(sink.by("xid_errors", u0)) == 5
    assert len(sink.by("gpu_util", u1)) == 5  # the rest goes on
    msgs = [r.getMessage() for r in caplog.records if u1 in r.getMessage() and "not available" in r.getMessage()]
    assert sorted(m.split(": ")[1].split(" ")[0] for m in msgs) == ["nvlink", "pcie", "power", "xid"]
    assert c.memo.off(u1) == ["power", "pcie", "nvlink", "xid"]


def test_nvlink_absent_per_field_result_is_remembered(tmp_path: Path) -> None:
    nv = FakeNvml(fake.gpus(1))

    def no_links(h: Any, ids: list[Any]) -> list[Any]:
        nv.calls[(h.uuid, "nvmlDeviceGetFieldValues")] += 1
        pairs = [i if isinstance(i, tuple) else (i, 0) for i in ids]
        return [fake.FieldValue(f, s, fake.NVML_ERROR_NOT_SUPPORTED, fake._FieldUnion(0)) for f, s in pairs]

    nv.nvmlDeviceGetFieldValues = no_links  # type: ignore[method-assign,assignment]
    c, sink = _collector(nv, tmp_path)
    c.open()
    for _ in range(3):
        c.tick()
    assert nv.calls[(nv.gpus[0].uuid, "nvmlDeviceGetFieldValues")] == 2  # PCIe counters and NVLink, once each
    assert sink.by("nvlink_tx", nv.gpus[0].uuid) == []


def test_pcie_throughput_fallback_is_read_once_per_period(tmp_path: Path) -> None:
    gpus = fake.gpus(2, unsupported_fields={fake.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, fake.NVML_FI_DEV_PCIE_COUNT_RX_BYTES})
    nv = FakeNvml(gpus)
    c, sink = _collector(nv, tmp_path, pcie_fallback_ticks=3)
    c.open()
    for _ in range(6):
        c.tick()
    for g in gpus:
        assert nv.calls[(g.uuid, "nvmlDeviceGetPcieThroughput")] == 2 * 2  # TX and RX, on 2 of 6 ticks
        assert [v for v, _ in sink.by("pcie_tx", g.uuid)] == [2_048_000.0, 2_048_000.0]
        assert [v for v, _ in sink.by("pcie_rx", g.uuid)] == [3_072_000.0, 3_072_000.0]
        assert len(sink.by("nvlink_tx", g.uuid)) == 5  # the NVLink counters still answer


def test_lost_gpu_is_dropped_and_the_others_go_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    gpus = fake.gpus(3)
    gpus[1].lost_at_tick = 3
    nv = FakeNvml(gpus)
    c, sink = _collector(nv, tmp_path)
    c.open()
    with caplog.at_level(logging.ERROR, logger="agents.collect.nvml"):
        for _ in range(6):
            c.tick()
    assert [g.id for g in c.gpus] == [gpus[0].uuid, gpus[2].uuid]
    assert c.stats.gpus_lost == 1
    assert len(sink.by("power", gpus[1].uuid)) == 2
    assert len(sink.by("power", gpus[0].uuid)) == 6 and len(sink.by("power", gpus[2].uuid)) == 6
    calls_after = nv.calls[(gpus[1].uuid, "nvmlDeviceGetMemoryInfo")]
    assert calls_after == 3  # never asked again once lost
    assert any("is lost" in r.getMessage() for r in caplog.records)


def test_transient_error_skips_one_reading(tmp_path: Path) -> None:
    nv = FakeNvml(fake.gpus(1))
    real = nv.nvmlDeviceGetTemperature
    fails = [True]

    def flaky(h: Any, sensor: int) -> int:
        if fails.pop() if fails else False:
            raise fake.NVMLError(fake.NVML_ERROR_UNKNOWN)
        return real(h, sensor)

    nv.nvmlDeviceGetTemperature = flaky  # type: ignore[method-assign]
    c, sink = _collector(nv, tmp_path)
    c.open()
    c.tick()
    c.tick()
    assert [v for v, _ in sink.by("temperature", nv.gpus[0].uuid)] == [61.0]
    assert c.stats.errors == 1 and c.memo.wanted(nv.gpus[0].uuid, "temperature")


@pytest.mark.parametrize("driver", ["missing", "not_loaded"])
def test_no_driver_raises_clearly(tmp_path: Path, driver: str) -> None:
    c, _ = _collector(FakeNvml([], driver=driver), tmp_path)
    with pytest.raises(NoDriver, match="NVIDIA driver"):
        c.open()


@pytest.mark.parametrize("driver", ["missing", "not_loaded"])
def test_command_exits_2_without_driver(monkeypatch: pytest.MonkeyPatch, driver: str) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([], driver=driver))
    monkeypatch.setenv("FLOPWATCH_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # never contacted
    result = CliRunner().invoke(cli_nvml.nvml_command, ["--duration", "1", "--node", "n1"])
    assert result.exit_code == 2, result.output
    assert "NVML cannot start" in result.output and "driver" in result.output


def test_xid_events(tmp_path: Path) -> None:
    gpus = fake.gpus(2)
    nv = FakeNvml(gpus)
    c, sink = _collector(nv, tmp_path)
    c.open()
    c.tick()
    gpus[1].xids.extend([79, 48])
    c.tick()
    c.tick()
    assert [v for v, _ in sink.by("xid_errors", gpus[1].uuid)] == [0.0, 79.0, 48.0, 0.0]
    assert [v for v, _ in sink.by("xid_errors", gpus[0].uuid)] == [0.0, 0.0, 0.0]


def test_mig_instances_are_gpus_of_their_own(tmp_path: Path) -> None:
    parent = FakeGpu("GPU-aaaa", "NVIDIA H200", processes=[ProcessInfo(1, 2**30)])
    parent.mig = [fake.mig_instance("MIG-0001", processes=[ProcessInfo(50, 3 * 2**30)]),
                  fake.mig_instance("MIG-0002", mem_used=2 * 2**30)]
    plain = FakeGpu("GPU-bbbb", unsupported={"nvmlDeviceGetMigMode"})
    nv = FakeNvml([parent, plain])
    c, sink = _collector(nv, tmp_path)
    assert c.open() == ["GPU-aaaa", "MIG-0001", "MIG-0002", "GPU-bbbb"]
    c.tick()
    c.tick()
    assert [v for v, _ in sink.by("fb_used", "MIG-0001")] == [4096.0, 4096.0]
    assert [v for v, _ in sink.by("fb_used", "MIG-0002")] == [2048.0, 2048.0]
    assert sink.by("power", "MIG-0001") == [] and len(sink.by("power", "GPU-aaaa")) == 2
    assert sink.by("fb_used", "MIG-0001")[0][1] == {"gpu_model": "NVIDIA H200 MIG 1g.18gb", "region": "us-east",
                                                   "pid": 50}
    # processes come from the instances; the parent's list would count them twice
    assert sink.by("fb_used", "MIG-0001/pid:50")[0][0] == 3072.0
    assert sink.by("fb_used", "GPU-aaaa/pid:1") == []
    assert nv.calls[("MIG-0001", "nvmlDeviceGetPowerUsage")] == 1  # unsupported there: asked once
    assert len(sink.by("power", "GPU-bbbb")) == 2


def test_per_process_attribution_through_cgroups(tmp_path: Path) -> None:
    (tmp_path / "101").mkdir()
    (tmp_path / "101" / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_A.replace('-', '_')}.slice/"
        f"cri-containerd-{CID}.scope\n")
    (tmp_path / "102").mkdir()
    (tmp_path / "102" / "cgroup").write_text(f"11:memory:/kubepods/besteffort/pod{UID_B}/{CID}\n")
    (tmp_path / "103").mkdir()
    (tmp_path / "103" / "cgroup").write_text(f"11:memory:/kubepods/besteffort/pod{UID_B}/{CID}\n")
    gpus = fake.gpus(3)
    gpus[0].processes = [ProcessInfo(101, 6 * 2**30)]  # one pod
    gpus[1].processes = [ProcessInfo(102, 2**30), ProcessInfo(101, 2**29), ProcessInfo(999, None)]  # shared
    gpus[2].processes = [ProcessInfo(102, 2**30), ProcessInfo(103, 2**30)]  # one pod, two processes
    nv = FakeNvml(gpus)
    c, sink = _collector(nv, tmp_path)
    c.open()
    c.tick()
    base = {"gpu_model": "NVIDIA H200", "region": "us-east"}
    u0, u1, u2 = (g.uuid for g in gpus)
    assert sink.by("power", u0)[0][1] == {**base, "pod": UID_A, "pid": 101}
    assert sink.by("power", u1)[0][1] == base  # time-sliced between pods
    assert sink.by("power", u2)[0][1] == {**base, "pod": UID_B}
    assert sink.by("fb_used", f"{u0}/pid:101") == [(6144.0, {**base, "pid": 101, "pod": UID_A})]
    assert sink.by("fb_used", f"{u1}/pid:102") == [(1024.0, {**base, "pid": 102, "pod": UID_B})]
    assert sink.by("fb_used", f"{u1}/pid:101") == [(512.0, {**base, "pid": 101, "pod": UID_A})]
    assert sink.by("fb_used", f"{u1}/pid:999") == []  # memory unknown: nothing to publish
    # the cgroup is read once per process while it lives, then forgotten
    (tmp_path / "101" / "cgroup").write_text("0::/user.slice\n")
    c.tick()
    assert sink.by("fb_used", f"{u0}/pid:101")[-1][1] == {**base, "pid": 101, "pod": UID_A}
    gpus[0].processes, gpus[1].processes = [], []
    c.tick()
    assert 101 not in c._pods
    assert sink.by("power", u0)[-1][1] == base


def test_no_processes_option(tmp_path: Path) -> None:
    gpus = fake.gpus(1, processes=[ProcessInfo(5, 2**30)])
    nv = FakeNvml(gpus)
    c, sink = _collector(nv, tmp_path, processes=False)
    c.open()
    c.tick()
    assert nv.calls[(gpus[0].uuid, "nvmlDeviceGetComputeRunningProcesses")] == 0
    assert all("/pid:" not in s[2] for s in sink.samples)


def test_run_loop_ticks_and_beacons_on_schedule(tmp_path: Path) -> None:
    nv = FakeNvml(fake.gpus(2))
    sink = Sink()
    c = NvmlCollector(nv, sink, "n", proc_root=tmp_path)
    c.open()
    stats = c.run(0.02, duration_s=0.5, beacon_every_s=0.2)
    c.close()
    assert 15 <= stats.ticks <= 26
    assert 3 <= len(sink.beacons) <= 5  # at 0, 0.2, 0.4 s, plus the closing one
    per_gpu: dict[str, int] = defaultdict(int)
    for s in sink.samples:
        if s[0] == "power":
            per_gpu[s[2]] += 1
    assert set(per_gpu.values()) == {stats.ticks}
    dom = [b[2] for b in sink.beacons]
    assert dom == sorted(dom)


def test_out_of_range_reading_is_skipped(tmp_path: Path) -> None:
    gpus = fake.gpus(1, temperature=400)
    c, sink = _collector(FakeNvml(gpus), tmp_path)
    c.open()
    c.tick()
    assert sink.by("temperature", gpus[0].uuid) == [] and c.stats.out_of_range == 1


def test_beacon_sends_pending_batches_first(tmp_path: Path) -> None:
    order: list[str] = []
    c, sink = _collector(FakeNvml(fake.gpus(1)), tmp_path)
    sink.send_pending = lambda: order.append("pending")  # type: ignore[method-assign]
    real = sink.beacon

    def beacon(*args: Any) -> bool:
        order.append("beacon")
        return real(*args)

    sink.beacon = beacon  # type: ignore[method-assign,assignment]
    c.open()
    c.beacon()
    assert order == ["pending", "beacon"]


def test_gpu_lost_at_start_is_skipped(tmp_path: Path) -> None:
    gpus = fake.gpus(2)
    gpus[0].lose()
    c, sink = _collector(FakeNvml(gpus), tmp_path)
    assert c.open() == [gpus[1].uuid]
    assert c.stats.gpus_lost == 1
    c.tick()
    assert {s[2] for s in sink.samples} == {gpus[1].uuid}


def test_command_exits_2_without_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([]))
    monkeypatch.setenv("FLOPWATCH_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    result = CliRunner().invoke(cli_nvml.nvml_command, ["--duration", "1", "--node", "n1"])
    assert result.exit_code == 2 and "no GPU" in result.output


def test_lost_mig_parent_drops_its_instances(tmp_path: Path) -> None:
    parent = FakeGpu("GPU-aaaa")
    parent.mig = [fake.mig_instance("MIG-0001"), fake.mig_instance("MIG-0002")]
    other = FakeGpu("GPU-bbbb")
    c, sink = _collector(FakeNvml([parent, other]), tmp_path)
    c.open()
    c.tick()
    for g in (parent, *parent.mig):
        g.lose()
    c.tick()
    assert [g.id for g in c.gpus] == ["GPU-bbbb"] and c.stats.gpus_lost == 3
    c.tick()
    assert len(sink.by("power", "GPU-bbbb")) == 3
