"""Node watermarks and when the aligner closes a node's cells.

A node's watermark is the *minimum* over the streams that hold it of the newest
event time each has delivered plus its reach (``streams.align.holds``), minus the
allowed lateness: the node's own series (gpu x sensor) and the sources (Kafka
topic-partitions) of the aligner. Using the
minimum rather than the maximum matters: the 23 sensors travel on 23 topics that a
consumer drains at different speeds, and a batch message can move one series ten
seconds ahead at once; the minimum closes a cell only when every stream has moved
past it. Which streams hold, and for how long, is one rule (``streams.align.holds``): a
stream that has fallen behind holds until it has been quiet for ``idle_ns`` on its
source's quiet clock, so a GPU that died cannot stall its node forever, while a
topic whose part of a burst lands a moment after the others still finds its cells
open. A node whose series have all been quiet that long has its cells written, so
the tail of a run is written too; and whatever the input, caps on open ticks and open
samples bound the memory (``close_before``).

>>> from streams.align.registry import StreamRegistry
>>> reg, fronts = StreamRegistry(), Fronts()
>>> n, src = reg.add_node("n", closed=0), reg.add_source("t0")
>>> sids = [reg.add_series(n, "n", gpu, 4, src, None) for gpu in "01"]
>>> fronts.grow_sources(1); fronts.grow_series(2)
>>> fronts.received(np.array(sids), np.array([src, src]), np.array([1, 1]), np.array([5_000, 9_000]))
>>> fronts.placed(np.array(sids), np.array([src, src]), np.array([5_000, 9_000]), most_reach_ns=500)
>>> held = fronts.holding(reg, None, now_ns=0, params=AlignParams(allowed_lateness_ns=1_000))
>>> fronts.watermarks(reg, held[0], held[1], lateness_ns=1_000)  # GPU 0 holds node n back
{0: 4000}
>>> fronts.placed(np.array(sids[:1]), np.array([src]), np.array([5_100]), most_reach_ns=500)
>>> fronts.watermarks(reg, held[0], held[1], lateness_ns=1_000)  # sampled every 100: nothing before 5_200
{0: 4200}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from schemas.catalog import CATALOG
from streams.align.aggregate import I64
from streams.align.grid import AlignParams
from streams.align.holds import QuietStreams, kept
from streams.align.registry import StreamRegistry
from streams.align.steps import StepRule

NO_TS: Final = -(2**62)
BoolArr = npt.NDArray[np.bool_]


STEP_SENSOR: Final = np.array([s.cadence == "step" for s in CATALOG])  # by sensor index


class Fronts:
    """Per series and per source: the newest event time delivered, and each one's quiet clock."""

    def __init__(self) -> None:
        self.series_max: I64 = np.empty(0, np.int64)
        # Per series, how far past its newest sample it holds (``reach``): its sampling period, as measured.
        self.series_reach: I64 = np.empty(0, np.int64)
        self.series_quiet = QuietStreams()
        self.src_front: I64 = np.empty(0, np.int64)  # per source, the newest first stamp of its messages
        self.src_newest: I64 = np.empty(0, np.int64)  # per source, the newest event time it delivered
        self.source_quiet = QuietStreams()
        self.series_steps = StepRule()  # the per-step streams' rule (streams.align.steps)
        self.source_steps = StepRule()
        # Series and sources that delivered since the last holding() (their quiet time restarts).
        self.touched_sid: list[I64] = []
        self.touched_src: list[I64] = []

    def grow_sources(self, n: int) -> None:
        grown = np.full((2, n), NO_TS, np.int64)
        grown[0, : len(self.src_front)] = self.src_front
        grown[1, : len(self.src_newest)] = self.src_newest
        self.src_front, self.src_newest = grown[0].copy(), grown[1].copy()
        self.source_quiet.grow(n)

    def grow_series(self, n: int) -> None:
        if len(self.series_max) < n:
            grown = np.full(n, NO_TS, np.int64)
            grown[: len(self.series_max)] = self.series_max
            self.series_max = grown
            reach = np.zeros(n, np.int64)
            reach[: len(self.series_reach)] = self.series_reach
            self.series_reach = reach

    def keep_series(self, keep: BoolArr) -> None:
        """Keep only the series marked in ``keep`` (by series id), renumbered in order; between advances (nothing
        touched since the last ``holding``)."""
        if self.touched_sid:
            raise RuntimeError("series delivered since the last holding(): renumber after an advance")
        self.series_max = kept(self.series_max, keep)
        self.series_reach = kept(self.series_reach, keep)
        self.series_quiet.keep(keep)
        self.series_steps.keep(keep)

    def received(self, msg_sids: I64, msg_srcs: I64, lens: I64, ts: I64) -> None:
        """Messages arrived (one entry each; ``ts`` all their samples, message after message)."""
        self.touched_sid.append(msg_sids)
        self.touched_src.append(msg_srcs)
        # A source's frontier is the newest *first* stamp of its messages: a collector sends a
        # batch once its samples exist, so another series' message that follows on the same
        # topic-partition starts no earlier than that, minus the lateness, however long the batches.
        full = lens > 0
        if full.all():
            np.maximum.at(self.src_front, msg_srcs, np.minimum.reduceat(ts, np.cumsum(lens) - lens))
        elif full.any():
            firsts = np.minimum.reduceat(ts, (np.cumsum(lens) - lens)[full])
            np.maximum.at(self.src_front, msg_srcs[full], firsts)

    def placed(self, sid: I64, src: I64, ts: I64, most_reach_ns: int) -> None:
        """Samples (by series and source) went into open cells; each series that moved on measures its period
        (``reach``, at most ``most_reach_ns``) as the time it moved over the samples it took to move it."""
        before = self.series_max.copy()
        np.maximum.at(self.series_max, sid, ts)
        np.maximum.at(self.src_newest, src, ts)
        moved = np.flatnonzero(self.series_max > before)
        if not len(moved):
            return
        # A sample behind its series' newest counts too, so disorder only shortens the reach.
        took = np.bincount(sid, minlength=len(before))[moved]
        since = before[moved]
        first = since == NO_TS
        if first.any():  # a series' first samples: from its oldest, over the gaps between them
            oldest = np.full(len(before), np.iinfo(np.int64).max, np.int64)
            np.minimum.at(oldest, sid, ts)
            since[first] = oldest[moved[first]]
            took[first] -= 1
        gap = (self.series_max[moved] - since) // np.maximum(took, 1)
        self.series_reach[moved] = np.minimum(np.where(took > 0, gap, 0), most_reach_ns)

    def holding(self, reg: StreamRegistry, quiet_ns: Mapping[Any, int] | None, now_ns: int,
                params: AlignParams) -> tuple[BoolArr, BoolArr, I64]:
        """Which series and which sources hold now (``streams.align.holds``), and each series' quiet time."""
        q_src = np.array([now_ns if quiet_ns is None else quiet_ns.get(k, now_ns) for k in reg.source_keys],
                         np.int64)
        sq, oq = self.series_quiet, self.source_quiet
        sq.grow(len(reg.s_src))
        s_node, s_src = reg.arr("s_node"), reg.arr("s_src")
        q_series = q_src[s_src] if len(reg.s_src) else np.empty(0, np.int64)
        node_delivered = np.zeros(len(reg.node_names), bool)
        any_delivered = bool(self.touched_sid)
        if self.touched_sid:
            sids, srcs = np.concatenate(self.touched_sid), np.concatenate(self.touched_src)
            sq.delivered(sids, q_series)
            oq.delivered(srcs, q_src)
            node_delivered[s_node[sids]] = True
            self.touched_sid, self.touched_src = [], []
        front = self.series_max
        newest = np.full(len(reg.node_names), NO_TS, np.int64)
        np.maximum.at(newest, s_node, front)
        step = STEP_SENSOR[reg.arr("s_sensor")]
        delivered = np.zeros(len(step), bool)
        if any_delivered:
            delivered[sids] = True
        # Live: the node's newest event time is within the idle bound of the wall clock (not a backlog).
        node_live = np.abs(newest - now_ns) <= params.idle_ns
        peer = newest[s_node]
        idle, margin = self.series_steps.bounds(step, node_live[s_node], delivered, node_delivered[s_node], sq,
                                                q_series, peer, params)
        series_held = sq.holding(front, peer, q_series, idle, margin) & (front > NO_TS)
        self.series_steps.note(sq, peer)
        # A source that has carried only per-step series takes their rule.
        src_step = np.zeros(len(self.src_newest), bool)
        src_step[s_src] = True
        src_step[s_src[~step]] = False
        src_delivered = np.zeros(len(src_step), bool)
        if any_delivered:
            src_delivered[srcs] = True
        newest_src = int(self.src_newest.max(initial=NO_TS))
        peer = np.full(len(self.src_newest), newest_src, np.int64)
        src_live = np.full(len(src_step), abs(newest_src - now_ns) <= params.idle_ns)
        idle, margin = self.source_steps.bounds(src_step, src_live, src_delivered,
                                                np.full(len(src_step), any_delivered), oq, q_src, peer, params)
        source_held = oq.holding(self.src_newest, peer, q_src, idle, margin)
        self.source_steps.note(oq, peer)
        return series_held, source_held, sq.quiet_for(q_series)

    def watermarks(self, reg: StreamRegistry, series_held: BoolArr, source_held: BoolArr,
                   lateness_ns: int) -> dict[int, int]:
        """Per node id: min over the streams holding it of their newest event time plus their reach
        (``streams.align.holds``), at most the node's newest event time, minus the lateness."""
        if not len(self.series_max):
            return {}
        s_node, s_src = reg.arr("s_node"), reg.arr("s_src")
        seen = self.series_max > NO_TS
        nodes = len(reg.node_names)
        newest = np.full(nodes, NO_TS, np.int64)
        np.maximum.at(newest, s_node[seen], self.series_max[seen])
        low = np.full(nodes, np.iinfo(np.int64).max, np.int64)
        reach = self.series_reach[: len(s_node)]
        np.minimum.at(low, s_node[series_held], self.series_max[series_held] + reach[series_held])
        # A source reaches as far as the shortest reach of the series it carries (none known: its front alone).
        most = np.iinfo(np.int64).max
        src_reach = np.full(len(self.src_front), most, np.int64)
        np.minimum.at(src_reach, s_src, reach)
        src_reach[src_reach == most] = 0
        floor = int((self.src_front + src_reach)[source_held].min(initial=most))
        np.minimum(low, floor, out=low)
        # Never past the node's newest event time: a sample within the lateness of it is never late, reach or not
        # (without the reach the node's newest series, which always holds, kept the watermark there).
        np.minimum(low, newest, out=low)
        return {n: max(int(low[n]), NO_TS) - lateness_ns for n in range(nodes) if newest[n] > NO_TS}


