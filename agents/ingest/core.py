"""The work the ingest does on a poll, apart from Kafka: plain records in, frames and rejects out.

``IngestCore`` decodes and validates records, keeps the clock domains, aligns samples
into grid cells and hands closed frames to the frame store and refused records to the
dead-letter sink. It never talks to Kafka itself: the shell (``agents.ingest.worker``) feeds it
the polls, tells it which partitions it owns and how long each sensor partition has been
quiet, and asks it where commits may go. So it runs the same under a unit test, a
benchmark replaying recorded polls, and the worker.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import operator
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from typing import TypeAlias

import numpy as np
from aiokafka import ConsumerRecord, TopicPartition

from agents.ingest.commits import commit_offsets
from agents.ingest.refusals import RejectSink, late_detail
from agents.ingest.stats import IngestStats
from agents.kafka.topics import Topics
from agents.runtime.timebase import SYSTEM_CLOCK, Clock
from agents.settings import Settings
from agents.sinks.store import FrameStore, Progress
from schemas.catalog import CATALOG
from schemas.codec import TimeLimits, decode_beacon, decode_k8s_event, decode_samples
from schemas.poll_decode import decode_poll
from schemas.records import UTC_CLOCK, Reject, RejectReason, SampleBatch
from streams.align.aggregate import FrameBatch
from streams.align.aligner import GridAligner, LateSamples, Recovered
from streams.align.clock import ClockParams
from streams.align.clock_domains import ClockDomains
from streams.align.pacing import Pacer
from streams.efficiency.enrich import Enricher, TappedAligner
from streams.formats.pod_labels import PodLabelBook

log = logging.getLogger("agents.ingest.worker")
Record: TypeAlias = "ConsumerRecord[bytes, bytes]"
Poll: TypeAlias = "Mapping[TopicPartition, Sequence[Record]]"
_SENSOR, _EVENTS, _CLOCK = 0, 1, 2
_offset = operator.attrgetter("offset")
# How stale the open-cells gauge may be while samples are open: its exact count reads every open sample (7% of
# the batched worker when taken at every flush, still 9% once a second under a backlog of millions of open
# samples), and Prometheus scrapes it every 15 s or so.
OPEN_CELLS_EVERY_NS = 10_000_000_000


class IngestCore:
    """One worker's processing state over the partitions it owns."""

    def __init__(self, settings: Settings, store: FrameStore, dlq: RejectSink, clock: Clock = SYSTEM_CLOCK,
                 enricher: Enricher | None = None) -> None:
        self.settings = settings
        self.enricher = enricher
        self.topics = Topics(settings.topic_prefix)
        self.stats = IngestStats()
        self.pods = PodLabelBook()
        self.store = store
        self._dlq = dlq
        self._clock = clock
        self._retention_said_ns: int | None = None
        self._route: dict[str, tuple[int, int]] = {t: (_SENSOR, i) for i, t in enumerate(self.topics.sensors)}
        self.sensor_topics = frozenset(self._route)
        self._sensor_index = {t: i for i, t in enumerate(self.topics.sensors)}
        self._route[self.topics.k8s_events] = (_EVENTS, -1)
        self._route[self.topics.clock_sync] = (_CLOCK, -1)
        self._aligners: dict[int, GridAligner] = {}
        self._pacers: dict[int, Pacer] = {}
        # Records handed to an aligner since its last advance: a late verdict comes back from advance() and
        # needs the original bytes. Those placed one by one by (partition, topic index, offset); a block's as the
        # poll's list of its partition and topic (found by offset only when a verdict asks: most never do).
        self._waiting: dict[int, dict[tuple[int, int], Record]] = {}
        self._blocks: dict[int, list[tuple[int, Sequence[Record]]]] = {}
        self._clocks = ClockDomains(ClockParams(), settings.clock_wait_s, clock.mono_ns,
                                    settings.align_params().forget_ns)
        self._progress = Progress(Recovered())
        self._errors_logged: set[str] = set()
        self.dirty = False  # records handled since the last commit point was taken
        self._cells_gauge, self._cells_counted_ns = 0, 0
        # Sees each batch of closed frames as it closes (the shell publishes them at once).
        self.on_frames: Callable[[FrameBatch], None] | None = None

    # -- partitions ----------------------------------------------------------------------
    def assign(self, assigned: Iterable[TopicPartition], progress: Progress) -> None:
        """Own these partitions, starting from what ClickHouse says was done (``progress``)."""
        assigned = list(assigned)
        self._progress = progress
        for ev in progress.pods:
            self.pods.on_event(ev)
        params = self.settings.align_params()
        for p in sorted({tp.partition for tp in assigned} - set(self._aligners)):
            aligner = self._aligners[p] = (GridAligner(params, progress.recovered) if self.enricher is None
                                           else TappedAligner(params, progress.recovered, self.enricher))
            # Every sensor topic of the partition holds it until it delivers or counts as idle.
            aligner.expect(sorted(self._route[tp.topic][1] for tp in assigned
                                  if tp.partition == p and tp.topic in self.sensor_topics))

    def revoke(self, partitions: Iterable[int]) -> None:
        for p in set(partitions):
            self._aligners.pop(p, None)
            self._pacers.pop(p, None)
            self._clocks.drop(p)
            self._waiting.pop(p, None)
            self._blocks.pop(p, None)

    def owns(self, partition: int) -> bool:
        return partition in self._aligners

    # -- a poll --------------------------------------------------------------------------
    def handle(self, poll: Poll) -> dict[TopicPartition, int]:
        """Take one poll's records; returns, per partition handled, the offset of its last record."""
        stats, dlq = self.stats, self._dlq
        s = self.settings
        limits = TimeLimits(self._clock.wall_ns(), int(s.max_age_s * 1e9), int(s.max_future_s * 1e9))
        read: dict[TopicPartition, int] = {}
        # Beacons first: a domain sample whose beacon came in the same poll is placed at once; pod
        # records next, so the samples of the same poll get their workload labels.
        for tp, records in sorted(poll.items(), key=lambda item: (item[0].topic != self.topics.clock_sync,
                                                                  item[0].topic != self.topics.k8s_events)):
            aligner = self._aligners.get(tp.partition)
            if aligner is None or not records:
                continue  # revoked while this poll was in flight: the new owner reads it
            kind, si = self._route[tp.topic]
            stats.messages += len(records)
            if kind == _SENSOR:
                self._sensor_records(tp, records, si, aligner, limits)
            elif kind == _EVENTS:
                done = self._progress.events_done.get((tp.topic, tp.partition), -1)
                for rec in records:
                    try:
                        ev = decode_k8s_event(rec.value or b"")
                        if isinstance(ev, Reject):
                            dlq.send(ev, rec.value, rec.key, tp.topic, tp.partition, rec.offset, rec.headers)
                            continue
                        self.pods.on_event(ev)  # replayed ones too: the labels hold until a newer record
                        if rec.offset > done:
                            self.store.add_event(ev, tp.topic, tp.partition, rec.offset)
                    except Exception as exc:
                        self._internal_error(exc, rec, tp)
            else:
                for rec in records:
                    try:
                        beacon = decode_beacon(rec.value or b"")
                        if isinstance(beacon, Reject):
                            dlq.send(beacon, rec.value, rec.key, tp.topic, tp.partition, rec.offset, rec.headers)
                        else:
                            stats.beacons += 1
                            self._clocks.beacon(tp.partition, beacon, rec.offset)
                    except Exception as exc:
                        self._internal_error(exc, rec, tp)
            read[tp] = records[-1].offset
        stats.rejects = dlq.counts
        self.dirty = True
        return read

    def _sensor_records(self, tp: TopicPartition, records: Sequence[Record], si: int, aligner: GridAligner,
                        limits: TimeLimits) -> None:
        """A partition's sample messages of this poll: the accepted ones in UTC placed as one block, the rest one by
        one (a clock domain's, and the rejects, dead-lettered)."""
        name = CATALOG[si].name
        waiting = self._waiting.setdefault(tp.partition, {})
        try:
            block, rest = decode_poll([rec.value or b"" for rec in records], name, limits)
        except Exception:  # a bug of ours: each record decoded alone (and dead-lettered alone if it trips it again)
            for rec in records:
                self._sensor_record(tp, rec, None, si, aligner, waiting, limits)
            return
        if len(block.index) < len(records):  # else all in the block (the usual poll)
            for rec, got in zip(records, rest, strict=True):
                if got is not None:
                    self._sensor_record(tp, rec, got, si, aligner, waiting, limits)
        if not block.index:
            return
        try:
            pods, labels = self.pods, block.labels
            if pods.known:  # the Kubernetes collector knows some nodes' pods and their workloads
                labels = [pods.filled(node, gpu, lab) for node, gpu, lab in zip(block.nodes, block.gpus, labels,
                                                                                  strict=True)]
            offsets = (list(map(_offset, records)) if len(block.index) == len(records)
                       else [records[i].offset for i in block.index])
            aligner.add_block(si, block.nodes, block.gpus, labels, block.lens, block.ts_ns, block.value, si, offsets)
        except Exception:  # a bug of ours in the block: its records one by one, as a poll that tripped the decode
            for i in block.index:
                self._sensor_record(tp, records[i], None, si, aligner, waiting, limits)
            return
        self._blocks.setdefault(tp.partition, []).append((si, records))
        self.stats.samples += len(block.ts_ns)

    def _sensor_record(self, tp: TopicPartition, rec: Record, res: SampleBatch | Reject | None, si: int,
                       aligner: GridAligner, waiting: dict[tuple[int, int], Record], limits: TimeLimits) -> None:
        """One sample message, decoded already (``res``) or here."""
        try:  # zero cost unless it raises (3.11)
            if res is None:
                res = decode_samples(rec.value or b"", CATALOG[si].name, limits)
            if isinstance(res, Reject):
                self._dlq.send(res, rec.value, rec.key, tp.topic, tp.partition, rec.offset, rec.headers)
                return
            labels = self.pods.filled(res.node, res.gpu, res.labels)
            if labels is not res.labels:
                res = dataclasses.replace(res, labels=labels)
            if res.clock != UTC_CLOCK:  # placed with a beacon read after it, or held for one
                # Its own copy: a view would keep the whole poll's columns while it waits.
                res = dataclasses.replace(res, ts_ns=np.array(res.ts_ns, np.int64),
                                          value=np.array(res.value, np.float64))
                self._clocks.offer(tp.partition, aligner, waiting, rec, res, si)
            else:
                aligner.add(res.node, res.gpu, si, res.ts_ns, res.value, res.labels, si, rec.offset)
                waiting[(si, rec.offset)] = rec
            self.stats.samples += len(res.ts_ns)
        except Exception as exc:
            self._internal_error(exc, rec, tp)

    def _internal_error(self, exc: Exception, rec: Record, tp: TopicPartition) -> None:
        """A record that tripped a bug of ours: dead-lettered with the exception, the worker goes on
        (a crash would replay it forever, since the commit stays behind it)."""
        what = type(exc).__name__
        self.stats.internal_errors += 1
        if what not in self._errors_logged:  # the traceback once per kind, not once per record
            self._errors_logged.add(what)
            log.error("internal error on %s[%d]@%d, sent to the dead-letter topic (further %s errors are only "
                      "counted)", tp.topic, tp.partition, rec.offset, what, exc_info=exc)
        self._dlq.send(Reject(RejectReason.INTERNAL_ERROR, f"{what}: {exc}"), rec.value, rec.key, tp.topic,
                       tp.partition, rec.offset, rec.headers)

    def advance(self, quiet: Mapping[TopicPartition, int]) -> None:
        """Close what the watermarks allow; ``quiet`` is each sensor partition's quiet clock (ns)."""
        now = self._clock.wall_ns()
        hold = self._place_held()
        self.dead_letter_expired()
        by_part: dict[int, dict[int, int]] = {}
        for tp, q in quiet.items():
            by_part.setdefault(tp.partition, {})[self._route[tp.topic][1]] = q
        for p, aligner in self._aligners.items():
            adv = aligner.advance(now, hold.get(p), by_part.get(p, {}))
            self._add_frames(adv.frames)
            for late in adv.late:
                self._late(p, late)
            self._waiting.pop(p, None)
            self._blocks.pop(p, None)

    def paced(self, unread: Collection[TopicPartition]) -> set[TopicPartition]:
        """Of the sensor partitions with records still to read (``unread``), those to leave in Kafka for now: the
        ones read ahead of their partition's slowest while its open cells fill up (``streams.align.pacing``)."""
        mine: dict[int, dict[Hashable, TopicPartition]] = {}
        for tp in unread:
            if tp.topic in self.sensor_topics:
                mine.setdefault(tp.partition, {})[self._route[tp.topic][1]] = tp
        out: set[TopicPartition] = set()
        for p, aligner in self._aligners.items():
            pacer = self._pacers.get(p)
            if pacer is None:
                params = aligner.params
                pacer = self._pacers[p] = Pacer(params.max_open_samples, params.allowed_lateness_ns + params.grid_ns)
            tps = mine.get(p, {})
            out.update(tps[si] for si in pacer.paused(aligner.open_samples(), aligner.source_newest(), tps.keys()))
        return out

    def drain(self) -> None:
        """Close every open cell: the input is bounded and has been read completely."""
        self._place_held()
        self.dead_letter_expired()
        for p, aligner in self._aligners.items():
            adv = aligner.flush_all()
            self._add_frames(adv.frames)
            for late in adv.late:
                self._late(p, late)

    def _add_frames(self, batch: FrameBatch) -> None:
        if self.enricher is not None and len(batch):
            try:
                self.enricher.enrich(batch)
            except Exception as exc:
                # The frames are stored all the same, with NULL derived columns: a bug in
                # the derivation must not lose measurements.
                self.stats.internal_errors += 1
                if "enrich" not in self._errors_logged:
                    self._errors_logged.add("enrich")
                    log.error("deriving frame columns failed; frames are stored without them", exc_info=exc)
        self._past_retention(batch)
        self.store.add_frames(batch)
        if self.on_frames is not None and len(batch):
            self.on_frames(batch)

    def _past_retention(self, batch: FrameBatch) -> None:
        """Count (and say, at most once a minute) frames older than ``gpu_frames``' retention: ClickHouse
        drops them at its next merge, so a replay of an old recording would otherwise leave nothing, silently."""
        if not len(batch):
            return
        now = self._clock.wall_ns()
        limit = now - self.settings.frames_retention_days * 86_400 * 1_000_000_000
        old = int((batch.tick_ns < limit).sum())
        if not old:
            return
        self.stats.frames_past_retention += old
        if self._retention_said_ns is None or now - self._retention_said_ns >= 60_000_000_000:
            self._retention_said_ns = now
            log.warning("%d frames written so far are older than gpu_frames' retention (%d days, "
                        "FLOPWATCH_FRAMES_RETENTION_DAYS): ClickHouse drops them at its next merge",
                        self.stats.frames_past_retention, self.settings.frames_retention_days)

    def _place_held(self) -> dict[int, int]:
        hold = self._clocks.place_held(self._aligners, self._waiting)
        self.stats.held = self._clocks.held
        return hold

    def dead_letter_expired(self) -> None:
        """Send domain samples that waited too long for a beacon to the dead-letter topic."""
        expired, self._clocks.expired = self._clocks.expired, []
        for partition, h, why in expired:
            b = h.batch
            self._dlq.send(Reject(RejectReason.NO_CLOCK, f"no clock.sync beacon of {b.clock!r} on {b.node} after "
                                  f"these samples: {why}"), h.rec.value, h.rec.key, self.topics.sensor(h.sensor),
                           partition, h.rec.offset, h.rec.headers)
        if expired:
            self.stats.rejects = self._dlq.counts

    def _late(self, partition: int, late: LateSamples) -> None:
        assert isinstance(late.source, int)
        si = late.source
        rec = self._waiting_record(partition, si, late.position)
        topic = self.topics.sensor(si)
        if late.position < self._progress.consumed.get((topic, partition), -1):
            self.stats.replayed_dropped += len(late.indices)  # already in a written frame
            return
        node = rec.key.decode(errors="replace") if rec.key else "?"
        self.stats.late[f"{node}/{CATALOG[si].name}"] += len(late.indices)
        detail = late_detail(self.settings, late, CATALOG[si].cadence == "step")
        self._dlq.send(Reject(RejectReason.LATE, detail), rec.value, rec.key, topic, partition, late.position,
                       rec.headers, indices=late.indices if late.total > 1 else None)
        self.stats.rejects = self._dlq.counts

    def _waiting_record(self, partition: int, si: int, offset: int) -> Record:
        rec = self._waiting.get(partition, {}).get((si, offset))
        if rec is not None:
            return rec
        for s, records in self._blocks.get(partition, ()):
            if s == si:  # a partition's records of one poll, in offset order
                i = bisect.bisect_left(records, offset, key=_offset)
                if i < len(records) and records[i].offset == offset:
                    return records[i]
        raise KeyError(f"no record waits at {CATALOG[si].name}[{partition}]@{offset}")

    # -- what a flush needs --------------------------------------------------------------
    def commit_points(self, read: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Per partition, how far a commit may go once what is closed so far is written."""
        oldest = {p: a.oldest_positions() for p, a in self._aligners.items()}
        return commit_offsets(read, sensor_index=self._sensor_index, clock_topic=self.topics.clock_sync,
                              open_oldest=oldest, held_oldest=self._clocks.oldest_held(),
                              beacon_pins=self._clocks.pins(oldest))

    def closed_ticks(self) -> dict[str, int]:
        return {n: t for a in self._aligners.values() for n, t in a.closed_ticks().items()}

    def open_cells(self) -> int:
        return sum(a.open_cells() for a in self._aligners.values())

    def open_cells_gauge(self, now_ns: int) -> int:
        """``open_cells`` as a gauge: exact when nothing is open (0) and when something opens after that, else
        counted again at most every ``OPEN_CELLS_EVERY_NS`` of ``now_ns`` (a monotonic clock), the count before
        standing in meanwhile. Never 0 while samples are open, so "drained" reads stay exact."""
        if not self.open_samples():
            self._cells_gauge = 0
        elif not self._cells_gauge or now_ns - self._cells_counted_ns >= OPEN_CELLS_EVERY_NS:
            self._cells_gauge, self._cells_counted_ns = self.open_cells(), now_ns
        return self._cells_gauge

    def open_samples(self) -> int:
        return sum(a.open_samples() for a in self._aligners.values())

    def nodes_held(self) -> int:
        return sum(a.nodes_held() for a in self._aligners.values())
