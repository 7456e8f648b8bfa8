"""The aligner's registry: node, (node, gpu), series and source names to dense ids, so per-sample data is
integers in arrays.

A series is one node x gpu x sensor; it keeps the source it first arrived on. Ids are
handed out in order of first appearance and never reused, so every per-id list only grows.

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
from typing import Any

import numpy as np

from schemas.records import Labels
from streams.align.aggregate import I64


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
