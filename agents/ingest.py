"""The ingest worker: Kafka sensor topics -> validation -> grid alignment -> ClickHouse.

Why a batch consumer and not one Faust agent per topic: a Faust event costs ~80 µs
of machinery (DESIGN.md, Kafka), which caps single-sample messages near 12,000/s;
aiokafka's ``getmany`` hands over thousands of records per call, so the per-sample
cost is ours alone. The same worker also runs as a service of the Faust app
(``agents.app``, ``flopwatch worker --runtime faust``).

No loss, no duplicates, and why offsets are held back
-----------------------------------------------------
A sample sitting in an open grid cell is not durable yet. Rather than ack it and
hope, the worker commits, per partition, only up to the oldest offset an open cell
still depends on (``GridAligner.oldest_positions``), and only after the frames
closed so far are in ClickHouse. After a crash or a rebalance, the next owner
re-reads from that offset and rebuilds exactly the lost cells. Replayed samples
whose tick is already written (ClickHouse's newest tick per node) are dropped, and
the recorded read position tells a replayed sample from a genuinely late one,
which goes to the dead-letter topic. Nothing is kept in Kafka changelogs: the
state is small, rebuilt from Kafka, and ClickHouse is the single record of what
was written.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import CommitFailedError

from agents.clickhouse import Backend, ensure_schema, open_backend
from agents.clocks import ClockDomains
from agents.deadletter import DeadLetter
from agents.positions import Positions
from agents.producer import SampleProducer
from agents.settings import Settings
from agents.store import FrameStore, Pending, Progress
from agents.topics import Topics, aiokafka_config
from schemas.catalog import CATALOG
from schemas.codec import TimeLimits, decode_beacon, decode_k8s_event, decode_samples
from schemas.records import UTC_CLOCK, Reject, RejectReason
from streams.align import GridAligner, LateSamples, Recovered
from streams.clock import ClockParams

log = logging.getLogger(__name__)
_SENSOR, _EVENTS, _CLOCK = 0, 1, 2
COMMIT_TIMEOUT_S = 30.0
COMMIT_GIVE_UP_S = 300.0  # commits failing this long (the broker or the topics are gone): the worker stops


class CommitError(RuntimeError):
    """Kafka did not take an offset commit; the worker stops (nothing is lost: it replays)."""


@dataclass(slots=True)
class IngestStats:
    """Running totals, for progress display and the benchmark."""

    messages: int = 0
    samples: int = 0
    frames_written: int = 0
    events_written: int = 0
    beacons: int = 0
    replayed_dropped: int = 0
    commits_refused: int = 0  # commits Kafka turned down because the group had rebalanced
    commits_failed: int = 0  # commits that timed out (Kafka unreachable); a later flush commits again
    internal_errors: int = 0  # records that tripped a bug of ours (dead-lettered as internal_error)
    rejects: Counter[str] = field(default_factory=Counter)
    lag: int | None = None  # records behind the end of the assigned partitions; None: not known yet
    flushes: int = 0
    open_cells: int = 0
    held: int = 0  # clock-domain sample messages waiting for a beacon
    late: Counter[str] = field(default_factory=Counter)  # late samples by "node/sensor"
    first_record_ns: int = 0  # monotonic; for throughput figures

    def as_dict(self) -> dict[str, Any]:
        return {"messages": self.messages, "samples": self.samples, "frames_written": self.frames_written,
                "events_written": self.events_written, "beacons": self.beacons,
                "replayed_dropped": self.replayed_dropped, "commits_refused": self.commits_refused,
                "commits_failed": self.commits_failed, "internal_errors": self.internal_errors,
                "rejects": dict(self.rejects), "lag": self.lag,
                "flushes": self.flushes, "open_cells": self.open_cells, "held": self.held,
                "late": dict(self.late)}


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, ingestor: Ingestor) -> None:
        self._ingestor = ingestor

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._ingestor.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self._ingestor.on_assigned(assigned)


class Ingestor:
    """One worker process's consumer loop; ``run`` returns when ``stop`` is set."""

    def __init__(self, settings: Settings, backend_factory: Callable[[Settings], Backend] = open_backend,
                 clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.stats = IngestStats()
        self._clock_ns = clock_ns
        self._backend_factory = backend_factory
        # chDB is bound to the thread that opened it; every ClickHouse call goes through this one.
        self._ch = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="clickhouse")
        self._route: dict[str, tuple[int, int]] = {t: (_SENSOR, i) for i, t in enumerate(self.topics.sensors)}
        self._sensor_topics = frozenset(self._route)
        self._route[self.topics.k8s_events] = (_EVENTS, -1)
        self._route[self.topics.clock_sync] = (_CLOCK, -1)
        self._aligners: dict[int, GridAligner] = {}
        self._pos = Positions(wall_ns=clock_ns)  # read positions and the sensor partitions' quiet clocks
        # Records handed to an aligner since its last advance, by (partition, topic index, offset):
        # a late verdict comes back from advance() and needs the original bytes.
        self._waiting: dict[int, dict[tuple[int, int], ConsumerRecord[bytes, bytes]]] = {}
        self._clocks = ClockDomains(ClockParams(), settings.clock_wait_s)
        self._progress = Progress(Recovered())
        self._dirty = False
        self._lock = asyncio.Lock()
        self._store: FrameStore | None = None
        self._dlq: DeadLetter | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._last_flush = 0
        self._inflight: asyncio.Future[None] | None = None
        self._on_flush: Callable[[IngestStats], None] | None = None
        self._commit_failing_since = 0.0
        self._errors_logged: set[str] = set()

    async def _on_ch(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._ch, fn, *args)

    # -- partitions ----------------------------------------------------------------------
    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        async with self._lock:
            assert self._store is not None
            self._pos.assigned(tp for tp in assigned if tp.topic in self._sensor_topics)
            self._progress = await self._on_ch(self._store.recover)
            params = self.settings.align_params()
            for p in sorted({tp.partition for tp in assigned} - set(self._aligners)):
                aligner = self._aligners[p] = GridAligner(params, self._progress.recovered)
                # Every sensor topic of the partition holds it until it delivers or counts as idle.
                aligner.expect(sorted(self._route[tp.topic][1] for tp in assigned
                                      if tp.partition == p and tp.topic in self._sensor_topics))
            log.info("assigned partitions %s", sorted({tp.partition for tp in assigned}))

    async def on_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self._lock:
            self._pos.revoked(revoked)
            await self._flush_locked()
            for p in {tp.partition for tp in revoked}:
                self._aligners.pop(p, None)
                self._clocks.drop(p)
            for tp in revoked:
                self._waiting.pop(tp.partition, None)
            log.info("revoked partitions %s", sorted({tp.partition for tp in revoked}))

    # -- the loop ------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event, on_flush: Callable[[IngestStats], None] | None = None,
                  drain: bool = False) -> IngestStats:
        """Consume until ``stop`` is set, then write what is final and commit.

        ``drain`` also closes every open cell at the end: right for a bounded input
        that has been read completely (a replay, a benchmark), wrong for a live
        stream, whose open cells the next worker rebuilds from Kafka instead.
        """
        s = self.settings
        self._on_flush = on_flush
        backend = await self._on_ch(self._backend_factory, s)
        await self._on_ch(ensure_schema, backend)
        self._store = FrameStore(backend)
        self._dlq = DeadLetter(SampleProducer(s), self.topics.dlq)
        consumer = AIOKafkaConsumer(
            **aiokafka_config(s), group_id=s.group_id, enable_auto_commit=False, auto_offset_reset="earliest",
            partition_assignment_strategy=(RangePartitionAssignor,),  # partition p of every topic together
            max_poll_records=s.max_poll_records, fetch_max_bytes=64 * 1024 * 1024,
            max_partition_fetch_bytes=4 * 1024 * 1024, client_id="flopwatch-ingest")
        self._consumer = consumer
        consumer.subscribe(self.topics.inputs, listener=_Listener(self))
        await consumer.start()
        self._last_flush = time.monotonic_ns()
        try:
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=100)
                if not batch and not consumer.assignment():
                    await asyncio.sleep(0.1)  # no partitions (yet, or topics gone): don't spin
                due = time.monotonic_ns() - self._last_flush >= s.flush_interval_ms * 1_000_000
                if due or self._pos.unknown(consumer):
                    await self._pos.probe(consumer)  # outside the lock (Positions.probe says why)
                async with self._lock:
                    if batch:
                        self._handle(batch)
                        if not self.stats.first_record_ns:
                            self.stats.first_record_ns = time.monotonic_ns()
                    self._pos.tick_quiet(consumer)
                    self._advance()
                    flushed = self._store.pending_rows >= s.flush_rows or (due and self._has_work())
                    if flushed:
                        await self._flush_locked(wait=False)
                    elif due:
                        self._last_flush = time.monotonic_ns()  # nothing to write; look again later
                    if flushed or due:
                        self.stats.lag = self._pos.lag(consumer)
            async with self._lock:
                if drain:
                    self._place_held()
                    self._dead_letter_expired()
                    for p, aligner in self._aligners.items():
                        adv = aligner.flush_all()
                        self._store.add_frames(adv.frames)
                        for late in adv.late:
                            self._late(p, late)
                await self._flush_locked()
        finally:
            if self._inflight is not None and not self._inflight.done():
                self._inflight.cancel()  # not committed, so the next owner rewrites it
            try:
                # Leaving the group lets the others rebalance at once; bounded, because a
                # consumer whose topics vanished can hang here.
                await asyncio.wait_for(consumer.stop(), 15.0)
            except TimeoutError:
                log.warning("Kafka consumer did not stop within 15 s; leaving anyway")
            await self._on_ch(backend.close)
            self._ch.shutdown(wait=True)
            try:
                if self._dlq is not None:
                    self._dlq.close()
            except Exception as exc:  # a reject not acknowledged now is re-sent by the replay
                log.warning("dead-letter producer did not flush on close: %s", exc)
        return self.stats

    def _has_work(self) -> bool:
        assert self._store is not None
        return self._dirty or self._store.pending_rows > 0

    def _handle(self, batch: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]) -> None:
        assert self._store is not None and self._dlq is not None
        stats = self.stats
        limits = TimeLimits(self._clock_ns(), int(self.settings.max_age_s * 1e9), int(self.settings.max_future_s * 1e9))
        dlq = self._dlq
        # Beacons first: a domain sample whose beacon came in the same poll is placed at once.
        for tp, records in sorted(batch.items(), key=lambda item: item[0].topic != self.topics.clock_sync):
            aligner = self._aligners.get(tp.partition)
            if aligner is None or not records:
                continue  # revoked while this batch was in flight: the new owner reads it
            kind, si = self._route[tp.topic]
            stats.messages += len(records)
            if kind == _SENSOR:
                name = CATALOG[si].name
                waiting = self._waiting.setdefault(tp.partition, {})
                clocks = self._clocks
                now = time.monotonic()
                for rec in records:
                    try:  # zero cost unless it raises (3.11)
                        res = decode_samples(rec.value or b"", name, limits)
                        if isinstance(res, Reject):
                            dlq.send(res, rec.value, rec.key, tp.topic, tp.partition, rec.offset, rec.headers)
                            continue
                        if res.clock != UTC_CLOCK:  # placed with a beacon read after it, or held for one
                            clocks.offer(tp.partition, aligner, waiting, rec, res, si, now)
                        else:
                            aligner.add(res.node, res.gpu, si, res.ts_ns, res.value, res.labels, si, rec.offset)
                            waiting[(si, rec.offset)] = rec
                        stats.samples += len(res.ts_ns)
                    except Exception as exc:
                        self._internal_error(exc, rec, tp)
            elif kind == _EVENTS:
                done = self._progress.events_done.get((tp.topic, tp.partition), -1)
                for rec in records:
                    try:
                        ev = decode_k8s_event(rec.value or b"")
                        if isinstance(ev, Reject):
                            dlq.send(ev, rec.value, rec.key, tp.topic, tp.partition, rec.offset, rec.headers)
                        elif rec.offset > done:
                            self._store.add_event(ev, tp.topic, tp.partition, rec.offset)
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
            self._pos.read(tp, records[-1].offset)
        stats.rejects = dlq.counts
        self._dirty = True

    def _internal_error(self, exc: Exception, rec: ConsumerRecord[bytes, bytes], tp: TopicPartition) -> None:
        """A record that tripped a bug of ours: dead-lettered with the exception, the worker goes on
        (a crash would replay it forever, since the commit stays behind it)."""
        assert self._dlq is not None
        what = type(exc).__name__
        self.stats.internal_errors += 1
        if what not in self._errors_logged:  # the traceback once per kind, not once per record
            self._errors_logged.add(what)
            log.error("internal error on %s[%d]@%d, sent to the dead-letter topic (further %s errors are only "
                      "counted)", tp.topic, tp.partition, rec.offset, what, exc_info=exc)
        self._dlq.send(Reject(RejectReason.INTERNAL_ERROR, f"{what}: {exc}"), rec.value, rec.key, tp.topic,
                       tp.partition, rec.offset, rec.headers)

    def _place_held(self) -> dict[int, int]:
        hold = self._clocks.place_held(self._aligners, self._waiting)
        self.stats.held = self._clocks.held
        return hold

    def _dead_letter_expired(self) -> None:
        assert self._dlq is not None
        expired, self._clocks.expired = self._clocks.expired, []
        for partition, h, why in expired:
            b = h.batch
            self._dlq.send(Reject(RejectReason.NO_CLOCK, f"no clock.sync beacon of {b.clock!r} on {b.node} after "
                                  f"these samples: {why}"), h.rec.value, h.rec.key, self.topics.sensor(h.sensor),
                           partition, h.rec.offset, h.rec.headers)
        if expired:
            self.stats.rejects = self._dlq.counts

    def _advance(self) -> None:
        assert self._store is not None
        now = self._clock_ns()
        hold = self._place_held()
        self._dead_letter_expired()
        quiet: dict[int, dict[int, int]] = {}
        for tp, q in self._pos.quiet.items():
            quiet.setdefault(tp.partition, {})[self._route[tp.topic][1]] = q
        for p, aligner in self._aligners.items():
            adv = aligner.advance(now, hold.get(p), quiet.get(p, {}))
            self._store.add_frames(adv.frames)
            for late in adv.late:
                self._late(p, late)
            self._waiting.pop(p, None)

    def _late(self, partition: int, late: LateSamples) -> None:
        assert self._dlq is not None and isinstance(late.source, int)
        si = late.source
        rec = self._waiting[partition][(si, late.position)]
        topic = self.topics.sensor(si)
        if late.position < self._progress.consumed.get((topic, partition), -1):
            self.stats.replayed_dropped += len(late.indices)  # already in a written frame
            return
        node = rec.key.decode(errors="replace") if rec.key else "?"
        self.stats.late[f"{node}/{CATALOG[si].name}"] += len(late.indices)
        if late.why == "disorder":
            why = (f"they are older than their series' newest sample by more than the allowed lateness "
                   f"({self.settings.lateness_ms} ms)")
        else:
            why = (f"they arrived after their topic or series had fallen behind and been quiet for "
                   f"{self.settings.source_idle_s:g} s (FLOPWATCH_SOURCE_IDLE_S) while the others moved on")
        detail = f"{len(late.indices)} of {late.total} samples fall in grid cells already written: {why}"
        self._dlq.send(Reject(RejectReason.LATE, detail), rec.value, rec.key, topic, partition, late.position,
                       rec.headers, indices=late.indices if late.total > 1 else None)
        self.stats.rejects = self._dlq.counts

    async def _flush_locked(self, wait: bool = True) -> None:
        """Start writing what is final, then commit; ``wait=False`` lets the loop go on meanwhile.

        One write is in flight at most: the next flush first waits for the previous
        one, so commits stay in order and each covers only what its write made durable.
        """
        store, dlq, consumer = self._store, self._dlq, self._consumer
        assert store is not None and dlq is not None and consumer is not None
        await self._settle()
        self._dead_letter_expired()  # before the commit moves past them
        # Commit points first, while the emitted frames and open cells are in step.
        commit: dict[TopicPartition, int] = {}
        oldest = {p: a.oldest_positions() for p, a in self._aligners.items()}
        assigned = consumer.assignment()
        self._pos.forget_unassigned(assigned)
        beacon_pins = self._clocks.pins(oldest)
        waiting = self._clocks.oldest_held()  # (partition, topic index) -> oldest held offset
        for tp, nxt in self._pos.next.items():
            kind, si = self._route[tp.topic]
            held: int | None = None
            if kind == _SENSOR:
                held = oldest.get(tp.partition, {}).get(si)
                w = waiting.get((tp.partition, si))
                if w is not None and (held is None or w < held):
                    held = w
            elif kind == _CLOCK:
                held = beacon_pins.get(tp.partition)
            commit[tp] = nxt if held is None else min(nxt, held)
        consumed = {(tp.topic, tp.partition): nxt for tp, nxt in self._pos.next.items()}
        closed = {n: t for a in self._aligners.values() for n, t in a.closed_ticks().items()}
        pending = store.detach()
        self._last_flush = time.monotonic_ns()
        self._dirty = False
        self.stats.open_cells = sum(a.open_cells() for a in self._aligners.values())
        self._inflight = asyncio.ensure_future(self._write(pending, consumed, commit, closed))
        if wait:
            await self._settle()

    async def _write(self, pending: Pending, consumed: dict[tuple[str, int], int],
                     commit: dict[TopicPartition, int], closed: dict[str, int]) -> None:
        store, dlq, consumer = self._store, self._dlq, self._consumer
        assert store is not None and dlq is not None and consumer is not None
        await self._on_ch(dlq.flush)  # rejects before the offsets that produced them are committed
        await self._on_ch(store.write, pending, consumed, self._clock_ns() // 1_000_000, closed)
        if commit:
            try:
                # aiokafka retries a commit forever on "retriable" errors (a deleted topic, a
                # lost coordinator); a worker that cannot commit must stop and say so instead.
                await asyncio.wait_for(consumer.commit(commit), COMMIT_TIMEOUT_S)
            except CommitFailedError as exc:
                # The group moved on (this worker missed a rebalance): the rows are written, the
                # partitions' new owners replay from the last commit and drop what is written.
                log.warning("offset commit refused after a rebalance; the new owners replay: %s", exc)
                self.stats.commits_refused += 1
            except TimeoutError:
                # Kafka unreachable (a broker restart): the rows are written, and the next flush
                # commits past this point anyway. Only a broker gone for good stops the worker.
                now = time.monotonic()
                self._commit_failing_since = self._commit_failing_since or now
                self.stats.commits_failed += 1
                if now - self._commit_failing_since > COMMIT_GIVE_UP_S:
                    raise CommitError(f"no offset commit completed in {COMMIT_GIVE_UP_S:.0f} s; the rows are "
                                      "written, and the next worker resumes from the last committed offsets") from None
                log.warning("offset commit did not complete in %.0f s (Kafka unreachable?); the rows are written "
                            "and the next flush commits again", COMMIT_TIMEOUT_S)
            else:
                self._commit_failing_since = 0.0
        st = self.stats
        st.frames_written, st.events_written = store.frames_written, store.events_written
        st.flushes += 1
        if self._on_flush is not None:
            self._on_flush(st)

    async def _settle(self) -> None:
        task, self._inflight = self._inflight, None
        if task is not None:
            await task
