"""The ingest's processing core on plain records: no Kafka, no ClickHouse, a manual clock."""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import orjson
import pytest
from aiokafka import ConsumerRecord, TopicPartition

import agents.ingest.core as core_module
from agents.ingest.commits import commit_offsets
from agents.ingest.core import IngestCore
from agents.ingest.pricebook_file import PriceBookFile
from agents.kafka.topics import Topics
from agents.runtime.timebase import ManualClock
from agents.settings import load_settings
from agents.sinks.clickhouse import Backend
from agents.sinks.store import FrameStore, Progress
from schemas.records import Reject
from streams.align.aligner import GridAligner, Recovered
from streams.efficiency.enrich import Enricher

S = 1_000_000_000
T0 = 1_796_200_000 * S
SETTINGS = load_settings({}, topic_prefix="u.", partitions=1, lateness_ms=1000, source_idle_s=1.0)
TOPICS = Topics("u.")
POWER, UTIL = TOPICS.sensor(4), TOPICS.sensor(0)


class Letters:
    """The dead-letter sink: what the core refused, in order."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.sent: list[tuple[str, str, int]] = []

    def send(self, reject: Reject, value: bytes | None, key: bytes | None, topic: str, partition: int, offset: int,
             headers: Any = (), indices: list[int] | None = None) -> None:
        self.counts[reject.reason.value] += 1
        self.sent.append((reject.reason.value, topic, offset))


def rec(topic: str, offset: int, ts_s: float, value: float, node: str = "n0") -> ConsumerRecord[bytes, bytes]:
    raw = orjson.dumps({"v": 1, "node": node, "gpu": "0", "ts_ns": T0 + int(ts_s * S), "value": value})
    return ConsumerRecord(topic, 0, offset, 0, 0, node.encode(), raw, None, 1, len(raw), [])


def make(enricher: Enricher | None = None, clock: ManualClock | None = None
         ) -> tuple[IngestCore, FrameStore, Letters, ManualClock]:
    store = FrameStore(cast(Backend, None))  # only buffers here; nothing is written
    letters, clock = Letters(), clock or ManualClock(wall_ns=T0 + 2 * S, mono_ns=0)
    core = IngestCore(SETTINGS, store, letters, clock, enricher)
    core.assign([TopicPartition(t, 0) for t in TOPICS.inputs], Progress(Recovered()))
    return core, store, letters, clock


def quiet_all(ns: int) -> dict[TopicPartition, int]:
    return {TopicPartition(t, 0): ns for t in TOPICS.sensors}


def test_a_poll_becomes_frames_and_commits_wait_for_open_cells() -> None:
    core, store, letters, clock = make()
    poll = {TopicPartition(POWER, 0): [rec(POWER, i, i * 0.5, 300.0 + i) for i in range(6)],
            TopicPartition(UTIL, 0): [rec(UTIL, i, i * 0.5, 50.0) for i in range(6)]}
    read = core.handle(poll)
    assert read == {TopicPartition(POWER, 0): 5, TopicPartition(UTIL, 0): 5} and core.stats.samples == 12
    core.advance(quiet_all(0))
    # Other sensor topics never delivered and are not quiet yet: they hold every cell open.
    assert store.pending_rows == 0 and core.open_cells() > 0
    nxt = {tp: off + 1 for tp, off in read.items()}
    assert core.commit_points(nxt) == {TopicPartition(POWER, 0): 0, TopicPartition(UTIL, 0): 0}
    clock.advance(5 * S)
    core.advance(quiet_all(5 * S))  # everyone quiet past the bound: the tail closes
    batch = store.detach().batches
    frames = [f for b in batch for f in b.frames()]
    assert [(f.tick_ns - T0) // S for f in frames] == [0, 1, 2]
    assert [f.value("power") for f in frames] == [300.5, 302.5, 304.5]
    assert [f.count("n_gpu_util") for f in frames] == [2, 2, 2]
    assert core.commit_points(nxt) == nxt and not letters.sent


def test_the_open_cells_gauge_is_recounted_now_and_then_and_never_reads_zero_while_cells_are_open() -> None:
    core, store, _, clock = make()
    power = TopicPartition(POWER, 0)
    core.handle({power: [rec(POWER, 0, 0.0, 300.0)]})
    core.advance(quiet_all(0))
    assert core.open_cells_gauge(0) == core.open_cells() == 1  # counted: it was 0
    core.handle({power: [rec(POWER, 1, 1.0, 300.0), rec(POWER, 2, 2.0, 300.0)]})
    core.advance(quiet_all(0))
    assert core.open_cells() == 3
    assert core.open_cells_gauge(core_module.OPEN_CELLS_EVERY_NS - 1) == 1  # within the interval: the last count
    assert core.open_cells_gauge(core_module.OPEN_CELLS_EVERY_NS) == 3
    clock.advance(5 * S)
    core.advance(quiet_all(5 * S))  # everything closes
    assert store.pending_rows > 0 and core.open_cells_gauge(core_module.OPEN_CELLS_EVERY_NS + 1) == 0


def test_bad_records_and_bugs_are_dead_lettered_and_the_rest_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    core, store, letters, _ = make()
    real = core_module.decode_samples  # type: ignore[attr-defined]

    def buggy(raw: bytes, sensor: str, limits: object = None) -> object:
        if b"301.0" in raw:
            raise ZeroDivisionError("simulated")
        return real(raw, sensor, limits)  # type: ignore[arg-type]

    real_all = core_module.decode_poll  # type: ignore[attr-defined]

    def buggy_all(raws: list[bytes], sensor: str, limits: object = None) -> object:
        if any(b"301.0" in raw for raw in raws):  # the poll's decode trips too: each record is decoded alone
            raise ZeroDivisionError("simulated")
        return real_all(raws, sensor, limits)  # type: ignore[arg-type]

    monkeypatch.setattr(core_module, "decode_samples", buggy)
    monkeypatch.setattr(core_module, "decode_poll", buggy_all)
    bad = ConsumerRecord(POWER, 0, 3, 0, 0, b"n0", b"{not json", None, 1, 9, [])
    core.handle({TopicPartition(POWER, 0): [rec(POWER, 0, 0, 300.0), rec(POWER, 1, 0.1, 301.0),
                                            rec(POWER, 2, 0.2, 302.0), bad]})
    assert letters.sent == [("internal_error", POWER, 1), ("malformed_json", POWER, 3)]
    assert core.stats.internal_errors == 1 and core.stats.samples == 2
    core.drain()
    (frame,) = [f for b in store.detach().batches for f in b.frames()]
    assert frame.value("power") == 301.0 and frame.count("n_power") == 2


def test_a_bug_in_placing_a_polls_block_falls_back_to_its_records_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The accepted UTC messages of a poll are placed as one block; should that trip a bug of ours, each of them is
    placed alone instead, so no sample is lost and none is counted twice."""
    frames = {}
    for broken in (False, True):
        core, store, letters, _ = make()
        if broken:
            def trip(*args: object) -> None:
                raise ZeroDivisionError("simulated")

            monkeypatch.setattr(GridAligner, "add_block", trip)
        bad = ConsumerRecord(POWER, 0, 4, 0, 0, b"n0", b"{not json", None, 1, 9, [])
        core.handle({TopicPartition(POWER, 0): [*(rec(POWER, i, i * 0.3, 300.0 + i) for i in range(4)), bad],
                     TopicPartition(UTIL, 0): [rec(UTIL, 0, 0.2, 50.0)]})
        assert letters.sent == [("malformed_json", POWER, 4)] and core.stats.samples == 5
        core.drain()
        frames[broken] = [f for b in store.detach().batches for f in b.frames()]
    assert frames[True] == frames[False]
    assert [(f.count("n_power"), f.value("power"), f.count("n_gpu_util")) for f in frames[False]] == [(4, 301.5, 1)]


