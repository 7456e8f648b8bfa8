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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import CommitFailedError

from agents.ingest.core import IngestCore
from agents.ingest.outage import Outage
from agents.ingest.poll_size import PollSize
from agents.ingest.positions import Positions
from agents.ingest.pricebook_file import PriceBookFile
from agents.ingest.stats import IngestStats
from agents.kafka.producer import SampleProducer
from agents.kafka.topics import Topics, aiokafka_config
from agents.runtime.give_way import AgentQueues
from agents.runtime.timebase import SYSTEM_CLOCK, Clock
from agents.settings import Settings
from agents.sinks.clickhouse import Backend, ClickHouseUnreachable, open_backend
from agents.sinks.deadletter import DeadLetter
from agents.sinks.frames_out import FramePublisher
from agents.sinks.schema import ensure_for
from agents.sinks.store import FrameStore, Pending
from streams.efficiency.enrich import Enricher

__all__ = ["CommitError", "IngestStats", "Ingestor"]
log = logging.getLogger(__name__)
COMMIT_TIMEOUT_S = 30.0
CLICKHOUSE_READY_S = 120.0
COMMIT_GIVE_UP_S = 300.0  # commits failing this long (the broker or the topics are gone): the worker stops


class CommitError(RuntimeError):
    """Kafka did not take an offset commit; the worker stops (nothing is lost: it replays)."""


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, ingestor: Ingestor) -> None:
        self._ingestor = ingestor

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._ingestor.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self._ingestor.on_assigned(assigned)


