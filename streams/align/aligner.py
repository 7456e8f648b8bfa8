"""Event-time alignment of sensor samples onto a fixed grid of frames.

One frame is one GPU (or a node's ``host`` pseudo-GPU) x one grid tick, holding
every sensor's aggregate by the catalog's rule plus the per-sensor sample count
(``streams.align.aggregate``).

A node's watermark is the *minimum* over the streams that hold it of the newest
event time each has delivered, minus the allowed lateness: the node's own series
(gpu x sensor) and the sources (Kafka topic-partitions) of the aligner. Using the
minimum rather than the maximum matters: the 23 sensors travel on 23 topics that a
consumer drains at different speeds, and a batch message can move one series ten
seconds ahead at once; the minimum closes a cell only when every stream has moved
past it. Which streams hold, and for how long, is one rule (``streams.align.holds``): a
stream that has fallen behind holds until it has been quiet for ``idle_ns`` on its
source's quiet clock, so a GPU that died cannot stall its node forever, while a
topic whose part of a burst lands a moment after the others still finds its cells
open. A node whose series have all been quiet that long has its cells written, so
the tail of a run is written too.

Every sample carries its source position (an opaque source id and an offset).
``oldest_positions()`` tells, per source, the oldest position still held by an
open cell: the ingest commits no further than that, so a crash replays exactly
the samples of the cells it lost.

Why arrays: ``add`` only appends a message's samples to flat lists, and
``advance`` handles everything added since the last call in a few numpy passes
(tick, lateness, per-cell aggregates, the pivot into frames). Per-sample Python
work would cost ten times the JSON decode; this keeps alignment well below it.
Open cells keep their raw samples, so aggregates never depend on arrival order.
"""

from __future__ import annotations

import copy
from array import array
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from schemas.catalog import CATALOG
from schemas.frames import COUNT_COLUMNS, VALUE_COLUMNS
from schemas.records import Labels
from streams.align.aggregate import F64, I64, Frame, FrameBatch, aggregate
from streams.align.correction import Correction, to_utc
from streams.align.grid import Advance, AlignParams, LateSamples, Recovered
from streams.align.holds import QuietStreams

__all__ = [
    "COUNT_COLUMNS",
    "VALUE_COLUMNS",
    "Advance",
    "AlignParams",
    "Correction",
    "Frame",
    "FrameBatch",
    "GridAligner",
    "LateSamples",
    "Recovered",
]
_NO_TS: Final = -(2**62)
BoolArr = npt.NDArray[np.bool_]
N_SENSORS: Final = len(CATALOG)


def _empty_i64() -> I64:
    return np.empty(0, np.int64)


def _empty_f64() -> F64:
    return np.empty(0, np.float64)


@dataclass(slots=True)
class AlignerState:
    """Picklable snapshot of a ``GridAligner`` (everything but the pending, unprocessed input)."""

    params: AlignParams
    recovered: Recovered
    registry: dict[str, Any]
    open_rows: dict[str, npt.NDArray[Any]]


