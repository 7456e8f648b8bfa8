"""Nodes that went away: what the aligner forgets of them, and the little it keeps.

Clusters change their nodes (autoscaling, replacements, renames): an aligner that kept every node it
ever saw would grow its arrays, and the work of every advance, with each one. A node whose series have
all been quiet for ``forget_ns`` (on their sources' quiet clocks, so a backlog being read or a broker
outage never counts) and that holds no open cell is forgotten: its series, pairs and per-series state
go, and the rest are renumbered. What stays is a ``Gone`` record, so that a node that comes back
neither repeats a tick already written (its samples for those are late, as before) nor breaks a
counter's increase; records older than ``remember_ns`` of event time are dropped too.

A node that comes back is registered as a new node is: its streams hold its watermark from their first
delivery on, where a remembered stream would have held from the node's first (``streams.align.holds``).
After an hour's silence that is the same thing in practice; a node that pauses for less is not
forgotten.

>>> gone = GoneNodes()
>>> gone.remember("n1", Gone(closed=12, newest_ns=5_000, counters={("0", 9): 41.0}))
>>> gone.closed("n1", 3), gone.counter("n1", "0", 9), gone.counter("n1", "0", 9)
(12, 41.0, None)
>>> gone.prune(newest_ns=10_000, remember_ns=1_000); len(gone)
0
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streams.align.aggregate import I64
from streams.align.registry import BoolArr


@dataclass(slots=True)
class Gone:
    """A forgotten node: ticks below ``closed`` are final; its counters' last raw values by (gpu, sensor index)."""

    closed: int
    newest_ns: int  # its newest event time
    counters: dict[tuple[str, int], float] = field(default_factory=dict)


class GoneNodes:
    """The ``Gone`` records of an aligner, by node name."""

    def __init__(self) -> None:
        self._by_node: dict[str, Gone] = {}

    def __len__(self) -> int:
        return len(self._by_node)

    def remember(self, node: str, gone: Gone) -> None:
        before = self._by_node.get(node)
        if before is not None:  # a node that came back: what it did not bring back still counts
            gone.counters = {**before.counters, **gone.counters}
            gone.closed, gone.newest_ns = max(gone.closed, before.closed), max(gone.newest_ns, before.newest_ns)
        self._by_node[node] = gone

    def closed(self, node: str, closed: int) -> int:
        """``closed`` (what a restart recovered) raised to what the node's last stay made final."""
        gone = self._by_node.get(node)
        return closed if gone is None else max(closed, gone.closed)

    def counter(self, node: str, gpu: str, sensor_index: int) -> float | None:
        """The last raw value of a counter series of a node that came back (once: the series takes it over)."""
        gone = self._by_node.get(node)
        if gone is None:
            return None
        return gone.counters.pop((gpu, sensor_index), None)

    def prune(self, newest_ns: int, remember_ns: int) -> None:
        """Drop the records of nodes whose newest event time is ``remember_ns`` behind ``newest_ns``."""
        old = [n for n, g in self._by_node.items() if newest_ns - g.newest_ns > remember_ns]
        for node in old:
            del self._by_node[node]


def forgettable(least_quiet: I64, newest_open_tick: I64, no_tick: int, forget_ns: int) -> BoolArr:
    """Per node id: quiet for ``forget_ns`` on every series, and no open cell.

    >>> import numpy as np
    >>> forgettable(np.array([5, 9, 9]), np.array([-1, -1, 4]), no_tick=-1, forget_ns=9).tolist()
    [False, True, False]
    """
    out: BoolArr = (least_quiet >= forget_ns) & (newest_open_tick == no_tick)
    return out


def worth_it(gone: BoolArr) -> bool:
    """Renumbering costs one pass over every series: do it when an eighth of the nodes or 64 can go.

    >>> import numpy as np
    >>> worth_it(np.array([True] + [False] * 7)), worth_it(np.array([True] + [False] * 8))
    (True, False)
    """
    n = int(gone.sum())
    return n > 0 and (n * 8 >= len(gone) or n >= 64)
