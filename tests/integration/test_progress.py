"""What a restarted worker learns from ClickHouse: empty ticks closed after the newest frame stay closed."""

from __future__ import annotations

import pytest

from agents.settings import Settings
from agents.sinks.clickhouse import open_backend
from agents.sinks.schema import ensure_schema
from agents.sinks.store import FrameStore
from schemas.catalog import BY_NAME
from streams.align.aligner import AlignParams, GridAligner

pytestmark = pytest.mark.integration

S = 1_000_000_000
T0 = 1_796_200_000 * S
POWER = BY_NAME["power"].index


def test_a_replay_does_not_reopen_empty_ticks_closed_before_the_crash(any_settings: Settings) -> None:
    # Ticks 0-5 have samples; one at 12.5 s moves the watermark (lateness 5 s) to 7.5 s, so
    # tick 6 closes with no samples while tick 12 stays open.
    params = AlignParams(allowed_lateness_ns=5 * S)
    a = GridAligner(params)
    a.add("n", "0", POWER, [T0 + k * S + S // 2 for k in range(6)], [300.0] * 6)
    a.add("n", "0", POWER, [T0 + 12 * S + S // 2], [300.0])
    adv = a.advance(now_ns=0)
    assert sorted(adv.frames.tick_ns.tolist()) == [T0 + k * S for k in range(6)]
    assert a.closed_ticks() == {"n": T0 + 6 * S}
    a.add("n", "0", POWER, [T0 + 6 * S + S // 3], [999.0])  # late: its tick closed empty
    assert len(a.advance(now_ns=0).late) == 1

    backend = open_backend(any_settings)
    try:
        ensure_schema(backend)
        store = FrameStore(backend)
        store.add_frames(adv.frames)
        store.write(store.detach(), {("t", 0): 10}, now_ms=T0 // 1_000_000, closed=a.closed_ticks())
        progress = store.recover()
    finally:
        backend.close()
    # The newest frame is tick 5, but tick 6 was final too: the crash must not reopen it.
    assert progress.recovered.boundaries == {"n": T0 + 6 * S}
    again = GridAligner(params, progress.recovered)
    again.add("n", "0", POWER, [T0 + 6 * S + S // 3], [999.0])
    again.add("n", "0", POWER, [T0 + 12 * S + S // 2], [300.0])
    adv = again.advance(now_ns=0)
    assert [x.indices for x in adv.late] == [[0]] and len(adv.frames) == 0


def test_a_restarted_worker_relearns_the_pods_workloads(any_settings: Settings) -> None:
    from schemas.records import K8sEvent

    def record(reason: str, pod: str, ts_s: int, workload: str) -> K8sEvent:
        msg = f'{{"workload": "{workload}", "class": "inference", "namespace": "serving", "pod": "{pod}", ' \
              f'"uid": "uid-{pod}", "gpu_count": 1}}'
        return K8sEvent("n1", T0 + ts_s * S, "Normal", reason, "Pod", "serving", pod, workload, ("GPU-1",), msg)

    backend = open_backend(any_settings)
    try:
        ensure_schema(backend)
        store = FrameStore(backend)
        for i, ev in enumerate([record("PodLabels", "chat-0", 1, "chat"), record("PodLabels", "chat-0", 5, "chat2"),
                                record("PodLabels", "gone-0", 2, "gone"), record("PodDeleted", "gone-0", 3, "gone"),
                                record("OOMKilled", "chat-0", 6, "chat")]):
            store.add_event(ev, "k8s.events", 0, i)
        store.write(store.detach(), {}, now_ms=T0 // 1_000_000)
        pods = store.recover().pods
    finally:
        backend.close()
    assert [(p.pod, p.workload, p.gpus) for p in pods] == [("chat-0", "chat2", ("GPU-1",))]
    assert '"uid": "uid-chat-0"' in pods[0].message
