"""Kubernetes events for attribution: every partition of ``k8s.events`` into the detection agent's ``EventBook``.

Each worker reads the whole topic (events are few: pods start, stop, get killed), from
``lookback_s`` before it started, with no consumer group: attribution on any node may need any
node's events, whichever frames partitions the worker holds. A message that does not decode is
skipped here (the ingest sends it to the dead-letter topic); the feed never stops the worker:
on a Kafka error it logs one line, waits and reads on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from mode import Service

from agents.kafka.topics import aiokafka_config
from agents.settings import Settings
from schemas.codec import decode_k8s_event
from schemas.records import K8sEvent, Reject
from streams.attribution.context import EventBook, Happening

log = logging.getLogger(__name__)


def happening(ev: K8sEvent) -> Happening:
    """A Kubernetes event as attribution reads it."""
    return Happening(ev.node, ev.ts_ns, ev.reason, ev.type, ev.pod, tuple(ev.gpus), ev.message)


def feed(book: EventBook, raw: bytes | None) -> bool:
    """One ``k8s.events`` message into ``book``; whether it was an event."""
    ev = decode_k8s_event(raw or b"")
    if isinstance(ev, Reject):
        return False
    book.add(happening(ev))
    return True


class K8sEventFeed(Service):
    """Reads ``k8s.events`` into ``book`` for as long as the worker runs."""

    def __init__(self, settings: Settings, topic: str, book: EventBook, lookback_s: float = 900.0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings, self.topic, self.book, self.lookback_s = settings, topic, book, lookback_s
        self.read = 0
        self._task: asyncio.Task[None] | None = None

    async def on_start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def on_stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await self._read()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Kafka away: attribution goes without events meanwhile
                log.warning("reading %s for attribution failed (%s); retrying in 5 s", self.topic, exc)
                await asyncio.sleep(5.0)

    async def _read(self) -> None:
        consumer = AIOKafkaConsumer(**aiokafka_config(self.settings), enable_auto_commit=False,
                                    client_id="flopwatch-detect-events")
        await consumer.start()
        try:
            parts = consumer.partitions_for_topic(self.topic) or set(range(self.settings.partitions))
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            consumer.assign(tps)
            since_ms = int((time.time() - self.lookback_s) * 1000)
            found = await consumer.offsets_for_times(dict.fromkeys(tps, since_ms))
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                hit = found.get(tp)
                consumer.seek(tp, ends[tp] if hit is None else hit.offset)
            while True:
                batch = await consumer.getmany(timeout_ms=1000)
                for recs in batch.values():
                    for r in recs:
                        self.read += feed(self.book, r.value)
        finally:
            await consumer.stop()
