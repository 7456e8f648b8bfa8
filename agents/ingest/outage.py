"""What the ingest does while ClickHouse is away: wait for it, say so once, and read no more than it can hold.

A write that finds the server unreachable is retried, whole and with the same token (``FrameStore.write``
skips the inserts that went through), with a backoff up to ``MAX_BACKOFF_S``, for as long as the worker
runs. Nothing is committed meanwhile, so a worker stopped during an outage leaves its partitions to be
replayed from the last durable write. The loop goes on reading and aligning until the buffered rows reach
``PAUSE_AT_FLUSHES`` flushes' worth, then pauses its partitions (the consumer stays in its group) until
the write is through. Each change of state is one log line.
"""

from __future__ import annotations

import logging
import time
from typing import Final

log = logging.getLogger(__name__)

FIRST_BACKOFF_S: Final = 0.5
MAX_BACKOFF_S: Final = 10.0
PAUSE_AT_FLUSHES: Final = 4  # buffered rows, in flushes (FLOPWATCH_FLUSH_ROWS), at which reading pauses


class Outage:
    """The state of the write path: ClickHouse reachable or not, reading paused or not.

    >>> o = Outage(flush_rows=100)
    >>> o.failed("ClickHouse at h:9000 unreachable", rows=50), o.down
    (0.5, True)
    >>> o.failed("again", rows=60)  # no second log line, a longer wait
    1.0
    >>> o.should_pause(rows=400, writing=True), o.should_pause(rows=400, writing=True)
    (True, False)
    >>> o.recovered(rows=460), o.should_resume(writing=False)
    (True, True)
    """

    __slots__ = ("_backoff", "_since", "down", "flush_rows", "paused")

    def __init__(self, flush_rows: int) -> None:
        self.flush_rows = flush_rows
        self.down = False
        self.paused = False
        self._since = 0.0
        self._backoff = FIRST_BACKOFF_S

    def failed(self, reason: str, rows: int) -> float:
        """A write found ClickHouse unreachable; returns how long to wait before the next try."""
        if not self.down:
            self.down, self._since, self._backoff = True, time.monotonic(), FIRST_BACKOFF_S
            log.warning("%s; holding %d rows and committing nothing until it is back, retrying", reason, rows)
            return self._backoff
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
        return self._backoff

    def recovered(self, rows: int) -> bool:
        """The write went through; whether that ended an outage."""
        if not self.down:
            return False
        self.down = False
        log.warning("ClickHouse is back after %.0f s: %d rows written, commits resume", time.monotonic() - self._since,
                    rows)
        return True

    def should_pause(self, rows: int, writing: bool) -> bool:
        """Whether to pause reading now (once, when a write is pending and the buffer reached its bound)."""
        if self.paused or not writing or rows < PAUSE_AT_FLUSHES * self.flush_rows:
            return False
        self.paused = True
        log.warning("reading paused: %d rows buffered (bound %d) while a write waits for ClickHouse", rows,
                    PAUSE_AT_FLUSHES * self.flush_rows)
        return True

    def should_resume(self, writing: bool) -> bool:
        if not self.paused or writing:
            return False
        self.paused = False
        log.warning("reading resumed")
        return True
