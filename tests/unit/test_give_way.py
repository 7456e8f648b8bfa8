"""The ingest gives way to the agents' queued events between two of its iterations, within bounds."""

from __future__ import annotations

import asyncio

from agents.runtime.give_way import AgentQueues


async def _faust_like_reader(q: asyncio.Queue[int], took: list[int], gate: asyncio.Event | None = None) -> None:
    """Takes one event per event-loop turn, as a Faust stream does (it yields before each event)."""
    while True:
        await asyncio.sleep(0)
        item = await q.get()  # woken by the put itself, not by a timer a loaded machine may delay
        if gate is not None:
            await gate.wait()  # the agent awaits I/O (a ClickHouse insert, a backoff)
        took.append(item)


def test_the_ingest_gives_way_until_an_agent_has_taken_every_queued_event() -> None:
    async def run() -> tuple[int, list[int], int]:
        q: asyncio.Queue[int] = asyncio.Queue()
        agents, took = AgentQueues(), list[int]()
        agents.watch(q)
        reader = asyncio.create_task(_faust_like_reader(q, took))
        await asyncio.sleep(0.01)  # the reader waits on an empty queue
        for i in range(40):  # a tick's frames of 40 nodes arrive at once
            q.put_nowait(i)
        turns = await agents.give_way()
        reader.cancel()
        return turns, took, agents.pending()

    turns, took, left = asyncio.run(run())
    assert took == list(range(40)) and left == 0  # one sleep(0) would have let the reader take one
    assert 40 <= turns < 50


def test_without_queued_events_the_ingest_gives_one_turn_as_before() -> None:
    async def run() -> int:
        agents = AgentQueues()
        agents.watch(asyncio.Queue())
        return await agents.give_way()

    assert asyncio.run(run()) == 1


def test_an_agent_waiting_on_io_or_with_a_long_queue_does_not_hold_the_ingest() -> None:
    async def run() -> tuple[int, int, int, int, int]:
        stuck: asyncio.Queue[int] = asyncio.Queue()
        agents, took = AgentQueues(max_turns=64, patience=4), list[int]()
        agents.watch(stuck)
        gate = asyncio.Event()
        reader = asyncio.create_task(_faust_like_reader(stuck, took, gate))
        for i in range(10):
            stuck.put_nowait(i)
        waiting = await agents.give_way()  # the reader holds its event and awaits its I/O: no progress
        reader.cancel()

        long: asyncio.Queue[int] = asyncio.Queue()
        behind, took2 = AgentQueues(max_turns=64, patience=4), list[int]()
        behind.watch(long)
        for i in range(200):  # more than max_turns events: the agent is falling behind
            long.put_nowait(i)
        reader2 = asyncio.create_task(_faust_like_reader(long, took2))
        given = await behind.give_way()
        reader2.cancel()
        return waiting, len(took), given, len(took2), behind.pending()

    waiting, took, given, took2, left = asyncio.run(run())
    assert waiting <= 1 + 4 + 1 and took == 0  # patience: a few turns, not max_turns
    assert given == 64 and 60 <= took2 < 64 and left == 200 - took2  # bounded by max_turns


def test_a_queue_is_no_longer_counted_once_its_agent_stops() -> None:
    q: asyncio.Queue[int] = asyncio.Queue()
    q.put_nowait(1)
    agents = AgentQueues()
    forget = agents.watch(q)
    assert agents.pending() == 1
    forget()
    forget()  # twice: an agent restarted by its supervisor stops again
    assert agents.pending() == 0