def test_a_bug_in_the_enrichers_tap_of_a_block_counts_no_sample_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """With derive on the block also goes to the spike engine's tap; should that raise, the aligner has queued
    nothing yet, so placing the records one by one holds each sample once (the frames would hide a second copy:
    aggregation drops exact duplicates, a redelivery's)."""
    frames = {}
    for broken in (False, True):
        clock = ManualClock(wall_ns=T0 + 2 * S, mono_ns=0)
        enricher = Enricher(PriceBookFile(None, clock).current, SETTINGS.align_params().grid_ns)
        if broken:
            def trip(*args: object) -> None:
                raise ZeroDivisionError("simulated")

            monkeypatch.setattr(enricher, "tap_block", trip)
        core, store, _, _ = make(enricher, clock)
        core.handle({TopicPartition(UTIL, 0): [rec(UTIL, i, i * 0.1, 50.0 + i) for i in range(10)]})
        core.advance({})  # places the queue; the watermark closes nothing yet
        assert core.stats.samples == 10 and core.stats.internal_errors == 0
        assert core._aligners[0].open_samples() == 10
        core.drain()
        frames[broken] = [f for b in store.detach().batches for f in b.frames()]
    assert [(f.count("n_gpu_util"), f.value("gpu_util")) for f in frames[True]] == [(10, 54.5)]
    assert frames[True] == frames[False]