def close_before(params: AlignParams, closed: I64, newest_tick: I64, wms: Mapping[int, int], least_quiet: I64,
                 may_idle: bool, source_hold_ns: int | None) -> I64:
    """Per node, the tick below which its cells close now.

    ``closed``: what is final already; ``newest_tick``: each node's newest open tick; ``wms``: the
    watermarks; ``least_quiet``: how long each node's least quiet series has been quiet; ``may_idle``:
    whether a quiet node may have its cells written.
    """
    close = closed.copy()
    grid = params.grid_ns
    for nid in range(len(close)):
        if newest_tick[nid] == NO_TS:
            continue
        c = int(close[nid])
        wm = wms.get(nid)
        if wm is not None and source_hold_ns is not None:
            wm = min(wm, source_hold_ns - params.allowed_lateness_ns)
        if wm is not None:
            c = max(c, wm // grid)
        if may_idle and least_quiet[nid] >= params.idle_ns:
            c = int(newest_tick[nid]) + 1
        # Bounded memory: a node cannot hold more open ticks than the cap, whatever its input.
        c = max(c, int(newest_tick[nid]) + 1 - params.max_open_ticks)
        close[nid] = c
    return close


def cap_open(max_open_samples: int, close: I64, open_tick: I64, row_node: I64) -> tuple[I64, int]:
    """``close`` raised so that at most ``max_open_samples`` of the open samples (their ticks and
    nodes) stay open: bounded memory whatever the input rate or the skew. The oldest ticks of
    all nodes close until the rest fit; stragglers for them become late. Also returns the tick
    below which the cap closed every node (``NO_TS`` when it closed nothing).

    >>> close, below = cap_open(2, np.array([0, 0]), np.array([5, 6, 7, 5]), np.array([0, 0, 0, 1]))
    >>> close.tolist(), below
    ([6, 6], 6)
    """
    excess = len(open_tick) - max_open_samples
    if excess <= 0:
        return close, NO_TS
    floor = int(np.partition(open_tick, excess)[excess])
    if (open_tick < np.maximum(close, floor)[row_node]).sum() < excess:
        floor += 1
    return np.maximum(close, floor), floor
