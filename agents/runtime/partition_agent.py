"""What the detection and decision agents share: declaring an agent (one result per message,
``concurrency=1``, state dropped on revocation), reading a partition's history to rebuild its
state, and dead-lettering a message."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol, cast

import faust

from agents.runtime.give_way import AgentQueues
from schemas.records import Reject

SENT_LOOKBACK_MS = 600_000  # outputs sent lately are read back from at least this far


class FrameHistory(Protocol):
    """A partition's recent input messages (by event time), and the outputs already sent (id -> message)."""

    async def read(self, partition: int, since_ms: int, until_offset: int) -> Sequence[bytes]: ...
    async def sent(self, since_wall_ms: int) -> dict[str, bytes]: ...


class Rejects(Protocol):
    def send(self, reject: Reject, value: bytes | None, key: bytes | None, topic: str, partition: int, offset: int,
             headers: Any = (), indices: list[int] | None = None) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


async def read_history(history: FrameHistory, partition: int, offset: int, timestamp_ms: int, replay_ms: int,
                       wall_ms: int) -> tuple[dict[str, bytes], Sequence[bytes]]:
    """The outputs already sent (id -> message), and the partition's messages of the last ``replay_ms``
    before ``offset``. Outputs carry their send time as the Kafka timestamp, which is wall time after
    the inputs' event time: covering the replayed inputs' event time too keeps a worker that was down for
    long from sending again what it sent before the crash."""
    sent = await history.sent(min(wall_ms - SENT_LOOKBACK_MS, timestamp_ms - replay_ms))
    return sent, await history.read(partition, timestamp_ms - replay_ms, offset)


async def dead_letter(rejects: Rejects | None, reject: Reject, key: bytes | None, value: bytes | None, topic: str,
                      partition: int, offset: int) -> None:
    if rejects is not None:
        rejects.send(reject, value, key, topic, partition, offset)
        # Acknowledged before the agent moves on, so the commit never passes an undelivered reject.
        await asyncio.to_thread(rejects.flush)

Handle = Callable[[int, int, int, bytes | None, bytes | None], Awaitable[Any]]


def declare(app: faust.App, topic: Any, name: str, handle: Handle, topic_name: str,
            revoke: Callable[[Sequence[int]], None], queues: AgentQueues | None = None) -> Any:
    """An agent on ``topic`` that awaits ``handle(partition, offset, timestamp_ms, key, value)`` per message
    and yields its result (what ``test_context``'s ``put()`` waits for); ``revoke`` gets the partitions
    of ``topic_name`` taken away in a rebalance; ``queues`` learns the agent's input queue, which the
    ingest gives way to."""

    async def run(stream: faust.StreamT[Any]) -> AsyncIterator[Any]:
        channel = stream.channel  # an agent's stream reads its own channel (a ChannelT, typed as an iterator)
        forget = queues.watch(cast(faust.ChannelT[Any], channel).queue) if queues is not None else None
        try:
            async for event in stream.events():
                m = event.message
                ts_ms = int(m.timestamp * 1000) if m.timestamp else 0
                yield await handle(m.partition, m.offset, ts_ms, event.key, event.value)
        finally:
            if forget is not None:
                forget()

    # concurrency=1: with more, a commit can pass a message still in flight (faust-streaming#606).
    agent = app.agent(topic, name=name, concurrency=1)(run)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def _revoked(sender: Any, revoked: Any, **_: Any) -> None:
        revoke(sorted({tp.partition for tp in revoked if tp.topic == topic_name}))

    return agent