class GridAligner:
    """Aligns samples of many nodes onto the grid and emits frames as cells become final.

    >>> a = GridAligner(AlignParams(allowed_lateness_ns=0))
    >>> a.add("n1", "0", 4, [100, 600_000_000], [300.0, 310.0])
    >>> a.add("n1", "0", 4, [1_200_000_000], [320.0])
    >>> [(f.tick_ns, f.value("power")) for f in a.advance(now_ns=0).frames.frames()]
    [(0, 305.0)]
    """

    def __init__(self, params: AlignParams, recovered: Recovered | None = None) -> None:
        self.params = params
        self._grid = params.grid_ns
        self._recovered = recovered or Recovered()
        # Registries: names to dense ids, so per-sample data is integers in arrays.
        self._nodes: dict[str, int] = {}
        self._node_names: list[str] = []
        self._node_closed: list[int] = []  # ticks below this are final, per node
        self._pairs: dict[tuple[str, str], int] = {}
        self._pair_names: list[tuple[str, str]] = []
        self._series: dict[tuple[int, str, int], int] = {}  # (node id, gpu, sensor) -> series id
        self._s_node: list[int] = []
        self._s_pair: list[int] = []
        self._s_sensor: list[int] = []
        self._s_src: list[int] = []  # the source a series arrives on (its first)
        self._series_max: I64 = _empty_i64()
        self._series_quiet = QuietStreams()
        self._labels: dict[int, Labels] = {}
        self._counter_prev: dict[int, float] = {}
        self._sources: dict[Hashable, int] = {}
        self._source_keys: list[Hashable] = []
        self._src_front: I64 = _empty_i64()  # per source, the newest first stamp of its messages
        self._src_newest: I64 = _empty_i64()  # per source, the newest event time it delivered
        self._source_quiet = QuietStreams()
        # Series and sources that delivered since the last advance (their quiet time restarts).
        self._touched_sid: list[I64] = []
        self._touched_src: list[I64] = []
        # Input since the last advance: flat samples plus one entry per add call.
        self._p_ts = array("q")
        self._p_v = array("d")
        self._p_sid: list[int] = []
        self._p_len: list[int] = []
        self._p_src: list[int] = []
        self._p_pos: list[int] = []
        self._p_fix: list[tuple[int, Correction]] = []  # (message index, its clock correction)
        self._late_store: list[LateSamples] = []  # late samples found outside advance()
        self._arrays: dict[str, I64] = {}  # cache of _arr()
        self._held: tuple[BoolArr, BoolArr] | None = None  # who held at the last advance
        # Samples of open cells.
        self._o_sid: I64 = _empty_i64()
        self._o_tick: I64 = _empty_i64()
        self._o_ts: I64 = _empty_i64()
        self._o_v: F64 = _empty_f64()
        self._o_src: I64 = _empty_i64()
        self._o_pos: I64 = _empty_i64()
        self._o_unc: I64 = _empty_i64()

    # -- input ---------------------------------------------------------------------------
    def _node_id(self, node: str) -> int:
        nid = self._nodes.get(node)
        if nid is None:
            nid = self._nodes[node] = len(self._node_names)
            self._node_names.append(node)
            boundary = self._recovered.boundaries.get(node)
            self._node_closed.append(_NO_TS if boundary is None else boundary // self._grid + 1)
        return nid

    def _source_id(self, source: Hashable) -> int:
        src = self._sources.get(source)
        if src is None:
            src = self._sources[source] = len(self._source_keys)
            self._source_keys.append(source)
            grown = np.full((2, len(self._source_keys)), _NO_TS, np.int64)
            grown[0, : len(self._src_front)] = self._src_front
            grown[1, : len(self._src_newest)] = self._src_newest
            self._src_front, self._src_newest = grown[0].copy(), grown[1].copy()
            self._source_quiet.grow(len(self._source_keys))
        return src

    def expect(self, sources: Sequence[Hashable]) -> None:
        """Sources that will deliver (an assignment's topic-partitions): until each has
        delivered or counts as idle, it holds every node's watermark back."""
        for source in sources:
            self._source_id(source)

    def _series_id(self, nid: int, node: str, gpu: str, sensor_index: int, src: int) -> int:
        sid = self._series.get((nid, gpu, sensor_index))
        if sid is None:
            sid = self._series[(nid, gpu, sensor_index)] = len(self._s_node)
            pid = self._pairs.get((node, gpu))
            if pid is None:
                pid = self._pairs[(node, gpu)] = len(self._pair_names)
                self._pair_names.append((node, gpu))
            self._s_node.append(nid)
            self._s_pair.append(pid)
            self._s_sensor.append(sensor_index)
            self._s_src.append(src)
            prev = self._recovered.counters.get((node, gpu, sensor_index))
            if prev is not None:
                self._counter_prev[sid] = prev
        return sid

    def add(self, node: str, gpu: str, sensor_index: int, ts_ns: Sequence[int], values: Sequence[float],
            labels: Labels | None = None, source: Hashable = None, position: int = 0,
            correction: Correction | None = None) -> None:
        """Queue one series' samples; ``advance`` places them (or reports them late).

        ``correction`` maps the samples' clock-domain times onto UTC (applied to the whole
        poll at once in ``advance``); without it the times are UTC already.
        """
        nid = self._nodes.get(node)
        if nid is None:
            nid = self._node_id(node)
        src = self._sources.get(source)
        if src is None:
            src = self._source_id(source)
        sid = self._series.get((nid, gpu, sensor_index))
        if sid is None:
            sid = self._series_id(nid, node, gpu, sensor_index, src)
        if labels is not None:
            self._labels[self._s_pair[sid]] = labels
        n = len(self._p_ts)
        try:
            self._p_ts.extend(ts_ns)
            self._p_v.extend(values)
            if len(self._p_ts) != len(self._p_v):
                raise ValueError(f"{len(ts_ns)} times but {len(values)} values")
        except Exception:
            del self._p_ts[n:], self._p_v[n:]  # all or nothing: the caller may go on with the next message
            raise
        self._p_sid.append(sid)
        self._p_len.append(len(ts_ns))
        self._p_src.append(src)
        self._p_pos.append(position)
        if correction is not None:
            self._p_fix.append((len(self._p_len) - 1, correction))

    def _take_pending(self) -> list[LateSamples]:
        if not self._p_len:
            return []
        lens = np.array(self._p_len, np.int64)
        ts = np.frombuffer(self._p_ts, np.int64)
        v = np.frombuffer(self._p_v, np.float64)
        msg_sids = np.array(self._p_sid, np.int64)
        msg_srcs = np.array(self._p_src, np.int64)
        sid = np.repeat(msg_sids, lens)
        src = np.repeat(msg_srcs, lens)
        pos = np.repeat(np.array(self._p_pos, np.int64), lens)
        if self._p_fix:
            ts, unc = to_utc(ts, lens, self._p_fix)
        else:
            unc = np.zeros(len(ts), np.int64)
        msg_src, msg_pos = self._p_src, self._p_pos
        self._p_ts, self._p_v = array("q"), array("d")
        self._p_sid, self._p_len, self._p_src, self._p_pos, self._p_fix = [], [], [], [], []
        if len(self._series_max) < len(self._s_node):
            grown = np.full(len(self._s_node), _NO_TS, np.int64)
            grown[: len(self._series_max)] = self._series_max
            self._series_max = grown
        self._touched_sid.append(msg_sids)
        self._touched_src.append(msg_srcs)
        # A source's frontier is the newest *first* stamp of its messages: a collector sends a
        # batch once its samples exist, so another series' message that follows on the same
        # topic-partition starts no earlier than that, minus the lateness, however long the batches.
        full = lens > 0
        if full.all():
            np.maximum.at(self._src_front, msg_srcs, np.minimum.reduceat(ts, np.cumsum(lens) - lens))
        elif full.any():
            firsts = np.minimum.reduceat(ts, (np.cumsum(lens) - lens)[full])
            np.maximum.at(self._src_front, msg_srcs[full], firsts)
        tick = ts // self._grid
        closed = np.array(self._node_closed, np.int64)[self._arr("_s_node")[sid]]
        late = tick < closed
        out: list[LateSamples] = []
        if late.any():
            starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
            idx = np.flatnonzero(late)
            msg = np.searchsorted(starts, idx, side="right") - 1
            disorder = self._series_max[sid[idx]] - ts[idx] > self.params.allowed_lateness_ns
            for m in np.unique(msg).tolist():
                mine = msg == m
                rel = (idx[mine] - starts[m]).tolist()
                why = "disorder" if bool(disorder[mine][0]) else "idle"
                out.append(LateSamples(self._source_keys[msg_src[m]], msg_pos[m], rel, int(lens[m]), why))
            keep = ~late
            ts, v, sid, src, pos, tick = ts[keep], v[keep], sid[keep], src[keep], pos[keep], tick[keep]
            unc = unc[keep]
        np.maximum.at(self._series_max, sid, ts)
        np.maximum.at(self._src_newest, src, ts)
        self._o_sid = np.concatenate((self._o_sid, sid))
        self._o_tick = np.concatenate((self._o_tick, tick))
        self._o_ts = np.concatenate((self._o_ts, ts))
        self._o_v = np.concatenate((self._o_v, v))
        self._o_src = np.concatenate((self._o_src, src))
        self._o_pos = np.concatenate((self._o_pos, pos))
        self._o_unc = np.concatenate((self._o_unc, unc))
        return out

    def _arr(self, name: str) -> I64:
        """A series registry list as an array, rebuilt only when series were added."""
        cached = self._arrays.get(name)
        if cached is None or len(cached) != len(self._s_node):
            cached = self._arrays[name] = np.array(getattr(self, name), np.int64)
        return cached

    # -- output --------------------------------------------------------------------------
    def watermark(self, node: str) -> int | None:
        """Event time up to which the node's cells are final (None before any input), as of the
        last ``advance`` (or, before any, with every stream holding)."""
        self._take_pending_keep_late()
        nid = self._nodes.get(node)
        if nid is None:
            return None
        held = self._held
        if held is None or len(held[0]) != len(self._series_max) or len(held[1]) != len(self._src_front):
            held = np.ones(len(self._series_max), bool), np.ones(len(self._src_front), bool)
        return self._watermarks(*held).get(nid)

    def _take_pending_keep_late(self) -> None:
        self._late_store.extend(self._take_pending())

    def _holding(self, quiet_ns: Mapping[Any, int] | None, now_ns: int) -> tuple[BoolArr, BoolArr, I64]:
        """Which series and which sources hold now (``streams.align.holds``), and each series' quiet time."""
        q_src = np.array([now_ns if quiet_ns is None else quiet_ns.get(k, now_ns) for k in self._source_keys],
                         np.int64)
        sq, oq = self._series_quiet, self._source_quiet
        sq.grow(len(self._s_src))
        if self._touched_sid:
            q_series = q_src[self._arr("_s_src")]
            sq.delivered(np.concatenate(self._touched_sid), q_series)
            oq.delivered(np.concatenate(self._touched_src), q_src)
            self._touched_sid, self._touched_src = [], []
        else:
            q_series = q_src[self._arr("_s_src")] if len(self._s_src) else _empty_i64()
        idle, margin = self.params.idle_ns, self.params.allowed_lateness_ns
        front = self._series_max
        s_node = self._arr("_s_node")
        newest = np.full(len(self._node_names), _NO_TS, np.int64)
        np.maximum.at(newest, s_node, front)
        series_held = sq.holding(front, newest[s_node], q_series, idle, margin) & (front > _NO_TS)
        peer = np.full(len(self._src_newest), self._src_newest.max(initial=_NO_TS), np.int64)
        source_held = oq.holding(self._src_newest, peer, q_src, idle, margin)
        return series_held, source_held, sq.quiet_for(q_series)

    def _watermarks(self, series_held: BoolArr, source_held: BoolArr) -> dict[int, int]:
        """Per node id: min over the streams holding it of their newest event time, minus the lateness."""
        if not len(self._series_max):
            return {}
        s_node = self._arr("_s_node")
        seen = self._series_max > _NO_TS
        nodes = len(self._node_names)
        newest = np.full(nodes, _NO_TS, np.int64)
        np.maximum.at(newest, s_node[seen], self._series_max[seen])
        low = np.full(nodes, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(low, s_node[series_held], self._series_max[series_held])
        floor = int(self._src_front[source_held].min(initial=np.iinfo(np.int64).max))
        np.minimum(low, floor, out=low)
        lateness = self.params.allowed_lateness_ns
        return {n: max(int(low[n]), _NO_TS) - lateness for n in range(nodes) if newest[n] > _NO_TS}

    def advance(self, now_ns: int, source_hold_ns: int | None = None,
                quiet_ns: Mapping[Any, int] | None = None) -> Advance:
        """Place the queued samples and close every cell the watermarks have passed.

        ``now_ns`` is processing time. ``quiet_ns`` gives each source's quiet clock (time
        during which Kafka confirmed it caught up, ``streams.align.holds``); a source missing
        there, or every source when it is None, uses ``now_ns``. ``source_hold_ns`` is an
        event time nothing may close past (minus the lateness), such as that of samples
        waiting for their clock; while it is set, no node counts as idle.
        """
        late = self._late_store + self._take_pending()
        self._late_store = []
        series_held, source_held, series_quiet = self._holding(quiet_ns, now_ns)
        self._held = series_held, source_held
        if not len(self._o_sid):
            return Advance(self._empty_batch(), late)
        nodes = len(self._node_names)
        row_node = self._arr("_s_node")[self._o_sid]
        newest_tick = np.full(nodes, _NO_TS, np.int64)
        np.maximum.at(newest_tick, row_node, self._o_tick)
        wms = self._watermarks(series_held, source_held)
        # A node is idle when all its series have been quiet for the bound and no source
        # still holds from behind (its part of a burst may yet bring this node's samples).
        s_node = self._arr("_s_node")
        least_quiet = np.full(nodes, np.iinfo(np.int64).max, np.int64)
        seen = self._series_max > _NO_TS
        np.minimum.at(least_quiet, s_node[seen], series_quiet[seen])
        may_idle = source_hold_ns is None and not (source_held & self._source_quiet.is_behind()).any()
        close = np.array(self._node_closed, np.int64)
        for nid in range(nodes):
            if newest_tick[nid] == _NO_TS:
                continue
            c = int(close[nid])
            wm = wms.get(nid)
            if wm is not None and source_hold_ns is not None:
                wm = min(wm, source_hold_ns - self.params.allowed_lateness_ns)
            if wm is not None:
                c = max(c, wm // self._grid)
            if may_idle and least_quiet[nid] >= self.params.idle_ns:
                c = int(newest_tick[nid]) + 1
            # Bounded memory: a node cannot hold more open ticks than the cap, whatever its input.
            c = max(c, int(newest_tick[nid]) + 1 - self.params.max_open_ticks)
            close[nid] = c
        excess = len(self._o_tick) - self.params.max_open_samples
        if excess > 0:
            # Bounded memory whatever the input rate or the skew: the oldest ticks of all
            # nodes close until the open samples fit again; stragglers for them become late.
            oldest_kept = int(np.partition(self._o_tick, excess)[excess])
            close = np.maximum(close, oldest_kept)
            if (self._o_tick < close[row_node]).sum() < excess:
                close = np.maximum(close, oldest_kept + 1)
        return Advance(self._close(close, row_node), late)

    def flush_all(self) -> Advance:
        """Close every open cell (shutdown of a run whose input has ended)."""
        late = self._late_store + self._take_pending()
        self._late_store = []
        if not len(self._o_sid):
            return Advance(self._empty_batch(), late)
        row_node = self._arr("_s_node")[self._o_sid]
        close = np.array(self._node_closed, np.int64)
        newest_tick = np.full(len(close), _NO_TS, np.int64)
        np.maximum.at(newest_tick, row_node, self._o_tick)
        close = np.maximum(close, newest_tick + 1)
        return Advance(self._close(close, row_node), late)

    def _close(self, close: I64, row_node: I64) -> FrameBatch:
        self._node_closed = [max(a, b) for a, b in zip(self._node_closed, close.tolist(), strict=True)]
        done = self._o_tick < close[row_node]
        if not done.any():
            return self._empty_batch()
        keep = ~done
        sid, tick, ts, v = self._o_sid[done], self._o_tick[done], self._o_ts[done], self._o_v[done]
        unc = self._o_unc[done]
        self._o_sid, self._o_tick, self._o_ts = self._o_sid[keep], self._o_tick[keep], self._o_ts[keep]
        self._o_v, self._o_src, self._o_pos = self._o_v[keep], self._o_src[keep], self._o_pos[keep]
        self._o_unc = self._o_unc[keep]
        return self._aggregate(sid, tick, ts, v, unc)

    def _empty_batch(self) -> FrameBatch:
        return FrameBatch(_empty_i64(), [], [], [], {c: _empty_f64() for c in VALUE_COLUMNS},
                          {c: _empty_i64() for c in COUNT_COLUMNS}, _empty_i64())

    def _aggregate(self, sid: I64, tick: I64, ts: I64, v: F64, unc: I64) -> FrameBatch:
        return aggregate(sid, tick, ts, v, unc, s_sensor=self._arr("_s_sensor"), s_pair=self._arr("_s_pair"),
                         pair_names=self._pair_names, labels=self._labels, counter_prev=self._counter_prev,
                         grid=self._grid)

    # -- bookkeeping ---------------------------------------------------------------------
    def oldest_positions(self) -> dict[Hashable, int]:
        """Per source, the oldest position an open cell (or unplaced input) still depends on."""
        out: dict[Hashable, int] = {}
        if len(self._o_src):
            low = np.full(len(self._source_keys), np.iinfo(np.int64).max, np.int64)
            np.minimum.at(low, self._o_src, self._o_pos)
            for i, pos in enumerate(low.tolist()):
                if pos != np.iinfo(np.int64).max:
                    out[self._source_keys[i]] = pos
        for src, pos in zip(self._p_src, self._p_pos, strict=True):
            key = self._source_keys[src]
            if pos < out.get(key, pos + 1):
                out[key] = pos
        return out

    def closed_ticks(self) -> dict[str, int]:
        """Per node, the start of the newest tick that is final (written, or closed with no
        samples), for the nodes that have closed one."""
        return {n: (c - 1) * self._grid for n, c in zip(self._node_names, self._node_closed, strict=True)
                if c != _NO_TS}

    def open_cells(self) -> int:
        if not len(self._o_sid):
            return 0
        pairs = self._arr("_s_pair")[self._o_sid]
        base = int(self._o_tick.min())
        span = int(self._o_tick.max()) - base + 1
        return len(np.unique(pairs * span + (self._o_tick - base)))

    def snapshot(self) -> AlignerState:
        self._take_pending_keep_late()
        registry = {k: copy.deepcopy(getattr(self, k)) for k in _REGISTRY}
        rows = {k: getattr(self, k).copy() for k in _ROWS}
        return AlignerState(self.params, self._recovered, registry, rows)

    @classmethod
    def restore(cls, state: AlignerState) -> GridAligner:
        aligner = cls(state.params, state.recovered)
        for k, val in state.registry.items():
            setattr(aligner, k, copy.deepcopy(val))
        for k, arr in state.open_rows.items():
            setattr(aligner, k, arr.copy())
        return aligner


_REGISTRY: Final = ("_late_store", "_nodes", "_node_names", "_node_closed", "_pairs", "_pair_names", "_series",
                    "_s_node", "_s_pair", "_s_sensor", "_s_src", "_series_max", "_series_quiet", "_labels",
                    "_counter_prev", "_sources", "_source_keys", "_src_front", "_src_newest", "_source_quiet",
                    "_touched_sid", "_touched_src")
_ROWS: Final = ("_o_sid", "_o_tick", "_o_ts", "_o_v", "_o_src", "_o_pos", "_o_unc")