def test_a_sample_behind_a_written_cell_is_late_and_named() -> None:
    core, store, letters, clock = make()
    core.handle({TopicPartition(POWER, 0): [rec(POWER, i, i, 300.0) for i in range(5)]})
    core.advance(quiet_all(0))  # the silent topics fall behind here; their quiet time counts from now
    clock.advance(5 * S)
    core.advance(quiet_all(5 * S))
    assert store.pending_rows == 5
    core.handle({TopicPartition(POWER, 0): [rec(POWER, 5, 0.5, 310.0)]})
    core.advance(quiet_all(5 * S))
    assert letters.sent == [("late", POWER, 5)] and core.stats.late == {"n0/power": 1}


def test_late_records_of_a_polls_block_are_dead_lettered_with_their_own_bytes() -> None:
    core, store, letters, clock = make()
    core.handle({TopicPartition(POWER, 0): [rec(POWER, i, i, 300.0) for i in range(5)]})
    core.advance(quiet_all(0))
    clock.advance(5 * S)
    core.advance(quiet_all(5 * S))
    assert store.pending_rows == 5  # ticks 0-4 closed
    values: dict[int, bytes | None] = {}
    send = letters.send

    def keep(reject: Reject, value: bytes | None, key: bytes | None, topic: str, partition: int, offset: int,
             *rest: Any, **kw: Any) -> None:
        values[offset] = value
        send(reject, value, key, topic, partition, offset, *rest, **kw)

    letters.send = keep  # type: ignore[method-assign]
    # One poll, one block of six messages (two of them for cells already written), and another sensor's beside.
    stamps = {5: 5.2, 6: 0.5, 7: 5.4, 8: 5.6, 9: 1.5, 10: 5.8}
    power = [rec(POWER, off, ts, 310.0 + off) for off, ts in stamps.items()]
    core.handle({TopicPartition(POWER, 0): power, TopicPartition(UTIL, 0): [rec(UTIL, 0, 5.1, 50.0)]})
    core.advance(quiet_all(5 * S))
    assert sorted(letters.sent) == [("late", POWER, 6), ("late", POWER, 9)]
    assert values == {6: power[1].value, 9: power[4].value}


def test_a_node_that_went_away_is_forgotten_and_on_its_return_its_written_cells_stay_written() -> None:
    store = FrameStore(cast(Backend, None))
    letters, clock = Letters(), ManualClock(wall_ns=T0 + 2 * S, mono_ns=0)
    core = IngestCore(SETTINGS.replace(node_forget_s=3.0), store, letters, clock)
    core.assign([TopicPartition(t, 0) for t in TOPICS.inputs], Progress(Recovered()))
    core.handle({TopicPartition(POWER, 0): [rec(POWER, i, i, 300.0, node=f"n{i % 2}") for i in range(4)]})
    core.advance(quiet_all(0))
    assert core.nodes_held() == 2
    clock.advance(2 * S)
    core.advance(quiet_all(2 * S))  # both quiet past the idle bound (1 s): their cells are written
    assert store.pending_rows == 4 and core.nodes_held() == 2
    clock.advance(3 * S)
    core.advance(quiet_all(5 * S))  # and past node_forget_s (3 s): forgotten
    assert core.nodes_held() == 0
    # n0 comes back: a sample for a cell it had written is late, as if it had never gone; a new one is placed.
    core.handle({TopicPartition(POWER, 0): [rec(POWER, 4, 0.5, 310.0), rec(POWER, 5, 7.0, 320.0)]})
    core.advance(quiet_all(5 * S))
    assert letters.sent == [("late", POWER, 4)] and core.nodes_held() == 1


