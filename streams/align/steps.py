"""When a per-step stream holds its node for the short step bound, and when like any other stream.

The rule is told in ``streams.align.holds`` ("Per-step streams"); this is its state, per stream
(series, or source): the quiet-clock reading at its group's last delivery (a delivery after a rest
*resumes* the group), the peers' newest event time when its timer started, and whether it is in a
burst. Three guards keep the short bound to a live job's pause:

- **live**: its group's newest event time is within the idle bound of the wall clock, so a backlog,
  a replay or a backfill of old data holds per-step streams like any other;
- **resumed**: a delivery to its group after ``step_idle_ns`` of quiet restarts its timer, so a
  burst that follows a rest gives its part that long to land;
- **no burst**: once its peers ran ahead of its quiet clock by more than the allowed lateness
  since its timer started (a producer flushing a buffer after a broker outage), it holds like any
  other stream until it delivers.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from streams.align.grid import AlignParams
from streams.align.holds import I64, UNSET, QuietStreams, kept

BoolArr = npt.NDArray[np.bool_]


class Resumes:
    """Per stream, its quiet clock's reading when its group last delivered; a group's delivery after
    it was quiet for at least ``gap_ns`` on a stream's clock *resumes* the group for that stream.

    >>> r = Resumes()
    >>> r.grow(2)
    >>> r.update(np.array([True, False]), np.array([0, 0]), gap_ns=5).tolist()  # a first delivery resumes
    [True, False]
    >>> r.update(np.array([True, True]), np.array([3, 3]), gap_ns=5).tolist()  # stream 0's group was quiet 3
    [False, True]
    >>> r.update(np.array([True, True]), np.array([9, 5]), gap_ns=5).tolist()
    [True, False]
    """

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen: I64 = np.empty(0, np.int64)

    def grow(self, n: int) -> None:
        if n > len(self.seen):
            self.seen = np.concatenate((self.seen, np.full(n - len(self.seen), UNSET, np.int64)))

    def keep(self, keep: npt.NDArray[np.bool_]) -> None:
        self.seen = kept(self.seen, keep)

    def update(self, group_delivered: npt.NDArray[np.bool_], quiet_now: I64, gap_ns: int) -> npt.NDArray[np.bool_]:
        """Which streams' groups resume now (``group_delivered`` and ``quiet_now`` by stream)."""
        out: npt.NDArray[np.bool_] = group_delivered & ((self.seen == UNSET) | (quiet_now - self.seen >= gap_ns))
        self.seen[group_delivered] = quiet_now[group_delivered]
        return out


class StepRule:
    """The per-step rule's state for one kind of stream (series or sources).

    >>> rule, qs = StepRule(), QuietStreams()
    >>> qs.grow(2)
    >>> p = AlignParams(allowed_lateness_ns=2, idle_ns=100, step_idle_ns=5)
    >>> step, live = np.array([True, False]), np.array([True, True])
    >>> front, peer, none = np.array([10, 10]), np.array([11, 11]), np.array([False, False])
    >>> idle, margin = rule.bounds(step, live, none, none, qs, np.array([0, 0]), peer, p)
    >>> idle.tolist(), margin.tolist()  # the per-step stream: the short bound, no margin
    ([5, 100], [0, 2])
    >>> _ = qs.holding(front, peer, np.array([0, 0]), idle, margin)
    >>> rule.note(qs, peer)
    >>> qs.behind.tolist()[0] == 0  # it fell behind (a peer is newer) at quiet time 0
    True
    >>> idle, _ = rule.bounds(step, live, none, none, qs, np.array([1, 1]), np.array([30, 30]), p)
    >>> idle.tolist()  # the peers ran 19 ahead in 1 of quiet: a burst, it holds like any other
    [100, 100]
    """

    __slots__ = ("_before", "_last_peer", "anchor", "burst", "resumes")

    def __init__(self) -> None:
        self.resumes = Resumes()
        # The peers' newest just before the poll in which the stream's timer started: a poll that brings a
        # whole backlog of its peers at once must count as their running ahead.
        self.anchor: I64 = np.empty(0, np.int64)
        self._last_peer: I64 = np.empty(0, np.int64)  # the peers' newest at the last call
        self.burst: BoolArr = np.empty(0, bool)
        self._before: I64 = np.empty(0, np.int64)

    def bounds(self, step: BoolArr, live: BoolArr, delivered: BoolArr, group_delivered: BoolArr,
               quiet: QuietStreams, quiet_now: I64, peer_newest: I64, params: AlignParams) -> tuple[I64, I64]:
        """Per stream, its idle bound and behind margin for the next ``quiet.holding`` (all by stream)."""
        n = len(step)
        self.resumes.grow(n)
        if len(self.anchor) < n:
            self.anchor = np.concatenate((self.anchor, np.full(n - len(self.anchor), UNSET, np.int64)))
            self.burst = np.concatenate((self.burst, np.zeros(n - len(self.burst), bool)))
        self._before = quiet.behind.copy()
        resumed = self.resumes.update(group_delivered, quiet_now, params.step_idle_ns)
        quiet.restart(resumed & step, quiet_now)
        self.burst[delivered] = False
        timed = (quiet.behind != UNSET) & (self.anchor != UNSET)
        ran = (peer_newest - self.anchor) - (quiet_now - quiet.behind)
        self.burst |= step & timed & (ran > params.allowed_lateness_ns)
        fast = step & live & ~self.burst
        return (np.where(fast, params.step_idle_ns, params.idle_ns).astype(np.int64),
                np.where(fast, 0, params.allowed_lateness_ns).astype(np.int64))

    def keep(self, keep: BoolArr) -> None:
        """Keep only the streams marked in ``keep`` (by stream id), renumbered in order."""
        self.resumes.keep(keep)
        self.anchor, self.burst = kept(self.anchor, keep), kept(self.burst, keep)
        self._last_peer, self._before = kept(self._last_peer, keep), kept(self._before, keep)

    def note(self, quiet: QuietStreams, peer_newest: I64) -> None:
        """After ``quiet.holding``: streams whose timer started (or restarted) now take the peers' newest from
        before this poll."""
        started = quiet.behind != self._before
        before = peer_newest.copy()
        before[: len(self._last_peer)] = np.minimum(self._last_peer[: len(before)], before[: len(self._last_peer)])
        self.anchor[started] = before[started]
        self.anchor[quiet.behind == UNSET] = UNSET
        self._last_peer = peer_newest.copy()
