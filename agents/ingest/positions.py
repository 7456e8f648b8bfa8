"""What Kafka tells the worker about its partitions: read positions, lag, and quiet clocks.

A sensor partition's *quiet clock* (``streams.align.holds``) counts the nanoseconds during
which Kafka confirmed it caught up: a fetch response for it within ``ANSWER_S`` (a
caught-up partition gets one about every ``fetch_max_wait_ms``) whose highwater our
position has reached, and not paused. The aligners measure a stream's idleness on it, so time in which
the data could not have arrived (a broker outage, a backlog still being read) never
makes a stream idle.

One turn of the worker's loop counts for at most ``TURN_CREDIT_S``. The fetcher shares the loop, so
during a long turn no response comes while new records may already wait in Kafka: the whole turn is
not confirmed time. Counting it made a stream that lagged by a chunk idle after one slow turn of a
loaded worker under a 1 s bound, and its next records late. Counting only up to each response
(the time Kafka really confirmed) is the exact rule; tried twice, it left a node's last tick open at
the end of a rebalance storm for reasons not yet found, so the cap stands in: turns of a worker
keeping up are shorter than it and count in full.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator

from aiokafka import AIOKafkaConsumer, TopicPartition

POSITION_PROBE_S = 0.2  # how long one loop turn waits for Kafka to tell unread partitions' positions
ANSWER_S = 2.0  # a fetch response older than this does not confirm a partition caught up
TURN_CREDIT_S = 0.5  # the most quiet time one loop turn counts (a turn of agents.ingest.poll_size's size)


class Positions:
    """Per assigned partition: the next offset to read, and each sensor partition's quiet clock.

    ``mono_ns`` and ``wall_ns`` are the clocks (injected so tests can drive them).
    """

    def __init__(self, mono_ns: Callable[[], int] = time.monotonic_ns,
                 wall_ns: Callable[[], int] = time.time_ns) -> None:
        self._mono_ns, self._wall_ns = mono_ns, wall_ns
        self.next: dict[TopicPartition, int] = {}  # one past the last record read
        # Fetch positions of assigned partitions not read from yet; they change only on a
        # (re)assignment, which bumps the epoch so a probe started before it is thrown away.
        self._probed: dict[TopicPartition, int] = {}
        self._epoch = 0
        self.quiet: dict[TopicPartition, int] = {}
        self._turn = mono_ns()

    def assigned(self, sensor_partitions: Iterable[TopicPartition]) -> None:
        self._epoch += 1
        self._probed.clear()
        for tp in sensor_partitions:
            self.quiet.setdefault(tp, 0)

    def revoked(self, revoked: Iterable[TopicPartition]) -> None:
        self._epoch += 1
        self._probed.clear()
        for tp in revoked:
            self.next.pop(tp, None)
            self.quiet.pop(tp, None)

    def read(self, tp: TopicPartition, last_offset: int) -> None:
        self.next[tp] = last_offset + 1

    def forget_unassigned(self, assigned: set[TopicPartition]) -> None:
        """Partitions gone without a revoke (their topic was deleted): nothing to commit there."""
        for tp in [tp for tp in self.next if tp not in assigned]:
            del self.next[tp]

    def position(self, tp: TopicPartition) -> int | None:
        pos = self.next.get(tp)
        return pos if pos is not None else self._probed.get(tp)

    def unknown(self, consumer: AIOKafkaConsumer) -> bool:
        """Whether some assigned partition's position is not known yet."""
        return len(self.next) + len(self._probed) < len(consumer.assignment())

    async def probe(self, consumer: AIOKafkaConsumer) -> None:
        """Learn the fetch position of assigned partitions not read from yet, waiting briefly.

        Never called under the ingest lock: a position can wait for a rebalance to finish, and
        the rebalance waits for the revoke callback, which takes the lock. A position Kafka
        cannot tell within ``POSITION_PROBE_S`` is asked again on a later turn.
        """
        epoch = self._epoch
        tps = [tp for tp in consumer.assignment() if tp not in self.next and tp not in self._probed]
        if not tps:
            return
        asks = {asyncio.ensure_future(consumer.position(tp)): tp for tp in tps}
        done, slow = await asyncio.wait(asks, timeout=POSITION_PROBE_S)
        for task in slow:
            task.cancel()
        for task in done:
            if task.exception() is None and epoch == self._epoch:
                self._probed[asks[task]] = task.result()

    def behind(self, consumer: AIOKafkaConsumer) -> Iterator[tuple[TopicPartition, int | None]]:
        """Per assigned partition, the records behind its end (None while its end or position is not known)."""
        for tp in consumer.assignment():
            hw, pos = consumer.highwater(tp), self.position(tp)
            yield tp, None if hw is None or pos is None else max(0, hw - pos)

    def lag(self, consumer: AIOKafkaConsumer) -> int | None:
        """Records behind the end of every assigned partition; None until each end is known."""
        lag = 0
        for _, n in self.behind(consumer):
            if n is None:
                return None
            lag += n
        return lag

    def unread(self, consumer: AIOKafkaConsumer) -> set[TopicPartition]:
        """The assigned partitions with records behind their end, or whose end or position is not known yet."""
        return {tp for tp, n in self.behind(consumer) if n != 0}

    def tick_quiet(self, consumer: AIOKafkaConsumer) -> None:
        """Run the quiet clock of each sensor partition Kafka confirms caught up. A turn counts
        for at most ``TURN_CREDIT_S``, so a slow or stalled loop does not count as quiet."""
        now = self._mono_ns()
        step = min(now - self._turn, int(TURN_CREDIT_S * 1e9))
        self._turn = now
        if step <= 0:
            return
        fresh_ms = self._wall_ns() / 1e6 - ANSWER_S * 1000
        quiet = self.quiet
        paused = consumer.paused()  # not read (agents.ingest.outage): its last answer is stale at once
        for tp in quiet:
            if tp in paused:
                continue
            answered = consumer.last_poll_timestamp(tp)
            if answered is None or answered < fresh_ms:
                continue
            hw, pos = consumer.highwater(tp), self.position(tp)
            if hw is not None and pos is not None and pos >= hw:
                quiet[tp] += step
