"""Which streams hold a watermark back, and for how long: the one rule of the aligner.

A *stream* is a series (node x gpu x sensor) or a source (one Kafka topic-partition,
which carries many series). Each has a frontier: the newest event time it delivered.

The rule
--------
A stream holds its watermark until it has been **quiet for the idle bound while
behind**: its newest event time is older than the newest of its peers (the other
series of its node; the other sources of its partition) by more than the allowed
lateness, and since the later of the moment it fell behind and its last delivery,
its source's *quiet clock* has run for ``idle_ns``. A source that has not delivered
yet holds at minus infinity on the same terms. A delivery makes a stream hold again
at once. A series holds at its newest sample plus its *reach* (its sampling period as
measured, at most half the lateness: a sampler has nothing to send before then, and a
sample in time order is never late for it); a source at the newest *first* stamp of
its messages plus the shortest reach of its series, which covers the series it carries
that the aligner has not seen yet. No hold reaches past the node's newest event time.

The quiet clock of a source runs only while Kafka confirms the source caught up (a
fresh fetch response, nothing unread behind our position); the ingest keeps it. So a
broker outage, a slow fetch or a backlog being read stops the clock: only time in
which the data could have come, and did not, counts against a stream.

Why this rule (and not Flink's ``withIdleness`` as it is)
---------------------------------------------------------
Flink keeps a watermark per split and drops a split that delivered nothing for the
idleness timeout. That alone fails on bursts: between two bursts every topic is quiet,
so all count as idle, and the first topic of the next burst moves the watermark past
the others, whose data lands a few milliseconds later as late. Starting the idle
timer when a stream *falls behind* fixes that: nothing is idle merely for being quiet
while nobody moves. Event-time idleness ("30 s behind its node") fails too, since one
burst can move a topic minutes ahead in one fetch. A dead GPU, a stream a collector
stopped sending and the 17 topics a small collector never uses fall behind and count
as idle after ``idle_ns`` of confirmed-quiet time; that is the bound's price.

Per-step streams
----------------
The framework's streams (torch memory, NCCL collectives, the dataloader wait: the catalog's
``cadence="step"``) deliver once per training step, and a job pauses its steps for a
warm-up, a checkpoint or a pod restart: tens of seconds in which the GPU's clocked streams
go on. Such a pause is not lateness, and holding the node through it for the idle bound
would delay every frame of the node by as much. So a per-step stream falls behind as soon
as a peer is newer (no margin) and holds only until quiet for the short ``step_idle_ns``.
What that costs is a burst's guarantee, which for such a stream becomes: its part of a
burst lands within ``step_idle_ns`` (of quiet-clock time) of the burst's first delivery.
A burst is told from a pause by the rest before it: a delivery to the stream's group (its
node's series; for a source, all sources) after the group was quiet for ``step_idle_ns``
*resumes* the group and restarts the timer of each of its per-step streams. A node's
newest stream always holds, so a node with only per-step streams still has a watermark.

The same clock decides the tail: a node whose series have all been quiet for
``idle_ns`` (and no source is still holding behind) has its open cells written.
"""

from __future__ import annotations

from typing import Final, TypeVar

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
T = TypeVar("T", bound=np.generic)
UNSET: Final = -(2**62)  # no reading yet: a stream not evaluated since it appeared, or not behind


def kept(a: npt.NDArray[T], keep: npt.NDArray[np.bool_]) -> npt.NDArray[T]:
    """The entries of a per-stream array marked in ``keep`` (by stream id); the array may be shorter than
    ``keep``, since it grows lazily.

    >>> kept(np.array([5, 6]), np.array([False, True, True])).tolist()
    [6]
    """
    return a[keep[: len(a)]]


class QuietStreams:
    """Per stream: the quiet-clock reading at its last delivery and when it fell behind.

    >>> qs = QuietStreams()
    >>> qs.grow(2)
    >>> q = np.array([0, 0])
    >>> qs.delivered(np.array([0, 1]), q)
    >>> front, peer = np.array([5, 9]), np.array([9, 9])  # stream 0 is 4 behind
    >>> qs.holding(front, peer, q, idle_ns=10).tolist()  # stream 0 fell behind just now
    [True, True]
    >>> qs.holding(front, peer, np.array([10, 10]), idle_ns=10).tolist()  # quiet 10 while behind
    [False, True]
    """

    __slots__ = ("behind", "last")

    def __init__(self) -> None:
        self.last: I64 = np.empty(0, np.int64)
        self.behind: I64 = np.empty(0, np.int64)

    def __len__(self) -> int:
        return len(self.last)

    def grow(self, n: int) -> None:
        """Make room for streams up to ``n`` (new ones start unset)."""
        if n > len(self.last):
            pad = np.full(n - len(self.last), UNSET, np.int64)
            self.last = np.concatenate((self.last, pad))
            self.behind = np.concatenate((self.behind, pad))

    def delivered(self, ids: I64, quiet_now: I64) -> None:
        """``ids`` delivered input; ``quiet_now`` is each stream's quiet-clock reading (by stream)."""
        self.last[ids] = quiet_now[ids]

    def holding(self, front: I64, peer_newest: I64, quiet_now: I64, idle_ns: int | I64,
                margin_ns: int | I64 = 0) -> npt.NDArray[np.bool_]:
        """Which streams hold now; notes the moment each one fell behind (all arrays by stream;
        the bounds may be too).

        Behind means more than ``margin_ns`` behind: streams at rest after a burst end a
        sample period or so apart, and that must not start their timers.
        """
        fresh = self.last == UNSET
        self.last[fresh] = quiet_now[fresh]  # appeared without delivering (an expected source)
        behind = front < peer_newest - margin_ns
        self.behind[~behind] = UNSET
        started = behind & (self.behind == UNSET)
        self.behind[started] = quiet_now[started]
        quiet = quiet_now - np.maximum(self.last, self.behind)
        held: npt.NDArray[np.bool_] = ~behind | (quiet < idle_ns)
        return held

    def restart(self, ids: npt.NDArray[np.bool_], quiet_now: I64) -> None:
        """Streams ``ids`` count as having fallen behind just now, if they are behind at the next ``holding``."""
        self.behind[ids] = quiet_now[ids]

    def is_behind(self) -> npt.NDArray[np.bool_]:
        """Which streams were behind at the last ``holding``."""
        out: npt.NDArray[np.bool_] = self.behind != UNSET
        return out

    def quiet_for(self, quiet_now: I64) -> I64:
        """How long each stream has been quiet (since its last delivery), on its source's clock."""
        return np.where(self.last == UNSET, 0, quiet_now - self.last)

    def keep(self, keep: npt.NDArray[np.bool_]) -> None:
        """Keep only the streams marked in ``keep`` (by stream id), renumbered in order."""
        self.last, self.behind = kept(self.last, keep), kept(self.behind, keep)

    def state(self) -> tuple[I64, I64]:
        return self.last.copy(), self.behind.copy()

    def restore(self, state: tuple[I64, I64]) -> None:
        self.last, self.behind = state[0].copy(), state[1].copy()

