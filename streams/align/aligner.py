"""Event-time alignment of sensor samples onto a fixed grid of frames.

One frame is one GPU (or a node's ``host`` pseudo-GPU) x one grid tick, holding
every sensor's aggregate by the catalog's rule plus the per-sensor sample count
(``streams.align.aggregate``).

A node's watermark and when its cells close (``streams.align.watermark``): the minimum over
the streams that hold it (``streams.align.holds``) of the newest event time each has
delivered, minus the allowed lateness. Names become dense ids in ``streams.align.registry``.

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
from schemas.records import Labels, Times, Values
from streams.align.aggregate import F64, I64, Frame, FrameBatch, aggregate
from streams.align.correction import Correction
from streams.align.forget import Gone, GoneNodes, forgettable, worth_it
from streams.align.grid import Advance, AlignParams, LateSamples, Recovered
from streams.align.holds import kept
from streams.align.open_samples import OpenSamples, Rows
from streams.align.pending import Pending
from streams.align.registry import StreamRegistry
from streams.align.watermark import NO_TS, BoolArr, Fronts, cap_open, close_before

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
        self._reg = StreamRegistry()
        self._fronts = Fronts()
        self._pending = Pending()  # input since the last advance
        self._late_store: list[LateSamples] = []  # late samples found outside advance()
        self._held: tuple[BoolArr, BoolArr] | None = None  # who held at the last advance
        self._open = OpenSamples()  # samples of open cells
        self._gone = GoneNodes()  # nodes forgotten after they went quiet (streams.align.forget)
        self.forgotten = 0  # nodes forgotten so far
        self._capped_below = NO_TS  # every node's ticks below this were closed by max_open_samples

    # -- input ---------------------------------------------------------------------------
    def _node_id(self, node: str) -> int:
        boundary = self._recovered.boundaries.get(node)
        closed = self._gone.closed(node, NO_TS if boundary is None else boundary // self._grid + 1)
        return self._reg.add_node(node, closed)

    def _source_id(self, source: Hashable) -> int:
        src = self._reg.add_source(source)
        self._fronts.grow_sources(len(self._reg.source_keys))
        return src

    def expect(self, sources: Sequence[Hashable]) -> None:
        """Sources that will deliver (an assignment's topic-partitions): until each has
        delivered or counts as idle, it holds every node's watermark back."""
        for source in sources:
            if source not in self._reg.sources:
                self._source_id(source)

    def add(self, node: str, gpu: str, sensor_index: int, ts_ns: Times, values: Values,
            labels: Labels | None = None, source: Hashable = None, position: int = 0,
            correction: Correction | None = None) -> None:
        """Queue one series' samples; ``advance`` places them (or reports them late).

        ``correction`` maps the samples' clock-domain times onto UTC (applied to the whole
        poll at once in ``advance``); without it the times are UTC already.
        """
        src = self._reg.sources.get(source)
        if src is None:
            src = self._source_id(source)
        sid = self._series_id(node, gpu, sensor_index, src, labels)
        ts, v = _column(ts_ns, "q"), _column(values, "d")  # before any state changes: all or nothing
        if len(ts) != len(v):
            raise ValueError(f"{len(ts_ns)} times but {len(values)} values")
        self._pending.add(sid, src, position, ts, v, correction)

    def add_block(self, sensor_index: int, nodes: Sequence[str], gpus: Sequence[str],
                  labels: Sequence[Labels | None], lens: Sequence[int], ts_ns: I64, values: F64,
                  source: Hashable, positions: Sequence[int]) -> None:
        """``add`` for many messages of one sensor and source in UTC (a poll's, ``schemas.poll_decode``): message
        i has ``lens[i]`` samples, back to back with the others' in ``ts_ns`` and ``values``."""
        if not len(ts_ns) == len(values) == sum(lens) or not len(nodes) == len(gpus) == len(labels) == len(lens):
            raise ValueError(f"{len(ts_ns)} times and {len(values)} values for {len(lens)} messages of "
                             f"{sum(lens)} samples")
        src = self._reg.sources.get(source)
        if src is None:
            src = self._source_id(source)
        series = self._series_id
        sids = [series(node, gpu, sensor_index, src, lab) for node, gpu, lab in zip(nodes, gpus, labels, strict=True)]
        self._pending.add_block(sids, src, positions, lens, ts_ns, values)

    def _series_id(self, node: str, gpu: str, sensor_index: int, src: int, labels: Labels | None) -> int:
        reg = self._reg
        nid = reg.nodes.get(node)
        if nid is None:
            nid = self._node_id(node)
        sid = reg.series.get((nid, gpu, sensor_index))
        if sid is None:
            prev = self._gone.counter(node, gpu, sensor_index)
            sid = reg.add_series(nid, node, gpu, sensor_index, src,
                                 self._recovered.counters.get((node, gpu, sensor_index)) if prev is None else prev)
        if labels is not None:
            reg.labels[reg.s_pair[sid]] = labels
        return sid

    def _take_pending(self) -> list[LateSamples]:
        if not self._pending:
            return []
        q = self._pending.take()
        lens, ts, v, unc, sid, src, pos = q.msg_len, q.ts, q.v, q.unc, q.sid, q.src, q.pos
        msg_sids, msg_srcs, msg_src, msg_pos = q.msg_sid, q.msg_src, q.msg_src_list, q.msg_pos_list
        reg, fronts = self._reg, self._fronts
        fronts.grow_series(len(reg.s_node))
        fronts.received(msg_sids, msg_srcs, lens, ts)
        tick = ts // self._grid
        closed = np.array(reg.node_closed, np.int64)[reg.arr("s_node")[sid]]
        late = tick < closed
        out: list[LateSamples] = []
        if late.any():
            starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
            idx = np.flatnonzero(late)
            msg = np.searchsorted(starts, idx, side="right") - 1
            of = sid[idx]  # out of order by more than the lateness less the series' reach: disorder
            disorder = fronts.series_max[of] - ts[idx] > self.params.allowed_lateness_ns - fronts.series_reach[of]
            capped = tick[idx] < self._capped_below
            # idx ascends, so each message's late samples are one run of msg: cut the runs in one pass (a
            # test per message would be quadratic, seconds a poll when a backlog of old data arrives).
            firsts = np.flatnonzero(np.diff(msg, prepend=-1))
            ends = [*firsts[1:].tolist(), len(idx)]
            rel = (idx - starts[msg]).tolist()
            n_of = lens.tolist()
            for m, a, b, dis, cap in zip(msg[firsts].tolist(), firsts.tolist(), ends, disorder[firsts].tolist(),
                                         capped[firsts].tolist(), strict=True):
                out.append(LateSamples(reg.source_keys[msg_src[m]], msg_pos[m], rel[a:b], n_of[m],
                                       "disorder" if dis else "cap" if cap else "idle"))
            keep = ~late
            ts, v, sid, src, pos, tick = ts[keep], v[keep], sid[keep], src[keep], pos[keep], tick[keep]
            unc = unc[keep]
        fronts.placed(sid, src, ts, self.params.allowed_lateness_ns // 2)
        self._open.add(Rows(sid, tick, ts, v, src, pos, unc, reg.arr("s_node")[sid]))
        return out

    # -- output --------------------------------------------------------------------------
    def watermark(self, node: str) -> int | None:
        """Event time up to which the node's cells are final (None before any input), as of the
        last ``advance`` (or, before any, with every stream holding)."""
        self._take_pending_keep_late()
        nid = self._reg.nodes.get(node)
        if nid is None:
            return None
        held, fronts = self._held, self._fronts
        if held is None or len(held[0]) != len(fronts.series_max) or len(held[1]) != len(fronts.src_front):
            held = np.ones(len(fronts.series_max), bool), np.ones(len(fronts.src_front), bool)
        return fronts.watermarks(self._reg, *held, self.params.allowed_lateness_ns).get(nid)

    def _take_pending_keep_late(self) -> None:
        self._late_store.extend(self._take_pending())

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
        reg, fronts = self._reg, self._fronts
        series_held, source_held, series_quiet = fronts.holding(reg, quiet_ns, now_ns, self.params)
        self._held = series_held, source_held
        nodes = len(reg.node_names)
        s_node = reg.arr("s_node")
        # A node is idle when all its series have been quiet for the bound and no source
        # still holds from behind (its part of a burst may yet bring this node's samples).
        least_quiet = np.full(nodes, np.iinfo(np.int64).max, np.int64)
        seen = fronts.series_max > NO_TS
        np.minimum.at(least_quiet, s_node[seen], series_quiet[seen])
        frames = self._empty_batch()
        if len(self._open):
            newest_tick = self._open.newest_ticks(nodes, NO_TS)
            wms = fronts.watermarks(reg, series_held, source_held, self.params.allowed_lateness_ns)
            may_idle = source_hold_ns is None and not (source_held & fronts.source_quiet.is_behind()).any()
            close = close_before(self.params, np.array(reg.node_closed, np.int64), newest_tick, wms, least_quiet,
                                 may_idle, source_hold_ns)
            if len(self._open) > self.params.max_open_samples:
                rows = self._open.rows()
                close, below = cap_open(self.params.max_open_samples, close, rows.tick, rows.node)
                self._capped_below = max(self._capped_below, below)
            frames = self._close(close)
        self._forget(least_quiet)
        return Advance(frames, late)

    def _forget(self, least_quiet: I64) -> None:
        """Forget the nodes that went away, when enough of them did (``streams.align.forget``)."""
        if not (least_quiet >= self.params.forget_ns).any():
            return  # every advance asks: answer the usual case without a pass over the open samples
        reg, fronts = self._reg, self._fronts
        gone = forgettable(least_quiet, self._open.newest_ticks(len(least_quiet), NO_TS), NO_TS,
                           self.params.forget_ns)
        if not worth_it(gone):
            return
        s_node = reg.arr("s_node")
        newest = np.full(len(gone), NO_TS, np.int64)
        np.maximum.at(newest, s_node, fronts.series_max[: len(s_node)])
        by_node: dict[int, dict[tuple[str, int], float]] = {}
        for sid, prev in reg.counter_prev.items():
            if gone[s_node[sid]]:
                by_node.setdefault(int(s_node[sid]), {})[(reg.pair_names[reg.s_pair[sid]][1], reg.s_sensor[sid])] = prev
        for nid in np.flatnonzero(gone).tolist():
            self._gone.remember(reg.node_names[nid], Gone(reg.node_closed[nid], int(newest[nid]), by_node.get(nid, {})))
        renum = reg.drop_nodes(gone)
        fronts.keep_series(renum.series_kept)
        self._open.renumber(renum.sid_map, renum.node_map)
        if self._held is not None:
            self._held = kept(self._held[0], renum.series_kept), self._held[1]
        self.forgotten += int(gone.sum())
        self._gone.prune(int(fronts.src_newest.max(initial=NO_TS)), self.params.remember_ns)

    def flush_all(self) -> Advance:
        """Close every open cell (shutdown of a run whose input has ended)."""
        late = self._late_store + self._take_pending()
        self._late_store = []
        if not len(self._open):
            return Advance(self._empty_batch(), late)
        close = np.array(self._reg.node_closed, np.int64)
        newest_tick = self._open.newest_ticks(len(close), NO_TS)
        close = np.maximum(close, newest_tick + 1)
        return Advance(self._close(close), late)

    def _close(self, close: I64) -> FrameBatch:
        reg = self._reg
        reg.node_closed = [max(a, b) for a, b in zip(reg.node_closed, close.tolist(), strict=True)]
        done = self._open.take_done(close)
        if not len(done):
            return self._empty_batch()
        return self._aggregate(done.sid, done.tick, done.ts, done.v, done.unc)

    def _empty_batch(self) -> FrameBatch:
        return FrameBatch(_empty_i64(), [], [], [], {c: _empty_f64() for c in VALUE_COLUMNS},
                          {c: _empty_i64() for c in COUNT_COLUMNS}, _empty_i64())

    def _aggregate(self, sid: I64, tick: I64, ts: I64, v: F64, unc: I64) -> FrameBatch:
        reg = self._reg
        return aggregate(sid, tick, ts, v, unc, s_sensor=reg.arr("s_sensor"), s_pair=reg.arr("s_pair"),
                         pair_names=reg.pair_names, labels=reg.labels, counter_prev=reg.counter_prev,
                         grid=self._grid)

    # -- bookkeeping ---------------------------------------------------------------------
    def oldest_positions(self) -> dict[Hashable, int]:
        """Per source, the oldest position an open cell (or unplaced input) still depends on."""
        out: dict[Hashable, int] = {}
        if len(self._open):
            low = self._open.oldest_positions(len(self._reg.source_keys))
            for i, pos in enumerate(low.tolist()):
                if pos != np.iinfo(np.int64).max:
                    out[self._reg.source_keys[i]] = pos
        for src, pos in self._pending.positions():
            key = self._reg.source_keys[src]
            if pos < out.get(key, pos + 1):
                out[key] = pos
        return out

    def closed_ticks(self) -> dict[str, int]:
        """Per node, the start of the newest tick that is final (written, or closed with no
        samples), for the nodes that have closed one."""
        reg = self._reg
        return {n: (c - 1) * self._grid for n, c in zip(reg.node_names, reg.node_closed, strict=True) if c != NO_TS}

    def open_cells(self) -> int:
        """Distinct (GPU, tick) cells holding open samples: frames to come."""
        return self._open.cells(self._reg.arr("s_pair"))

    def nodes_held(self) -> int:
        return len(self._reg.node_names)

    def series_held(self) -> int:
        return len(self._reg.s_node)

    def nodes_remembered(self) -> int:
        """Forgotten nodes whose last closed tick and counters are still kept (for ``remember_ns``)."""
        return len(self._gone)

    def open_samples(self) -> int:
        return len(self._open)

    def source_newest(self) -> dict[Hashable, int]:
        """Per source that delivered, the newest event time placed from it (``streams.align.pacing``)."""
        newest = self._fronts.src_newest.tolist()
        return {k: t for k, t in zip(self._reg.source_keys, newest, strict=False) if t != NO_TS}

    def snapshot(self) -> AlignerState:
        self._take_pending_keep_late()
        registry = {k: copy.deepcopy(getattr(self, k)) for k in _REGISTRY}
        rows = {k: a.copy() for k, a in self._open.rows().columns().items()}
        return AlignerState(self.params, self._recovered, registry, rows)

    @classmethod
    def restore(cls, state: AlignerState) -> GridAligner:
        aligner = cls(state.params, state.recovered)
        for k, val in state.registry.items():
            setattr(aligner, k, copy.deepcopy(val))
        aligner._open = OpenSamples.of(Rows(**{k: a.copy() for k, a in state.open_rows.items()}))
        return aligner


_REGISTRY: Final = ("_late_store", "_reg", "_fronts", "_gone", "forgotten")


def _column(xs: Times | Values, typecode: str) -> Any:
    """A message's times (``"q"``) or values (``"d"``) as a numpy column.

    An int64 or float64 array, such as the decoder's views into a poll's columns, is kept as it is (the
    caller does not change it afterwards); anything else is copied through ``array``, whose type checks
    refuse what does not fit (a float time, a string value) with TypeError or OverflowError.

    >>> _column([1, 2], "q").dtype, _column(np.array([1.5]), "d").base is None
    (dtype('int64'), True)
    >>> _column([1.5], "q")
    Traceback (most recent call last):
    ...
    TypeError: 'float' object cannot be interpreted as an integer
    """
    dtype = np.int64 if typecode == "q" else np.float64
    if isinstance(xs, np.ndarray) and xs.dtype == dtype and xs.ndim == 1:
        return xs
    packed = xs if type(xs) is array and xs.typecode == typecode else array(typecode, xs)
    return np.frombuffer(packed, dtype).copy() if packed is xs else np.frombuffer(packed, dtype)
