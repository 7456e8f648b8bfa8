"""The samples of open cells, kept in the chunks they arrived in.

An advance places a poll's samples and closes the cells the watermarks passed. Kept as
one set of flat arrays, both cost a pass over *every* open sample (the append copies
them, the close masks them), and the allowed lateness keeps seconds of samples open:
at 10 Hz those passes were most of an advance. Chunks make both O(what changed): a
poll's samples are one chunk; a close compares a chunk's tick range with the close of
the nodes in it first, takes it whole or leaves it whole where it can, and masks only
the chunks that straddle a node's close; now and then the chunks merge, so there are
never many.

>>> def rows(node, tick):
...     n = len(tick)
...     z = np.zeros(n, np.int64)
...     return Rows(z, np.array(tick, np.int64), z, np.ones(n), z, z, z, np.array(node, np.int64))
>>> store = OpenSamples()
>>> store.add(rows([0, 1], [5, 7]))
>>> store.add(rows([0], [9]))
>>> store.take_done(np.array([6, 6], np.int64)).tick.tolist()  # both nodes close below tick 6
[5]
>>> len(store), store.rows().tick.tolist()
(2, [7, 9])
>>> store.column("tick").tolist(), store.column("node").tolist()
([7, 9], [1, 0])
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from streams.align.aggregate import F64, I64

MERGE_AT: Final = 32  # chunks; merging them then costs one pass over the open samples per 32 polls


@dataclass(slots=True)
class Rows:
    """Samples as columns: series, tick, event time, value, source, position, clock uncertainty, node."""

    sid: I64
    tick: I64
    ts: I64
    v: F64
    src: I64
    pos: I64
    unc: I64
    node: I64

    def __len__(self) -> int:
        return len(self.sid)

    def select(self, mask: npt.NDArray[np.bool_]) -> Rows:
        # By name, not through dataclasses.fields: a close splits chunks many times an advance.
        idx = np.flatnonzero(mask)
        return Rows(self.sid[idx], self.tick[idx], self.ts[idx], self.v[idx], self.src[idx], self.pos[idx],
                    self.unc[idx], self.node[idx])

    @staticmethod
    def concat(parts: list[Rows]) -> Rows:
        if len(parts) == 1:
            return parts[0]
        return Rows(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(Rows)))

    @staticmethod
    def empty() -> Rows:
        i = np.empty(0, np.int64)
        return Rows(i, i, i, np.empty(0, np.float64), i, i, i, i)

    def columns(self) -> dict[str, npt.NDArray[Any]]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_NONE: Final = np.iinfo(np.int64).min


class _Chunk:
    """Rows and what a close asks of them first: their tick range, their nodes and each node's newest tick."""

    __slots__ = ("node_newest", "nodes", "rows", "src_oldest", "tick_max", "tick_min")

    def __init__(self, rows: Rows) -> None:
        self.rows = rows
        self.tick_min = int(rows.tick.min())
        self.tick_max = int(rows.tick.max())
        newest = np.full(int(rows.node.max()) + 1, _NONE, np.int64)
        np.maximum.at(newest, rows.node, rows.tick)
        self.nodes: I64 = np.flatnonzero(newest != _NONE)
        self.node_newest: I64 = newest[self.nodes]
        self.src_oldest: I64 | None = None  # per source id, asked once per flush

    def oldest_positions(self) -> I64:
        if self.src_oldest is None:
            low = np.full(int(self.rows.src.max()) + 1, np.iinfo(np.int64).max, np.int64)
            np.minimum.at(low, self.rows.src, self.rows.pos)
            self.src_oldest = low
        return self.src_oldest


class OpenSamples:
    """The open samples of an aligner; ``take_done`` removes and returns those a close makes final."""

    __slots__ = ("_chunks", "_n")

    def __init__(self) -> None:
        self._chunks: list[_Chunk] = []
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def add(self, rows: Rows) -> None:
        if not len(rows):
            return
        self._chunks.append(_Chunk(rows))
        self._n += len(rows)
        if len(self._chunks) > MERGE_AT:
            self._chunks = [_Chunk(self.rows())]

    def rows(self) -> Rows:
        """All open samples (a copy where there is more than one chunk)."""
        if not self._chunks:
            return Rows.empty()
        return Rows.concat([c.rows for c in self._chunks])

    def cells(self, s_pair: I64) -> int:
        """Distinct (GPU, tick) cells holding open samples, ``s_pair`` mapping a series to its GPU. A gauge the
        worker reads at every flush, so it copies two columns, not every open sample, and marks the cells in a
        table where that is smaller than a few times the samples, instead of sorting them (8% of the batched
        worker)."""
        if not self._n:
            return 0
        tick = self.column("tick")
        pairs = s_pair[self.column("sid")]
        base = int(tick.min())
        span = int(tick.max()) - base + 1
        keys = pairs * span + (tick - base)
        cells = (int(pairs.max()) + 1) * span
        if cells > 4 * len(keys) + 4096:
            return len(np.unique(keys))
        seen = np.zeros(cells, np.bool_)
        seen[keys] = True
        return int(np.count_nonzero(seen))

    def column(self, name: str) -> npt.NDArray[Any]:
        """One column of all open samples (a copy where there is more than one chunk)."""
        if not self._chunks:
            return getattr(Rows.empty(), name)  # type: ignore[no-any-return]
        if len(self._chunks) == 1:
            return getattr(self._chunks[0].rows, name)  # type: ignore[no-any-return]
        return np.concatenate([getattr(c.rows, name) for c in self._chunks])

    def take_done(self, close: I64) -> Rows:
        """Remove and return the samples whose tick is below their node's ``close``."""
        done: list[Rows] = []
        kept: list[_Chunk] = []
        for chunk in self._chunks:
            mine = close[chunk.nodes]
            if chunk.tick_min >= int(mine.max()):
                kept.append(chunk)  # nothing in it closes (the common case: the newest chunks)
            elif (chunk.node_newest < mine).all():
                done.append(chunk.rows)  # all of it closes (the oldest chunks)
            else:
                rows = chunk.rows
                final = rows.tick < close[rows.node]
                done.append(rows.select(final))
                rest = rows.select(~final)
                if len(rest):
                    kept.append(_Chunk(rest))
        self._chunks = kept
        out = Rows.concat(done) if done else Rows.empty()
        self._n -= len(out)
        return out

    def newest_ticks(self, nodes: int, fill: int) -> I64:
        """Per node id below ``nodes``, its newest open tick (``fill`` for a node with none)."""
        out = np.full(nodes, fill, np.int64)
        for chunk in self._chunks:
            out[chunk.nodes] = np.maximum(out[chunk.nodes], chunk.node_newest)
        return out

    def oldest_positions(self, sources: int) -> I64:
        """Per source id below ``sources``, the oldest position an open sample holds (int64 max for none)."""
        out = np.full(sources, np.iinfo(np.int64).max, np.int64)
        for chunk in self._chunks:
            low = chunk.oldest_positions()
            np.minimum(out[:len(low)], low, out=out[:len(low)])
        return out

    def renumber(self, sid_map: I64, node_map: I64) -> None:
        """Give every open sample its series' and node's new id (``StreamRegistry.drop_nodes``)."""
        self._chunks = [_Chunk(replace(c.rows, sid=sid_map[c.rows.sid], node=node_map[c.rows.node]))
                        for c in self._chunks]

    @classmethod
    def of(cls, rows: Rows) -> OpenSamples:
        store = cls()
        store.add(rows)
        return store
