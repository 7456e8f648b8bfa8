"""Attribution: planted causes must rank first, from the series, Kubernetes events, other detections and labels."""

from __future__ import annotations

import numpy as np

from schemas.alerts import Alert
from schemas.frame_messages import FrameMessage, GpuFrame
from streams.attribution.context import EventBook, Happening
from streams.detect.detectors import Detectors, DetectParams

S = 1_000_000_000
T0 = 1_796_200_000 * S
LABELS = {"namespace": "ml", "workload": "llm", "pod": "llm-0"}


def run(det: Detectors, frames: list[FrameMessage]) -> list[Alert]:
    return [a for m in frames for a in det.on_message(m)]


def stall_frames(n: int, seed: int = 0, labels: dict[str, str] | None = None) -> list[FrameMessage]:
    """The seed's chain: disk writes swamp the host at 200 s, the dataloader blocks at 203 s, the GPU idles at 204 s."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        stalled = i >= 204
        g = GpuFrame("0", labels or LABELS, {
            "gpu_util": (4.0 if stalled else 82.0) + rng.normal(0, 2), "sm_active": 0.05 if stalled else 0.8,
            "power": 120.0 if stalled else 560.0, "dataloader_wait_ms": (650.0 if i >= 203 else 3.0) + rng.normal(0, 1),
            "nvlink_tx": 3e10 * (1 + 0.2 * rng.standard_normal()), "temperature": 60 + rng.normal(0, 0.5)},
            {"cost_usd": 0.001, "flops_per_watt": 1e12}, "")
        host = GpuFrame("host", {}, {"disk_write": (2.5e9 if i >= 200 else 2e7) * (1 + 0.05 * rng.standard_normal()),
                                     "host_cpu_util": 30 + rng.normal(0, 3)}, {}, "")
        out.append(FrameMessage("node-1", T0 + i * S, S, (g, host)))
    return out


def test_the_seeds_stall_chain_is_named_root_first_in_a_second_message() -> None:
    det = Detectors(DetectParams(), S)
    alerts = [a for a in run(det, stall_frames(300)) if a.rule == "pipeline_stall"]
    first, second = alerts[:2]
    assert (first.state, first.causes, second.state, second.id) == ("firing", (), "firing", first.id)
    assert second.ts_ns == first.ts_ns and second.message_id == f"{first.id}:firing:causes"
    names = [c.cause for c in second.causes]
    assert names[:2] == ["disk_write", "dataloader_wait_ms"], second.causes
    top = second.causes[0]
    assert top.evidence["source"] == "series" and top.evidence["lead_s"] == 4.0 and top.confidence > 0.8


def test_a_planted_oom_kill_ranks_first_for_an_idle_gpu() -> None:
    events = EventBook()
    det = Detectors(DetectParams(), S, events=events)
    idle = GpuFrame("0", LABELS, {"gpu_util": 0.0, "sm_active": 0.0}, {"idle": 1.0, "cost_usd": 0.001}, "")
    other = Happening("node-1", T0 + 5 * S, "OOMKilled", "Warning", pod="other-pod", detail="not ours")
    ours = Happening("node-1", T0 - 20 * S, "OOMKilled", "Warning", pod="llm-0", detail="trainer ran out of memory")
    for h in (other, ours, Happening("node-1", T0 - 30 * S, "Pulled", "Normal", pod="llm-0")):
        events.add(h)
    alerts = run(det, [FrameMessage("node-1", T0 + i * S, S, (idle,)) for i in range(620)])
    [_, attributed] = [a for a in alerts if a.rule == "idle_allocated"]
    top = attributed.causes[0]
    assert top.cause == "OOMKilled" and top.evidence["pod"] == "llm-0" and top.evidence["lead_s"] == 20.0
    assert len([c for c in attributed.causes if c.cause == "OOMKilled"]) == 1  # the other pod's kill is not ours


def test_another_detection_on_the_gpu_is_a_cause() -> None:
    det = Detectors(DetectParams(), S)
    frames = []
    for i in range(700):  # the pod idles; its dataloader was stalled from the start
        g = GpuFrame("0", LABELS, {"gpu_util": 1.0, "sm_active": 0.0, "dataloader_wait_ms": 900.0},
                     {"idle": 1.0, "cost_usd": 0.001}, "")
        frames.append(FrameMessage("node-1", T0 + i * S, S, (g,)))
    alerts = run(det, frames)
    idle = [a for a in alerts if a.rule == "idle_allocated" and a.causes]
    assert idle and idle[0].causes[0].cause == "pipeline_stall"
    assert idle[0].causes[0].evidence["source"] == "detection"


def test_a_workload_change_on_the_gpu_is_a_cause() -> None:
    det = Detectors(DetectParams(), S)
    old = stall_frames(150, labels={"namespace": "ml", "workload": "etl", "pod": "etl-0"})[:100]
    alerts = run(det, old + stall_frames(300)[100:])
    stalled = [a for a in alerts if a.rule == "pipeline_stall" and a.causes]
    assert stalled and "workload_changed" in [c.cause for c in stalled[0].causes]


def test_attribution_can_be_turned_off_and_the_windows_are_bounded() -> None:
    from dataclasses import replace

    from streams.attribution.rank import AttributionParams

    det = Detectors(replace(DetectParams(), attribution=AttributionParams(enabled=False)), S)
    assert all(not a.causes for a in run(det, stall_frames(300)))
    det = Detectors(replace(DetectParams(), max_nodes=1), S)
    for k in range(40):
        g = GpuFrame(str(k), LABELS, {"gpu_util": 50.0}, {}, "")
        det.on_message(FrameMessage(f"node-{k}", T0, S, (g,)))
    assert len(det._windows) <= 16
