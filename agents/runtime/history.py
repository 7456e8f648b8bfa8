"""Reads a partition's recent frames back from Kafka, by event time, to rebuild detector state."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.kafka.topics import aiokafka_config
from agents.settings import Settings
from schemas.alerts import decode_alert

MAX_REPLAY = 2_000_000  # messages; a bound on memory whatever the window holds
READ_DEADLINE_S = 120.0


def _message_id(raw: bytes) -> str:
    """The alert's own ``message_id`` (one rule for it: ``schemas.alerts.Alert.message_id``)."""
    try:
        return decode_alert(raw).message_id
    except ValueError:  # not an alert of ours: nothing to suppress
        return ""


class KafkaFrameHistory:
    """``agents.runtime.partition_agent.FrameHistory`` over an input topic whose messages carry their event time as
    the Kafka timestamp (frames, workload summaries), and the outputs already on an output topic."""

    def __init__(self, settings: Settings, topic: str, alerts_topic: str,
                 id_of: Callable[[bytes], str] = _message_id) -> None:
        self.settings = settings
        self.topic = topic
        self.alerts_topic = alerts_topic  # or the triggers topic, with its own ``id_of``
        self.id_of = id_of

    async def sent(self, since_wall_ms: int) -> dict[str, bytes]:
        """What was sent to the output topic since ``since_wall_ms`` (their Kafka time is when they were
        sent), from every partition, by id (``id_of`` each message: ``id:state`` for alerts, ``id`` for
        triggers); the last message of an id wins."""
        consumer = AIOKafkaConsumer(**aiokafka_config(self.settings), enable_auto_commit=False,
                                    client_id="flopwatch-detect-replay")
        await consumer.start()
        try:
            # flopwatch creates its topics with the configured partition count (agents.kafka.admin).
            tps = [TopicPartition(self.alerts_topic, p) for p in range(self.settings.partitions)]
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            found = await consumer.offsets_for_times({tp: max(since_wall_ms, 0) for tp in tps})
            left = {}
            for tp in tps:
                hit = found.get(tp)
                start = ends[tp] if hit is None else hit.offset
                if start < ends[tp]:
                    consumer.seek(tp, start)
                    left[tp] = ends[tp]
                else:
                    consumer.pause(tp)
            out: dict[str, bytes] = {}
            deadline = time.monotonic() + READ_DEADLINE_S
            while left and len(out) < MAX_REPLAY:
                batch = await consumer.getmany(*left, timeout_ms=1000)
                if not batch:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"reading {self.alerts_topic} did not reach its end in "
                                           f"{READ_DEADLINE_S:.0f} s")
                    continue
                for tp, recs in batch.items():
                    for r in recs:
                        if r.value is not None:
                            out[self.id_of(r.value)] = r.value
                    if recs and recs[-1].offset + 1 >= left[tp]:
                        del left[tp]
                        consumer.pause(tp)
            return out
        finally:
            await consumer.stop()

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
            deadline = time.monotonic() + READ_DEADLINE_S
            while len(out) < MAX_REPLAY:
                batch = await consumer.getmany(tp, timeout_ms=1000)
                recs = batch.get(tp, [])
                if not recs:
                    # An empty fetch is not the end (a slow broker, a leader move): go on until
                    # the position reaches the offset asked for, within a deadline.
                    if await consumer.position(tp) >= until_offset:
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"replaying {self.topic}[{partition}] did not reach offset {until_offset} "
                                           f"in {READ_DEADLINE_S:.0f} s")
                    continue
                for r in recs:
                    if r.offset >= until_offset:
                        return out
                    if r.value is not None:
                        out.append(r.value)
            return out
        finally:
            await consumer.stop()
