"""The aligner's registry: node, (node, gpu), series and source names to dense ids, so per-sample data is
integers in arrays.

A series is one node x gpu x sensor; it keeps the source it first arrived on. Ids are
handed out in order of first appearance; they change only when ``drop_nodes`` forgets nodes
that went away, which renumbers what is left (the aligner renumbers its arrays with it).

>>> r = StreamRegistry()
>>> n = r.add_node("n1", closed=0)
>>> src = r.add_source(("gpu.power", 0))
>>> r.add_series(n, "n1", "0", 4, src, counter_prev=None), r.add_series(n, "n1", "1", 4, src, counter_prev=None)
(0, 1)
>>> r.arr("s_pair").tolist(), r.pair_names
([0, 1], [('n1', '0'), ('n1', '1')])
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.records import Labels
from streams.align.aggregate import I64

BoolArr = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Renumber:
    """How ``drop_nodes`` renumbered: which series stayed (by old id), and each old series and node id's new one
    (meaningless for those dropped)."""

    series_kept: BoolArr
    sid_map: I64
    node_map: I64


class StreamRegistry:
    """Dense ids of what the aligner has seen, with what belongs to each id."""

    def __init__(self) -> None:
        self.nodes: dict[str, int] = {}
        self.node_names: list[str] = []
        self.node_closed: list[int] = []  # ticks below this are final, per node
        self.pairs: dict[tuple[str, str], int] = {}
        self.pair_names: list[tuple[str, str]] = []
        self.series: dict[tuple[int, str, int], int] = {}  # (node id, gpu, sensor) -> series id
        self.s_node: list[int] = []
        self.s_pair: list[int] = []
        self.s_sensor: list[int] = []
        self.s_src: list[int] = []  # the source a series arrives on (its first)
        self.labels: dict[int, Labels] = {}  # per pair, its latest labels
        self.counter_prev: dict[int, float] = {}  # per counter series, the last raw value before its open cells
        self.sources: dict[Hashable, int] = {}
        self.source_keys: list[Hashable] = []
        self._arrays: dict[str, I64] = {}  # cache of arr()

    def add_node(self, node: str, closed: int) -> int:
        """Register a new node whose ticks below ``closed`` are final."""
        nid = self.nodes[node] = len(self.node_names)
        self.node_names.append(node)
        self.node_closed.append(closed)
        return nid

    def add_source(self, source: Hashable) -> int:
        src = self.sources[source] = len(self.source_keys)
        self.source_keys.append(source)
        return src

    def add_series(self, nid: int, node: str, gpu: str, sensor_index: int, src: int,
                   counter_prev: float | None) -> int:
        """Register a new series; ``counter_prev``: a counter's last raw value written before a restart."""
        sid = self.series[(nid, gpu, sensor_index)] = len(self.s_node)
        pid = self.pairs.get((node, gpu))
        if pid is None:
            pid = self.pairs[(node, gpu)] = len(self.pair_names)
            self.pair_names.append((node, gpu))
        self.s_node.append(nid)
        self.s_pair.append(pid)
        self.s_sensor.append(sensor_index)
        self.s_src.append(src)
        if counter_prev is not None:
            self.counter_prev[sid] = counter_prev
        return sid

    def drop_nodes(self, gone: BoolArr) -> Renumber:
        """Forget the nodes marked in ``gone`` (by node id) with their pairs and series, and renumber the rest
        in their order.

        >>> r = StreamRegistry()
        >>> a, b = r.add_node("a", closed=0), r.add_node("b", closed=7)
        >>> _ = [r.add_series(n, name, "0", 4, 0, None) for n, name in ((a, "a"), (b, "b"))]
        >>> r.drop_nodes(np.array([True, False])).series_kept.tolist(), r.nodes, r.series, r.node_closed
        ([False, True], {'b': 0}, {(0, '0', 4): 0}, [7])
        """
        keep_node = ~gone
        s_node, s_pair, s_sensor, s_src = (self.arr(k) for k in ("s_node", "s_pair", "s_sensor", "s_src"))
        keep = keep_node[s_node]
        node_map = np.cumsum(keep_node) - 1
        pair_keep = np.zeros(len(self.pair_names), bool)
        pair_keep[s_pair[keep]] = True
        for (node, _), pid in self.pairs.items():  # a pair with no series yet goes with its node
            if not pair_keep[pid] and keep_node[self.nodes[node]]:
                pair_keep[pid] = True
        pair_map = np.cumsum(pair_keep) - 1
        sid_map = np.cumsum(keep) - 1
        self.node_names = [n for n, k in zip(self.node_names, keep_node.tolist(), strict=True) if k]
        self.node_closed = [c for c, k in zip(self.node_closed, keep_node.tolist(), strict=True) if k]
        self.nodes = {n: i for i, n in enumerate(self.node_names)}
        self.pair_names = [p for p, k in zip(self.pair_names, pair_keep.tolist(), strict=True) if k]
        self.pairs = {p: i for i, p in enumerate(self.pair_names)}
        self.labels = {int(pair_map[p]): lab for p, lab in self.labels.items() if pair_keep[p]}
        self.series = {(int(node_map[n]), gpu, si): int(sid_map[sid])
                       for (n, gpu, si), sid in self.series.items() if keep[sid]}
        self.s_node = node_map[s_node[keep]].tolist()
        self.s_pair = pair_map[s_pair[keep]].tolist()
        self.s_sensor = s_sensor[keep].tolist()
        self.s_src = s_src[keep].tolist()
        self.counter_prev = {int(sid_map[sid]): v for sid, v in self.counter_prev.items() if keep[sid]}
        self._arrays = {}
        return Renumber(keep, sid_map, node_map)

    def arr(self, name: str) -> I64:
        """A per-series list (``s_node``, ``s_pair``, ``s_sensor``, ``s_src``) as an array, rebuilt only when
        series were added."""
        cached = self._arrays.get(name)
        if cached is None or len(cached) != len(self.s_node):
            cached = self._arrays[name] = np.array(getattr(self, name), np.int64)
        return cached

    def __getstate__(self) -> dict[str, Any]:
        # The array cache is rebuilt on demand: a snapshot need not carry it.
        return {k: v for k, v in self.__dict__.items() if k != "_arrays"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._arrays = {}
