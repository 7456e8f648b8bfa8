"""Event-time alignment of sensor samples onto a fixed grid of frames.

One frame is one GPU (or a node's ``host`` pseudo-GPU) x one grid tick, holding
every sensor's aggregate by the catalog's rule plus the per-sensor sample count.

A node's watermark is the *minimum* over its live series (gpu x sensor) of the
newest event time seen, minus the allowed lateness. Using the minimum rather than
the maximum matters: the 23 sensors travel on 23 topics that a consumer drains at
different speeds, and a batch message can move one series ten seconds ahead at
once; the minimum closes a cell only when every series has moved past it. A
series that falls ``idle_series_ns`` behind its node's newest one stops holding
the watermark back (a GPU that died must not stall its node forever), and a node
that receives nothing for ``idle_flush_ns`` of processing time closes all its
cells, so the tail of a run is written too.

Every sample carries its source position (an opaque source id and an offset).
``oldest_positions()`` tells, per source, the oldest position still held by an
open cell: the ingest commits no further than that, so a crash replays exactly
the samples of the cells it lost.
"""

from __future__ import annotations

import copy
from bisect import bisect_left
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from operator import le
from typing import Any, Final

from schemas.catalog import CATALOG, value_columns
from schemas.records import Labels

_NO_TS: Final = -(2**62)
_GAUGE: Final = 0
_COUNTER: Final = 1
_EVENT: Final = 2
_KIND_CODE: Final = {"gauge": _GAUGE, "counter": _COUNTER, "event": _EVENT}
_KINDS: Final = tuple(_KIND_CODE[s.kind] for s in CATALOG)
N_SENSORS: Final = len(CATALOG)
VALUE_COLUMNS: Final = tuple(col for _, _, col in value_columns())


@dataclass(frozen=True, slots=True)
class AlignParams:
    """Grid and lateness settings (all in nanoseconds).

    >>> AlignParams().grid_ns
    1000000000
    """

    grid_ns: int = 1_000_000_000
    allowed_lateness_ns: int = 2_000_000_000
    idle_series_ns: int = 30_000_000_000
    idle_flush_ns: int = 5_000_000_000
    max_open_ticks: int = 3_600

    def __post_init__(self) -> None:
        if not 100_000_000 <= self.grid_ns <= 60_000_000_000:
            raise ValueError("grid_ns must be between 100 ms and 60 s")
        if self.allowed_lateness_ns < 0 or self.idle_series_ns <= 0 or self.idle_flush_ns <= 0:
            raise ValueError("lateness must be >= 0 and idle timeouts > 0")
        if self.max_open_ticks < 1:
            raise ValueError("max_open_ticks must be >= 1")


@dataclass(slots=True)
class Frame:
    """One aligned row of ``gpu_frames``; ``values`` follows ``VALUE_COLUMNS``."""

    node: str
    gpu: str
    tick_ns: int
    values: list[float | None]
    counts: list[int]
    labels: Labels


@dataclass(frozen=True, slots=True)
class Recovered:
    """What durable storage says about a node, so a restarted aligner neither repeats nor forgets.

    ``boundaries``: per node, the newest tick already written (ticks up to it are final).
    ``counters``: the last raw value of each (node, gpu, sensor index) counter series.
    """

    boundaries: Mapping[str, int] = field(default_factory=dict)
    counters: Mapping[tuple[str, str, int], float] = field(default_factory=dict)


# A gauge accumulator is [n, sum, max, last_ts, last_value]; counters and events keep
# their (ts, value) pairs because their aggregate depends on event-time order.
_Acc = list[Any]

@dataclass(slots=True)
class _NodeState:
    closed_until: int  # ticks below this index are final
    series_max: dict[str, list[int]] = field(default_factory=dict)  # gpu -> newest ts per sensor
    ticks: dict[int, dict[str, list[_Acc | None]]] = field(default_factory=dict)
    pins: dict[int, dict[Hashable, int]] = field(default_factory=dict)  # tick -> source -> oldest offset
    labels: dict[str, Labels] = field(default_factory=dict)
    counter_prev: dict[tuple[str, int], float] = field(default_factory=dict)
    touched: bool = True
    last_input_ns: int | None = None


@dataclass(slots=True)
class AlignerState:
    """Picklable snapshot of a ``GridAligner``."""

    params: AlignParams
    nodes: dict[str, _NodeState]
    recovered: Recovered


