"""How many records the ingest asks Kafka for, so that one turn of its loop stays short.

A turn (decode and place a poll, close the cells it releases) holds the event loop, and the
loop also runs the consumer group's heartbeats: a turn longer than the session timeout
(``FLOPWATCH_KAFKA_SESSION_TIMEOUT_S``, 10 s) has the group drop the worker, and every turn
after as long again makes a rebalance storm that reads the same records over and over. A
fixed count of records does not bound a turn: 20,000 messages of 100 samples took 1.3-3.9 s
here, under a profiler three times that and the group dropped the worker on every poll, and
messages of 1,000 samples take ten times as long. So the count follows the cost measured per
record, aiming at ``TURN_S`` a turn, between ``LEAST`` and the ``FLOPWATCH_MAX_POLL_RECORDS``
ceiling.
"""

from __future__ import annotations

from typing import Final

TURN_S: Final = 0.5  # a sixth of the heartbeat interval, a twentieth of the default session timeout
LEAST: Final = 100  # records; below this a turn's fixed costs dominate


class PollSize:
    """The next poll's record count, from the last turns' cost per record.

    >>> size = PollSize(most=20_000)
    >>> size.asked
    20000
    >>> size.took(records=20_000, seconds=2.0)  # 100 us a record: a turn of 0.5 s is 5,000 of them
    >>> size.asked  # at most halved a turn
    10000
    >>> size.took(records=10_000, seconds=1.0); size.asked
    5000
    >>> size.took(records=5_000, seconds=0.125)  # cheaper records: it grows, at most doubling a turn
    >>> size.asked
    10000
    >>> size.took(records=3, seconds=0.001)  # a live poll of a few records says little about a full one
    >>> size.asked
    10000
    """

    __slots__ = ("asked", "least", "most", "turn_s")

    def __init__(self, most: int, turn_s: float = TURN_S, least: int = LEAST) -> None:
        self.most, self.turn_s, self.least = most, turn_s, min(least, most)
        self.asked = most

    def took(self, records: int, seconds: float) -> None:
        """A turn handled ``records`` in ``seconds`` (the loop's own work, not its waits)."""
        if not records or (seconds <= self.turn_s and records < self.asked // 2):
            return  # short of records, not of time (or closing what earlier polls brought): nothing learnt
        want = int(self.turn_s * records / seconds) if seconds > 0 else self.most
        # At most halved or doubled a turn: one turn that closed a large release of cells is not the price of a record.
        self.asked = max(self.least, min(self.most, 2 * self.asked, max(self.asked // 2, want)))
