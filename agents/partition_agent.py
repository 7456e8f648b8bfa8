"""Declaring a flopwatch agent: one result per message, ``concurrency=1``, state dropped on revocation."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import faust

Handle = Callable[[int, int, int, bytes | None, bytes | None], Awaitable[Any]]


def declare(app: faust.App, topic: Any, name: str, handle: Handle, topic_name: str,
            revoke: Callable[[Sequence[int]], None]) -> Any:
    """An agent on ``topic`` that awaits ``handle(partition, offset, timestamp_ms, key, value)`` per message
    and yields its result (what ``test_context``'s ``put()`` waits for); ``revoke`` gets the partitions
    of ``topic_name`` taken away in a rebalance."""

    async def run(stream: faust.StreamT[Any]) -> AsyncIterator[Any]:
        async for event in stream.events():
            m = event.message
            ts_ms = int(m.timestamp * 1000) if m.timestamp else 0
            yield await handle(m.partition, m.offset, ts_ms, event.key, event.value)

    # concurrency=1: with more, a commit can pass a message still in flight (faust-streaming#606).
    agent = app.agent(topic, name=name, concurrency=1)(run)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def _revoked(sender: Any, revoked: Any, **_: Any) -> None:
        revoke(sorted({tp.partition for tp in revoked if tp.topic == topic_name}))

    return agent
