"""The agents' turn on the worker's event loop.

The ingest and the Faust agents share one event loop. Under load the ingest always has records
buffered, and each of its loop iterations is a long step (a poll's decode, placement and closes:
0.05-0.2 s at 512 GPUs); a Faust stream takes one event per loop turn (it yields before each,
``faust.streams.Stream._py_aiter``). So an agent with 32 frames queued got one frame per ingest
iteration, and the last frame of a tick waited for 32 of them: seconds, at 512 GPUs. ``AgentQueues``
knows the agents' input queues; between two of its iterations the ingest gives way until they are
empty, so the agents, whose work is small and latency-bound, go first and the ingest, whose work is
large and throughput-bound, waits for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, Protocol

MAX_TURNS: Final = 256  # an agent that gets more than this between two ingest iterations is falling behind anyway
PATIENCE: Final = 4  # turns without progress: the agents are waiting on I/O (a ClickHouse insert, a backoff), not on us


class _Sized(Protocol):
    def qsize(self) -> int: ...


class AgentQueues:
    """The input queues of the agents in this process (Faust channels' queues), for the ingest to give way to.

    >>> q: asyncio.Queue[int] = asyncio.Queue()
    >>> agents = AgentQueues()
    >>> forget = agents.watch(q)
    >>> q.put_nowait(1); agents.pending()
    1
    >>> forget(); agents.pending()
    0
    """

    def __init__(self, max_turns: int = MAX_TURNS, patience: int = PATIENCE) -> None:
        self.max_turns = max_turns
        self.patience = patience
        self._queues: list[_Sized] = []

    def watch(self, queue: _Sized) -> Callable[[], None]:
        """Count ``queue``'s events from now on; returns what stops counting them (an agent that stops)."""
        self._queues.append(queue)

        def forget() -> None:
            if queue in self._queues:
                self._queues.remove(queue)

        return forget

    def pending(self) -> int:
        return sum(q.qsize() for q in self._queues)

    async def give_way(self) -> int:
        """One event-loop turn, then more while the agents have events queued and take them: at most
        ``max_turns``, and no more once ``patience`` turns in a row took none (the agents await I/O).
        Returns the turns given."""
        await asyncio.sleep(0)
        turns, idle, left = 1, 0, self.pending()
        while left and turns < self.max_turns and idle < self.patience:
            await asyncio.sleep(0)
            turns += 1
            now = self.pending()
            idle = idle + 1 if now >= left else 0
            left = now
        return turns
