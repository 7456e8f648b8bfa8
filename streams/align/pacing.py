"""Reading a backlog in step: which sources to leave in Kafka for a while, so open cells stay within their bound.

Under a backlog the consumer reads a partition's topics at uneven speeds: a 1 Hz topic's hour is one
fetch, a 10 Hz topic's many. A node's cells wait for the slowest stream that still has data to read (its
source holds every node of the partition, ``streams.align.holds``), so what the fast topics bring waits
in open cells. Past the aligner's bound (``AlignParams.max_open_samples``) the oldest ticks close
anyway and every straggler for them is dead-lettered as late: measured here, 89,313 samples of a
30-minute backlog of 64 GPUs.

Reading ahead of the slowest source closes no cell sooner, so the samples may as well wait in Kafka.
While a partition's open samples are past a quarter of the bound, every source with unread data whose
newest event time is more than ``lead_ns`` past the slowest such source's is paused; below an eighth,
none is. The slowest source with unread data is never paused, so a backlog always moves, and a source
read to its end is never paused, so its quiet clock runs (a paused source's does not).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def ahead(newest: Mapping[K, int], unread: Collection[K], lead_ns: int) -> set[K]:
    """The sources of ``unread`` (those with data still to read) whose newest event time (``newest``; a
    source missing there delivered nothing yet) is more than ``lead_ns`` past the slowest of them.

    >>> ahead({"a": 100, "b": 50, "c": 500}, unread={"a", "b", "c"}, lead_ns=10) == {"a", "c"}
    True
    >>> ahead({"a": 100, "b": 50, "c": 500}, unread={"a", "c"}, lead_ns=10)  # b was read to its end
    {'c'}
    >>> ahead({"a": 100}, unread={"a", "d"}, lead_ns=10)  # d has delivered nothing yet: it goes first
    {'a'}
    """
    if len(unread) < 2:
        return set()
    fronts = [newest.get(k) for k in unread]
    if None in fronts:
        return {k for k in unread if k in newest}
    floor = min(f for f in fronts if f is not None)
    return {k for k in unread if newest[k] > floor + lead_ns}


@dataclass(slots=True)
class Pacer:
    """One partition's pacing: on from a quarter of ``max_open`` open samples, off below an eighth.

    >>> p = Pacer(max_open=800, lead_ns=10)
    >>> p.paused(150, {"a": 100, "b": 0}, {"a", "b"})  # under the bound's quarter: read everything
    set()
    >>> p.paused(200, {"a": 100, "b": 0}, {"a", "b"}), p.on
    ({'a'}, True)
    >>> p.paused(150, {"a": 100, "b": 0}, {"a", "b"})  # still past an eighth: still paced
    {'a'}
    >>> p.paused(99, {"a": 100, "b": 0}, {"a", "b"}), p.on
    (set(), False)
    """

    max_open: int
    lead_ns: int
    on: bool = False

    def paused(self, open_samples: int, newest: Mapping[K, int], unread: Collection[K]) -> set[K]:
        """The sources to leave unread for now, given the partition's open samples."""
        if open_samples >= self.max_open // 4:
            self.on = True
        elif open_samples < self.max_open // 8:
            self.on = False
        return ahead(newest, unread, self.lead_ns) if self.on else set()
