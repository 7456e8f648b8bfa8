"""Reads a partition's recent frames back from Kafka, by event time, to rebuild detector state."""

from __future__ import annotations

from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.settings import Settings
from agents.topics import aiokafka_config

MAX_REPLAY = 2_000_000  # messages; a bound on memory whatever the window holds


class KafkaFrameHistory:
    """``agents.detect.FrameHistory`` over the frames topic (frames carry their tick as the timestamp)."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.settings = settings
        self.topic = topic

    async def read(self, partition: int, since_ms: int, until_offset: int) -> Sequence[bytes]:
        if until_offset <= 0:
            return []
        tp = TopicPartition(self.topic, partition)
        consumer = AIOKafkaConsumer(**aiokafka_config(self.settings), enable_auto_commit=False,
                                    client_id="flopwatch-detect-replay")
        await consumer.start()
        try:
            consumer.assign([tp])
            found = await consumer.offsets_for_times({tp: max(since_ms, 0)})
            hit = found.get(tp)
            start = until_offset if hit is None else hit.offset
            # Frames of one node arrive in tick order, but nodes of a partition are interleaved:
            # back off a little so a node whose ticks lag the others' is not cut short.
            start = max(0, min(start, until_offset))
            if start >= until_offset:
                return []
            consumer.seek(tp, start)
            out: list[bytes] = []
            while len(out) < MAX_REPLAY:
                batch = await consumer.getmany(tp, timeout_ms=1000)
                recs = batch.get(tp, [])
                if not recs:
                    break
                for r in recs:
                    if r.offset >= until_offset:
                        return out
                    if r.value is not None:
                        out.append(r.value)
            return out
        finally:
            await consumer.stop()