def test_revoked_partitions_are_ignored_until_assigned_again() -> None:
    core = make()[0]
    core.revoke([0])
    assert core.handle({TopicPartition(POWER, 0): [rec(POWER, 0, 0, 300.0)]}) == {}
    assert core.stats.messages == 0 and not core.owns(0)


def test_commit_offsets_hold_back_to_the_oldest_needed_record() -> None:
    read = {TopicPartition("s.a", 0): 50, TopicPartition("s.a", 1): 70, TopicPartition("c", 0): 9,
            TopicPartition("e", 0): 4}
    got = commit_offsets(read, sensor_index={"s.a": 0}, clock_topic="c", open_oldest={0: {0: 20}},
                         held_oldest={(0, 0): 10, (1, 0): 80}, beacon_pins={})
    # partition 0: a domain wait at 10 beats the open cell at 20; partition 1: a wait past the
    # read position cannot move the commit past what was read.
    assert got == {TopicPartition("s.a", 0): 10, TopicPartition("s.a", 1): 70, TopicPartition("c", 0): 9,
                   TopicPartition("e", 0): 4}


def test_frames_get_derived_columns_and_the_spike_engine_sees_the_raw_samples() -> None:
    from agents.ingest.pricebook_file import PriceBookFile
    from streams.efficiency.enrich import Enricher

    store = FrameStore(cast(Backend, None))
    clock = ManualClock(wall_ns=T0 + 2 * S, mono_ns=0)
    enricher = Enricher(PriceBookFile(None, clock).current, SETTINGS.align_params().grid_ns)
    core = IngestCore(SETTINGS, store, Letters(), clock, enricher)
    core.assign([TopicPartition(t, 0) for t in TOPICS.inputs], Progress(Recovered()))
    tensor, sm = TOPICS.sensor(2), TOPICS.sensor(1)

    def lab(r: ConsumerRecord[bytes, bytes]) -> ConsumerRecord[bytes, bytes]:
        doc = orjson.loads(r.value or b"")
        doc["labels"] = {"gpu_model": "H100", "region": "us-east", "pod": "p-0"}
        raw = orjson.dumps(doc)
        return ConsumerRecord(r.topic, 0, r.offset, 0, 0, r.key, raw, None, 1, len(raw), [])

    util = [50.0] * 20
    util[13] = util[14] = 99.0  # 200 ms at 10 Hz, in the second tick
    core.handle({TopicPartition(UTIL, 0): [lab(rec(UTIL, i, i * 0.1, u)) for i, u in enumerate(util)],
                 TopicPartition(POWER, 0): [rec(POWER, i, i * 0.1, 400.0) for i in range(20)],
                 TopicPartition(tensor, 0): [rec(tensor, i, i * 0.1, 0.5) for i in range(20)],
                 TopicPartition(sm, 0): [rec(sm, i, i * 0.1, 0.6) for i in range(20)]})
    core.advance(quiet_all(0))
    clock.advance(5 * S)
    core.advance(quiet_all(5 * S))
    [batch] = store.detach().batches
    assert batch.column("tflops").tolist() == pytest.approx([494.75, 494.75])  # H100 SXM dense bf16 (989.5) x 0.5
    assert batch.column("flops_per_watt").tolist() == pytest.approx([494.75e12 / 400.0] * 2)
    assert batch.column("cost_usd")[0] > 0 and batch.notes == ["", ""]
    p99 = batch.column("gpu_util_p99").tolist()
    assert p99[0] == 50.0 and p99[1] > 95.0
    # Each frame's FLOPS/W in 100 ms buckets, from the same raw samples: flat here, at the frame's own.
    assert [len(p) for p in batch.sub_fpw] == [10, 10]
    assert all(x == pytest.approx(494.75e12 / 400.0) for p in batch.sub_fpw for x in p)


