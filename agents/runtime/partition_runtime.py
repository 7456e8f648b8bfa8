"""The one runtime of the agents that keep per-partition state (detection, decision).

Per message: rebuild the partition's state on first use after an assignment (retried with
backoff), decode (a failure is dead-lettered), run the pure engine (an exception of ours is
dead-lettered too), leave out what the output topic already held when the state was rebuilt,
and fan out to the sinks with backoff. The agents say only what differs: how to decode,
what the engine is, which id an output has, and what to do after each message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Final, Generic, Protocol, TypeVar

from agents.runtime.backoff import with_backoff
from agents.runtime.partition_agent import FrameHistory, Rejects, dead_letter, read_history
from agents.runtime.timebase import SYSTEM_CLOCK, Clock
from schemas.counters import Counters
from schemas.records import Reject, RejectReason

log = logging.getLogger(__name__)
REPLAY_TURN: Final = 64  # replayed messages between two yields to the event loop (~30 ms of work)

St = TypeVar("St")  # one partition's engine
In = TypeVar("In")  # a decoded input message
Out = TypeVar("Out")  # what the engine emits
Out_contra = TypeVar("Out_contra", contravariant=True)


class OutputSink(Protocol[Out_contra]):
    """A sink of outputs; ``once_per_id = True`` on one leaves out the outputs its topic already holds."""

    async def send(self, batch: Sequence[Out_contra], /) -> None: ...


@dataclass(slots=True)
class PartitionCounters(Counters):
    """What the runtime itself counts, whatever the engine."""

    replayed: int = 0  # input messages replayed to rebuild state
    rebuilds: int = 0
    suppressed: int = 0  # outputs already on the topic before a restart, not sent again
    rejects: int = 0
    errors: int = 0


class PartitionRuntime(Generic[St, In, Out]):
    """Per-partition engines, rebuilt on first use after an assignment; ``handle`` is one message."""

    engine_noun: ClassVar[str]  # "detector": who failed on a message, in the log
    state_noun: ClassVar[str]  # "detector": whose state is rebuilt, in the log
    input_noun: ClassVar[str]  # "frames": what a rebuild replayed, in the log
    output_noun: ClassVar[str]  # "alert": whose sink failed, in the log
    empty_note: ClassVar[str] = ""  # what an empty start loses, in the log
    log_each_error: ClassVar[bool] = True  # False: one log line per exception type

    stats: PartitionCounters

    def __init__(self, history: FrameHistory, sinks: Sequence[OutputSink[Out]], rejects: Rejects | None,
                 topic: str, replay_s: float, clock: Clock = SYSTEM_CLOCK) -> None:
        self.history = history
        self.sinks = list(sinks)
        self.rejects = rejects
        self.topic = topic
        self.replay_ms = int(replay_s * 1000)
        self.clock = clock
        self._by_partition: dict[int, St] = {}
        # Per partition, the outputs already on the output topic when its state was rebuilt (id -> the message
        # as sent): inputs past the last commit are processed again, and their outputs must not go twice.
        self._sent: dict[int, dict[str, bytes]] = {}
        self._errors_logged: set[str] = set()

    # -- what each agent says --------------------------------------------------------------------------------
    def _decode(self, value: bytes) -> In | Reject:
        raise NotImplementedError

    def _fresh(self, partition: int) -> St:
        """An empty engine."""
        raise NotImplementedError

    def _apply(self, state: St, msg: In) -> list[Out]:
        raise NotImplementedError

    def _replay_one(self, partition: int, state: St, raw: bytes, sent: dict[str, bytes]) -> None:
        """Feed one replayed message to ``state``; its outputs are dropped (sent before the crash)."""
        raise NotImplementedError

    def _sent_id(self, out: Out) -> str:
        raise NotImplementedError

    def _once(self, out: Out) -> bool:
        """Whether ``out`` is left out when its id is already on the topic."""
        return True

    def _as_sent(self, state: St, out: Out, raw: bytes) -> Out:
        """``out`` as the topic already holds it (``raw``), for the other sinks; by default ``out`` itself."""
        return out

    def _processed(self, msg: In) -> None:
        """Count one input the engine took."""

    def _count(self, fresh: Sequence[Out]) -> None:
        """Count the outputs sent for the first time."""

    async def _after(self, partition: int, state: St, msg: In) -> None:
        """After each input the engine took, its outputs sent."""

    def _yielded(self, made: list[Out], fresh: list[Out]) -> list[Out]:
        """What ``handle`` returns (what the agent yields)."""
        return fresh

    def _forget(self, partition: int, state: St | None) -> None:
        """A revoked partition's state is dropped."""

    def _start_replay(self, partition: int) -> None:
        """A rebuild read its history and starts replaying it."""

    def _gave_up(self, sink: OutputSink[Out], batch: Sequence[Out]) -> None:
        log.error("%s sink %s gave up on %s", self.output_noun, type(sink).__name__,
                  ", ".join(self._sent_id(o) for o in batch))

    # -- the runtime -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Deliver the dead-letter records still queued and let their producer go, so that it does not keep
        reconnecting (and logging) after the broker has stopped, as the demo's local broker does."""
        if self.rejects is not None:
            self.rejects.close()

    def revoke(self, partitions: Sequence[int]) -> None:
        for p in partitions:
            state = self._by_partition.pop(p, None)
            self._sent.pop(p, None)
            self._forget(p, state)

    async def handle(self, partition: int, offset: int, timestamp_ms: int, key: bytes | None,
                     value: bytes | None) -> list[Out]:
        """One input message; returns (and has sent) the outputs it caused."""
        state = self._by_partition.get(partition)
        if state is None:
            state = self._by_partition[partition] = await self._rebuild_retrying(partition, offset, timestamp_ms)
        msg = self._decode(value or b"")
        if isinstance(msg, Reject):
            self.stats.rejects += 1
            await self._reject(msg, key, value, partition, offset)
            return []
        try:
            made = self._apply(state, msg)
        except Exception as exc:  # a bug of ours on one message must not stop the agent
            self.stats.errors += 1
            what = type(exc).__name__
            if self.log_each_error or what not in self._errors_logged:
                self._errors_logged.add(what)
                log.error("%s failed on %s[%d]@%d; sent to the dead-letter topic", self.engine_noun, self.topic,
                          partition, offset, exc_info=exc)
            await self._reject(Reject(RejectReason.INTERNAL_ERROR, f"{what}: {exc}"), key, value, partition, offset)
            return []
        self._processed(msg)
        fresh, stored = self._leave_out_sent(partition, state, made)
        if made:
            for sink in self.sinks:
                batch = fresh if getattr(sink, "once_per_id", False) else stored
                if batch:
                    await self._send(sink, batch)
            self._count(fresh)
        await self._after(partition, state, msg)
        return self._yielded(made, fresh)

    def _leave_out_sent(self, partition: int, state: St, made: list[Out]) -> tuple[list[Out], list[Out]]:
        """What goes to the once-per-id sinks, and what to the others. Outputs already on the topic are not
        sent again; their rows still go to ClickHouse (the crash may have come between the two sends), where
        the table collapses repeats, and they go as the topic holds them: an output made again can differ
        from the first (an attribution that sees fewer events after the restart), and the table must keep
        what consumers acted on."""
        sent = self._sent.get(partition)
        if not sent or not made:
            return made, made
        fresh, stored = [], []
        for o in made:
            raw = sent.pop(self._sent_id(o), None)
            if raw is None or not self._once(o):
                fresh.append(o)
                stored.append(o)
            else:
                self.stats.suppressed += 1
                stored.append(self._as_sent(state, o, raw))
        return fresh, stored

    async def _send(self, sink: OutputSink[Out], batch: Sequence[Out]) -> None:
        """Hand ``batch`` to one sink, retrying with backoff: the engine already counts it as sent, so
        giving up would lose it; an exception leaving the agent would too (Faust acks the message in
        flight when an agent crashes)."""
        ok, _ = await with_backoff(f"{self.output_noun} sink {type(sink).__name__}", lambda: sink.send(batch),
                                   self._error)
        if not ok:
            self._gave_up(sink, batch)

    async def _reject(self, reject: Reject, key: bytes | None, value: bytes | None, partition: int,
                      offset: int) -> None:
        await dead_letter(self.rejects, reject, key, value, self.topic, partition, offset)

    def _error(self) -> None:
        self.stats.errors += 1

    async def _rebuild_retrying(self, partition: int, offset: int, timestamp_ms: int) -> St:
        """``_rebuild``, retried while Kafka is unreachable; never raises out of the agent."""
        ok, state = await with_backoff(f"partition {partition}: rebuilding {self.state_noun} state",
                                       lambda: self._rebuild(partition, offset, timestamp_ms), self._error)
        if ok and state is not None:
            return state
        # Without history: go on from here, and say so (outputs of the lost window may repeat).
        log.error("partition %d: %s state not rebuilt; starting empty%s", partition, self.state_noun,
                  self.empty_note)
        self._sent[partition] = {}
        return self._fresh(partition)

    async def _rebuild(self, partition: int, offset: int, timestamp_ms: int) -> St:
        state = self._fresh(partition)
        sent, replayed = await read_history(self.history, partition, offset, timestamp_ms, self.replay_ms,
                                            self.clock.wall_ns() // 1_000_000)
        self._sent[partition] = sent
        self._start_replay(partition)
        for k, raw in enumerate(replayed):
            if k and k % REPLAY_TURN == 0:
                # A replay of many GPUs' last 15 minutes is seconds of CPU: in one go it would starve the group
                # heartbeats of every consumer on this loop (the ingest's too) and get the worker dropped.
                await asyncio.sleep(0)
            try:
                self._replay_one(partition, state, raw, sent)
            except Exception:  # counted when it was first read; a replay only rebuilds state
                continue
        self.stats.replayed += len(replayed)
        self.stats.rebuilds += 1
        if replayed:
            log.info("partition %d: %s state rebuilt from %d %s", partition, self.state_noun, len(replayed),
                     self.input_noun)
        return state
