"""Publishes closed frames to ``flopwatch.frames`` (contract: ``schemas.frame_messages``).

Frames are sent the moment their tick closes (``publish``: queued in librdkafka, no
wait), so the detection agent sees them without waiting for the next ClickHouse flush.
The writer then waits for Kafka's acknowledgement of everything sent (``flush``) before
it writes the flush's frames to ClickHouse and commits the input offsets. That order
keeps the topic complete: a crash after the publish and before the ClickHouse write
replays the samples and publishes the same messages again (same ids: consumers
deduplicate), while the other order could lose frames for good, because a replay never
rebuilds ticks that ClickHouse already holds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from agents.kafka.producer import SampleProducer
from schemas.frame_messages import encode_frame_doc, frame_id, gpu_doc
from schemas.frames import DERIVED_COLUMNS, VALUE_COLUMNS
from streams.align.aggregate import FrameBatch


def encode_batch(batch: FrameBatch, grid_ns: int) -> Iterator[tuple[str, int, bytes]]:
    """(node, tick_ns, message) per node and tick of ``batch``, in the bytes ``encode_frame_message``
    gives (both build the document with ``gpu_doc`` and ``encode_frame_doc``); read from the columns
    directly, because this runs per flush.
    Labels go as they are: the codec kept only known label keys."""
    n = len(batch)
    if not n:
        return
    # Rows, not columns: one tuple per frame, read by zip (no index per column and frame).
    vals = list(zip(*(batch.values[c].tolist() for c in VALUE_COLUMNS), strict=True))
    nones = [None] * n
    der = list(zip(*([None if d != d else d for d in batch.derived[c].tolist()] if c in batch.derived else nones
                     for c in DERIVED_COLUMNS), strict=True))  # NaN != NaN: null
    notes = batch.notes or [""] * n
    subs = batch.sub_fpw or [()] * n
    unc = (batch.clock_uncertainty_ns / 1000.0).tolist()
    ticks = batch.tick_ns.tolist()
    groups: dict[tuple[str, int], list[int]] = {}
    for i, key in enumerate(zip(batch.node, ticks, strict=True)):
        groups.setdefault(key, []).append(i)
    for (node, tick), rows in groups.items():  # each message encoded and dropped before the next is built
        gpus = []
        for i in rows:
            gpu = batch.gpu[i]
            values = {c: v for c, v in zip(VALUE_COLUMNS, vals[i], strict=True) if v == v}  # NaN != NaN: an empty cell
            derived = dict(zip(DERIVED_COLUMNS, der[i], strict=True))
            gpus.append(gpu_doc(gpu, frame_id(node, gpu, tick), batch.labels[i], values, derived, notes[i], unc[i],
                                subs[i]))
        yield node, tick, encode_frame_doc(node, tick, grid_ns, gpus)


class FramePublisher:
    """Sends frames keyed by node with the tick as the Kafka timestamp; ``flush`` raises on any failure."""

    def __init__(self, producer: SampleProducer, topic: str, grid_ns: int) -> None:
        self._producer = producer
        self.topic = topic
        self.grid_ns = grid_ns
        self.published = 0  # acknowledged
        self._queued = 0
        self._count_lock = threading.Lock()

    def publish(self, batch: FrameBatch) -> None:
        """Queue ``batch``'s messages (returns at once; ``flush`` waits for them)."""
        for node, tick, value in encode_batch(batch, self.grid_ns):
            self._producer.send(self.topic, value, node, timestamp_ms=tick // 1_000_000)
            with self._count_lock:  # publish runs on the event loop, flush on the writer thread
                self._queued += 1
        # No poll() here: delivery callbacks are served by flush() on the writer thread only, so
        # the producer's failure count is never updated from two threads at once.

    def flush(self) -> None:
        """Wait until Kafka acknowledged every message queued so far; raises if any failed."""
        queued = self._queued  # the loop thread may queue more meanwhile; those count next time
        if queued:
            self._producer.flush()
            with self._count_lock:
                self.published += queued
                self._queued -= queued

    def close(self) -> None:
        self._producer.close()