class Ingestor:
    """One worker process's consumer loop around an ``IngestCore``; ``run`` returns when ``stop`` is set."""

    def __init__(self, settings: Settings, backend_factory: Callable[[Settings], Backend] = open_backend,
                 clock: Clock = SYSTEM_CLOCK, agents: AgentQueues | None = None) -> None:
        self.settings = settings
        self.agents = agents if agents is not None else AgentQueues()  # the agents of this process, which go first
        self.topics = Topics(settings.topic_prefix)
        self.stats = IngestStats()
        self._clock = clock
        self._backend_factory = backend_factory
        # chDB is bound to the thread that opened it; every ClickHouse call goes through this one.
        self._ch = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="clickhouse")
        self._pos = Positions(mono_ns=clock.mono_ns, wall_ns=clock.wall_ns)  # read positions, quiet clocks
        self._lock = asyncio.Lock()
        self._core: IngestCore | None = None
        self._store: FrameStore | None = None
        self._dlq: DeadLetter | None = None
        self._frames: FramePublisher | None = None
        self._backend: Backend | None = None
        self._ch_ready = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._last_flush = 0
        self._inflight: asyncio.Future[None] | None = None
        self._on_flush: Callable[[IngestStats], None] | None = None
        self._commit_failing_since = 0
        self._outage = Outage(settings.flush_rows)
        self._poll = PollSize(settings.max_poll_records)  # records a poll asks for: a turn stays short
        self._stopping: asyncio.Event | None = None

    async def _on_ch(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._ch, fn, *args)

    async def on_clickhouse(self, fn: Callable[[Backend], Any]) -> Any:
        """Run ``fn(backend)`` on the worker's ClickHouse thread (chDB is bound to one thread), once
        the worker has opened it; for the agents of the same process."""
        # Bounded: a worker whose ClickHouse never opened has crashed (agents.app), not hung.
        await asyncio.wait_for(self._ch_ready.wait(), CLICKHOUSE_READY_S)
        return await self._on_ch(fn, self._backend)

    # -- partitions ----------------------------------------------------------------------
    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        async with self._lock:
            assert self._store is not None and self._core is not None
            self._pos.assigned(tp for tp in assigned if tp.topic in self._core.sensor_topics)
            self._core.assign(assigned, await self._on_ch(self._store.recover))
            log.info("assigned partitions %s", sorted({tp.partition for tp in assigned}))

    async def on_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self._lock:
            assert self._core is not None
            # Written and committed while still owned: the write's progress marks then cover every record
            # its frames came from, so the next owner's replay drops those samples instead of calling them late.
            await self._flush_locked()
            self._pos.revoked(revoked)
            self._core.revoke(tp.partition for tp in revoked)
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
        self._stopping = stop
        backend = self._backend = await self._on_ch(self._backend_factory, s)
        await self._on_ch(ensure_for, backend, s)
        self._ch_ready.set()
        store = self._store = FrameStore(backend)
        self._dlq = DeadLetter(SampleProducer(s), self.topics.dlq)
        enricher = None
        if s.derive:
            prices = PriceBookFile(Path(s.price_book) if s.price_book else None, self._clock)
            prices.current()  # a missing or invalid price book stops the worker here, with its path and line
            # The enricher asks for the book per batch: current() re-reads an edited file, at most once a second.
            enricher = Enricher(prices.current, s.align_params().grid_ns)
        if s.publish_frames:
            self._frames = FramePublisher(SampleProducer(s), self.topics.frames, s.align_params().grid_ns)
        core = self._core = IngestCore(s, store, self._dlq, self._clock, enricher)
        if self._frames is not None:
            core.on_frames = self._frames.publish
        self.stats = core.stats
        consumer = AIOKafkaConsumer(
            **aiokafka_config(s), group_id=s.group_id, enable_auto_commit=False, auto_offset_reset="earliest",
            partition_assignment_strategy=(RangePartitionAssignor,),  # partition p of every topic together
            max_poll_records=s.max_poll_records, fetch_max_bytes=64 * 1024 * 1024,
            max_partition_fetch_bytes=4 * 1024 * 1024, client_id="flopwatch-ingest",
            session_timeout_ms=int(s.kafka_session_timeout_s * 1000),
            heartbeat_interval_ms=min(3000, int(s.kafka_session_timeout_s * 1000) // 3))
        self._consumer = consumer
        consumer.subscribe(self.topics.inputs, listener=_Listener(self))
        await consumer.start()
        mono = self._clock.mono_ns
        self._last_flush = mono()
        try:
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=100, max_records=self._poll.asked)
                if not batch and not consumer.assignment():
                    await asyncio.sleep(0.1)  # no partitions (yet, or topics gone): don't spin
                due = mono() - self._last_flush >= s.flush_interval_ms * 1_000_000
                if due or self._pos.unknown(consumer):
                    await self._pos.probe(consumer)  # outside the lock (Positions.probe says why)
                async with self._lock:
                    turn = time.perf_counter()
                    if batch:
                        if not self.stats.first_record_ns:  # before the work: a throughput figure counts it all
                            self.stats.first_record_ns = mono()
                            self.stats.first_record_cpu_s = time.process_time()
                        self._handle(batch)
                    self._pos.tick_quiet(consumer)
                    core.advance(self._pos.quiet)
                    self._poll.took(sum(map(len, batch.values())), time.perf_counter() - turn)
                    # One write in flight: while it waits (for ClickHouse, agents.ingest.outage) the loop
                    # reads on, up to a bound, and the next flush starts once it is through.
                    writing = self._inflight is not None and not self._inflight.done()
                    if not self._outage.should_pause(store.pending_rows, writing):
                        self._outage.should_resume(writing)
                    self._set_paused(consumer, core)
                    want = store.pending_rows >= s.flush_rows or (due and self._has_work())
                    flushed = want and not writing
                    if flushed:
                        await self._flush_locked(wait=False)
                    elif due and not want:
                        self._last_flush = mono()  # nothing to write; look again later
                    if flushed or due:
                        self.stats.lag = self._pos.lag(consumer)
                # getmany returns without suspending while records are buffered: under a backlog the loop
                # would never let the group heartbeat, the writer's completion or the web page run, and the
                # group would drop this worker after its session timeout (found by tests/integration/test_flood.py).
                # The agents' queued frames and summaries go before the next poll (agents.runtime.give_way).
                await self.agents.give_way()
            async with self._lock:
                if drain:
                    core.drain()
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
                if self._frames is not None:
                    self._frames.close()
            except Exception as exc:  # a reject or frame not acknowledged now is re-sent by the replay
                log.warning("producer did not flush on close: %s", exc)
        return self.stats

    def _handle(self, batch: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]) -> None:
        assert self._core is not None
        for tp, last in self._core.handle(batch).items():
            self._pos.read(tp, last)

    def _set_paused(self, consumer: AIOKafkaConsumer, core: IngestCore) -> None:
        """Pause what is not to be read now: every partition while a full buffer waits for ClickHouse
        (``agents.ingest.outage``), else the sensor partitions read ahead of their partition's slowest
        (``streams.align.pacing``)."""
        paced = set() if self._outage.paused else core.paced(self._pos.unread(consumer))
        want = consumer.assignment() if self._outage.paused else paced
        now = consumer.paused()
        if want - now:
            consumer.pause(*(want - now))
        if now - want:
            consumer.resume(*(now - want))
        core.stats.paced = len(paced)
        core.stats.paces += len(paced - now)

    def _has_work(self) -> bool:
        assert self._store is not None and self._core is not None
        return self._core.dirty or self._store.pending_rows > 0

    async def _flush_locked(self, wait: bool = True) -> None:
        """Start writing what is final, then commit; ``wait=False`` lets the loop go on meanwhile.

        One write is in flight at most: the next flush first waits for the previous
        one, so commits stay in order and each covers only what its write made durable.
        """
        store, core, consumer = self._store, self._core, self._consumer
        assert store is not None and core is not None and consumer is not None
        await self._settle()
        core.dead_letter_expired()  # before the commit moves past them
        # Progress marks for every partition read, still assigned or not: this write's frames came from those
        # records. A group session that expired under load takes the assignment away without a revoke; without
        # its marks, the replay would find its own samples behind written cells and dead-letter them as late.
        consumed = {(tp.topic, tp.partition): nxt for tp, nxt in self._pos.next.items()}
        # Commit points, while the emitted frames and open cells are in step: assigned partitions only.
        self._pos.forget_unassigned(consumer.assignment())
        commit = core.commit_points(self._pos.next)
        closed = core.closed_ticks()
        pending = store.detach()
        self._last_flush = self._clock.mono_ns()
        core.dirty = False
        self.stats.open_cells = core.open_cells_gauge(self._last_flush)
        self.stats.nodes_held = core.nodes_held()
        self._inflight = asyncio.ensure_future(self._write(pending, consumed, commit, closed))
        if wait:
            await self._settle()

    async def _write(self, pending: Pending, consumed: dict[tuple[str, int], int],
                     commit: dict[TopicPartition, int], closed: dict[str, int]) -> None:
        store, dlq, consumer = self._store, self._dlq, self._consumer
        assert store is not None and dlq is not None and consumer is not None
        await self._on_ch(dlq.flush)  # rejects before the offsets that produced them are committed
        # Frames on Kafka before ClickHouse (agents.sinks.frames_out says why), both before the commit.
        if self._frames is not None:  # every frame of this write was queued when its tick closed
            await self._on_ch(self._frames.flush)
            self.stats.frames_published = self._frames.published
        now_ms, done = self._clock.wall_ns() // 1_000_000, set[str]()
        while True:
            try:
                await self._on_ch(store.write, pending, consumed, now_ms, closed, done)
                break
            except ClickHouseUnreachable as exc:
                if self._stopping is not None and self._stopping.is_set():
                    raise  # nothing committed: the next owner replays from the last durable write
                await asyncio.sleep(self._outage.failed(str(exc), store.pending_rows + pending.rows))
        self._outage.recovered(pending.rows)
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
                now = self._clock.mono_ns()
                self._commit_failing_since = self._commit_failing_since or now
                self.stats.commits_failed += 1
                if now - self._commit_failing_since > COMMIT_GIVE_UP_S * 1e9:
                    raise CommitError(f"no offset commit completed in {COMMIT_GIVE_UP_S:.0f} s; the rows are "
                                      "written, and the next worker resumes from the last committed offsets") from None
                log.warning("offset commit did not complete in %.0f s (Kafka unreachable?); the rows are written "
                            "and the next flush commits again", COMMIT_TIMEOUT_S)
            else:
                self._commit_failing_since = 0
        st = self.stats
        st.frames_written, st.events_written = store.frames_written, store.events_written
        st.flushes += 1
        if self._on_flush is not None:
            self._on_flush(st)

    async def _settle(self) -> None:
        task, self._inflight = self._inflight, None
        if task is not None:
            await task