def test_a_drop_inside_a_tick_shows_in_its_sub_tick_profile() -> None:
    from agents.ingest.pricebook_file import PriceBookFile
    from streams.efficiency.enrich import Enricher

    store = FrameStore(cast(Backend, None))
    clock = ManualClock(wall_ns=T0 + 2 * S, mono_ns=0)
    enricher = Enricher(PriceBookFile(None, clock).current, SETTINGS.align_params().grid_ns)
    core = IngestCore(SETTINGS, store, Letters(), clock, enricher)
    core.assign([TopicPartition(t, 0) for t in TOPICS.inputs], Progress(Recovered()))
    tensor = TOPICS.sensor(2)
    work = [0.5] * 7 + [0.375] * 3  # 25% less tensor work from 700 ms on, the same power

    def h100(r: ConsumerRecord[bytes, bytes]) -> ConsumerRecord[bytes, bytes]:
        raw = orjson.dumps({**orjson.loads(r.value or b""), "labels": {"gpu_model": "H100"}})
        return ConsumerRecord(r.topic, 0, r.offset, 0, 0, r.key, raw, None, 1, len(raw), [])

    core.handle({TopicPartition(POWER, 0): [rec(POWER, i, i * 0.1 + 0.05, 400.0) for i in range(10)],
                 TopicPartition(tensor, 0): [h100(rec(tensor, i, i * 0.1 + 0.05, w)) for i, w in enumerate(work)]})
    core.advance(quiet_all(0))
    clock.advance(5 * S)
    core.advance(quiet_all(5 * S))
    [batch] = store.detach().batches
    profile = [x for x in batch.sub_fpw[0] if x is not None]
    fpw = batch.column("flops_per_watt").tolist()[0]
    assert len(profile) == 10 and sum(profile) / 10 == pytest.approx(fpw)  # the profile's mean is the frame
    assert profile[:7] == pytest.approx([fpw * 0.5 / 0.4625] * 7) and profile[7:] == pytest.approx([fpw * 0.375 / 0.4625] * 3)


def test_pod_records_of_the_kubernetes_collector_label_the_frames() -> None:
    core, store, letters, clock = make()
    events = TOPICS.k8s_events
    pod = orjson.dumps({"v": 1, "node": "n0", "ts_ns": T0, "type": "Normal", "reason": "PodLabels", "kind": "Pod",
                        "namespace": "serving", "pod": "chat-0", "workload": "chat", "gpus": ["0"],
                        "message": orjson.dumps({"workload": "chat", "class": "inference", "namespace": "serving",
                                                 "pod": "chat-0", "gpu_count": 1}).decode()})
    poll = {TopicPartition(POWER, 0): [rec(POWER, i, i * 0.5, 300.0) for i in range(4)],
            TopicPartition(events, 0): [ConsumerRecord(events, 0, 0, 0, 0, b"n0", pod, None, 1, len(pod), [])]}
    core.handle(poll)  # the pod record is taken first, so the same poll's samples get its labels
    core.advance(quiet_all(0))
    clock.advance(5 * S)
    core.advance(quiet_all(5 * S))
    frames = [f for b in store.detach().batches for f in b.frames()]
    assert frames and all((f.labels.get("workload"), f.labels.get("class"), f.labels.get("pod")) ==
                          ("chat", "inference", "chat-0") for f in frames)
    assert not letters.sent


def test_frames_older_than_the_retention_are_counted_and_said(caplog: pytest.LogCaptureFixture) -> None:
    """ClickHouse drops them at its next merge: without this a replayed old recording left nothing, silently."""
    settings = load_settings({}, topic_prefix="u.", partitions=1, lateness_ms=1000, source_idle_s=1.0,
                             max_age_s=400 * 86_400.0, frames_retention_days=30)
    store = FrameStore(cast(Backend, None))
    clock = ManualClock(wall_ns=T0 + 31 * 86_400 * S, mono_ns=0)  # a month and a day after the samples
    core = IngestCore(settings, store, Letters(), clock)
    core.assign([TopicPartition(t, 0) for t in TOPICS.inputs], Progress(Recovered()))
    core.handle({TopicPartition(POWER, 0): [rec(POWER, i, i * 0.5, 300.0) for i in range(6)]})
    with caplog.at_level("WARNING", logger="agents.ingest.worker"):
        core.advance(quiet_all(0))
        clock.advance(5 * S)
        core.advance(quiet_all(5 * S))
    assert store.pending_rows == 3 and core.stats.frames_past_retention == 3 and core.stats.as_dict()["frames_past_retention"] == 3
    [said] = [r.getMessage() for r in caplog.records if "retention" in r.getMessage()]
    assert said.startswith("3 frames written so far are older than gpu_frames' retention (30 days")