class GridAligner:
    """Aligns samples of many nodes onto the grid and emits frames as cells become final.

    >>> a = GridAligner(AlignParams(allowed_lateness_ns=0))
    >>> a.add("n1", "0", 4, [100, 600_000_000], [300.0, 310.0])
    []
    >>> a.add("n1", "0", 4, [1_200_000_000], [320.0])
    []
    >>> [(f.tick_ns, f.values[VALUE_COLUMNS.index("power")]) for f in a.advance(now_ns=0)]
    [(0, 305.0)]
    """

    def __init__(self, params: AlignParams, recovered: Recovered | None = None) -> None:
        self.params = params
        self._grid = params.grid_ns
        self._nodes: dict[str, _NodeState] = {}
        self._recovered = recovered or Recovered()

    # -- input ---------------------------------------------------------------------------
    def _node(self, node: str) -> _NodeState:
        state = self._nodes.get(node)
        if state is None:
            boundary = self._recovered.boundaries.get(node)
            closed = _NO_TS if boundary is None else boundary // self._grid + 1
            state = _NodeState(closed_until=closed)
            for (n, gpu, si), val in self._recovered.counters.items():
                if n == node:
                    state.counter_prev[(gpu, si)] = val
            self._nodes[node] = state
        return state

    def add(self, node: str, gpu: str, sensor_index: int, ts_ns: list[int], values: list[float],
            labels: Labels | None = None, source: Hashable = None, position: int = 0) -> list[int]:
        """Add one series' samples; returns the indices of samples whose cell is already final."""
        st = self._node(node)
        st.touched = True
        if labels is not None:
            st.labels[gpu] = labels
        n = len(ts_ns)
        order: list[int] | None = None
        if n > 1 and not all(map(le, ts_ns, islice(ts_ns, 1, None))):
            # Out-of-order within a message is legal but rare: sort once, report original indices.
            order = sorted(range(n), key=ts_ns.__getitem__)
            ts_ns = [ts_ns[k] for k in order]
            values = [values[k] for k in order]
        grid = self._grid
        closed = st.closed_until
        ticks = st.ticks
        pins = st.pins
        gauge = _KINDS[sensor_index] == _GAUGE
        late: list[int] = []
        # Samples come sorted, so each grid cell is one contiguous run: aggregate runs
        # with C-level sum/max instead of touching samples one by one in Python.
        i = 0
        while i < n:
            tick = ts_ns[i] // grid
            j = bisect_left(ts_ns, (tick + 1) * grid, i + 1, n) if n - i > 1 else n
            if tick < closed:
                late.extend(range(i, j))
                i = j
                continue
            gpus = ticks.get(tick)
            if gpus is None:
                gpus = ticks[tick] = {}
                pins[tick] = {source: position}
            else:
                p = pins[tick]
                if position < p.get(source, position + 1):
                    p[source] = position
            cell = gpus.get(gpu)
            if cell is None:
                cell = gpus[gpu] = [None] * N_SENSORS
            acc = cell[sensor_index]
            if gauge:
                if acc is None:
                    acc = cell[sensor_index] = [0, 0.0, float("-inf"), _NO_TS, 0.0]
                if j - i == 1:
                    v = values[i]
                    acc[0] += 1
                    acc[1] += v
                    if v > acc[2]:
                        acc[2] = v
                else:
                    run = values[i:j]
                    acc[0] += j - i
                    acc[1] += sum(run)
                    m = max(run)
                    if m > acc[2]:
                        acc[2] = m
                t = ts_ns[j - 1]
                v = values[j - 1]
                if j - i > 1 and ts_ns[j - 2] == t:  # ties on the last instant: the largest value wins
                    v = max(values[bisect_left(ts_ns, t, i, j):j])
                if t > acc[3] or (t == acc[3] and v > acc[4]):
                    acc[3] = t
                    acc[4] = v
            else:
                if acc is None:
                    acc = cell[sensor_index] = [0, []]
                acc[0] += j - i
                acc[1].extend(zip(ts_ns[i:j], values[i:j], strict=True))
            i = j
        newest = ts_ns[-1] if len(late) < n else _NO_TS
        if order is not None:
            late = sorted(order[k] for k in late)
        series = st.series_max.get(gpu)
        if series is None:
            series = st.series_max[gpu] = [_NO_TS] * N_SENSORS
        if newest > series[sensor_index]:
            series[sensor_index] = newest
        return late

    # -- output --------------------------------------------------------------------------
    def watermark(self, node: str) -> int | None:
        """Event time up to which the node's cells are final (None before any input)."""
        st = self._nodes.get(node)
        if st is None:
            return None
        return self._watermark(st)

    def _watermark(self, st: _NodeState) -> int | None:
        newest = _NO_TS
        for series in st.series_max.values():
            m = max(series)
            if m > newest:
                newest = m
        if newest == _NO_TS:
            return None
        live_from = newest - self.params.idle_series_ns
        low = newest
        for series in st.series_max.values():
            for m in series:
                if live_from <= m < low:
                    low = m
        return low - self.params.allowed_lateness_ns

    def advance(self, now_ns: int, source_hold_ns: int | None = None) -> list[Frame]:
        """Close every cell the watermarks have passed; ``now_ns`` is processing time.

        ``source_hold_ns`` is the event time the slowest unfinished input source has
        reached (the per-partition watermark of a Kafka consumer): a series that first
        appears there later must still find its cells open, so nothing closes past it
        (minus the lateness), and a node does not count as idle while it is set.
        """
        out: list[Frame] = []
        for node, st in self._nodes.items():
            if st.touched:
                st.touched = False
                st.last_input_ns = now_ns
            if not st.ticks:
                continue
            wm = self._watermark(st)
            if wm is not None and source_hold_ns is not None:
                wm = min(wm, source_hold_ns - self.params.allowed_lateness_ns)
            close = st.closed_until if wm is None else max(st.closed_until, wm // self._grid)
            newest_tick = max(st.ticks)
            idle = (source_hold_ns is None and st.last_input_ns is not None
                    and now_ns - st.last_input_ns >= self.params.idle_flush_ns)
            if idle:
                close = newest_tick + 1
            # Bounded memory: a node cannot hold more open ticks than the cap, whatever its input.
            close = max(close, newest_tick + 1 - self.params.max_open_ticks)
            if close > st.closed_until:
                self._close(node, st, close, out)
        return out

    def flush_all(self) -> list[Frame]:
        """Close every open cell (shutdown of a run whose input has ended)."""
        out: list[Frame] = []
        for node, st in self._nodes.items():
            if st.ticks:
                self._close(node, st, max(st.ticks) + 1, out)
        return out

    def _close(self, node: str, st: _NodeState, close: int, out: list[Frame]) -> None:
        st.closed_until = close
        grid = self._grid
        for tick in sorted(t for t in st.ticks if t < close):
            gpus = st.ticks.pop(tick)
            st.pins.pop(tick, None)
            for gpu in sorted(gpus):
                out.append(self._frame(node, gpu, tick * grid, gpus[gpu], st))

    def _frame(self, node: str, gpu: str, tick_ns: int, cell: list[_Acc | None], st: _NodeState) -> Frame:
        values: list[float | None] = []
        counts: list[int] = []
        for si, spec in enumerate(CATALOG):
            acc = cell[si]
            if acc is None:
                counts.append(0)
                values.extend([None] * len(spec.aggs))
                continue
            counts.append(acc[0])
            kind = _KINDS[si]
            if kind == _GAUGE:
                for agg in spec.aggs:
                    values.append(acc[1] / acc[0] if agg == "mean" else acc[2] if agg == "max" else acc[4])
                continue
            pairs = sorted(acc[1])
            if kind == _COUNTER:
                prev = st.counter_prev.get((gpu, si))
                inc = 0.0
                for _, v in pairs:
                    if prev is not None:
                        inc += v - prev if v >= prev else v  # a drop means the counter restarted at 0
                    prev = v
                st.counter_prev[(gpu, si)] = pairs[-1][1]
                values.extend((inc, pairs[-1][1]))
            else:
                fired = [v for _, v in pairs if v != 0]
                values.extend((fired[-1] if fired else 0.0, float(len(fired))))
        return Frame(node, gpu, tick_ns, values, counts, st.labels.get(gpu, {}))

    # -- bookkeeping ---------------------------------------------------------------------
    def oldest_positions(self) -> dict[Hashable, int]:
        """Per source, the oldest position an open cell still depends on."""
        out: dict[Hashable, int] = {}
        for st in self._nodes.values():
            for per_source in st.pins.values():
                for src, pos in per_source.items():
                    if pos < out.get(src, pos + 1):
                        out[src] = pos
        return out

    def open_cells(self) -> int:
        return sum(len(g) for st in self._nodes.values() for g in st.ticks.values())

    def nodes(self) -> Iterable[str]:
        return self._nodes.keys()

    def snapshot(self) -> AlignerState:
        return AlignerState(self.params, copy.deepcopy(self._nodes), self._recovered)

    @classmethod
    def restore(cls, state: AlignerState) -> GridAligner:
        aligner = cls(state.params, state.recovered)
        aligner._nodes = copy.deepcopy(state.nodes)
        return aligner
