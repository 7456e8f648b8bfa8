"""What happened around an alert besides its series: Kubernetes events, other detections, label changes.

Each book is bounded: the latest ``per_node`` entries of each node, for the ``max_nodes`` nodes seen
last. Times are event times (ns); nothing here reads a clock.

>>> book = EventBook(per_node=2)
>>> for i, reason in enumerate(["Scheduled", "BackOff", "OOMKilled"]):
...     book.add(Happening("node-1", i, reason, "Warning", pod="p-0"))
>>> [e.reason for e in book.around("node-1", 0, 10)]
['BackOff', 'OOMKilled']
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Happening:
    """One thing that happened on a node: a Kubernetes event, another rule's alert, or a label change."""

    node: str
    ts_ns: int
    reason: str  # the event's reason, the other alert's rule, or workload_changed / pod_changed
    type: str = ""  # Normal / Warning for events; "detection" or "labels" otherwise
    pod: str = ""
    gpus: tuple[str, ...] = ()  # () when the event names no GPU (a node or pod event)
    detail: str = ""


class EventBook:
    """The latest happenings of each node."""

    def __init__(self, per_node: int = 64, max_nodes: int = 100_000) -> None:
        self.per_node, self.max_nodes = per_node, max_nodes
        self._nodes: OrderedDict[str, tuple[deque[Happening], set[Happening]]] = OrderedDict()

    def add(self, h: Happening) -> None:
        got = self._nodes.get(h.node)
        if got is None:
            got = self._nodes[h.node] = (deque(maxlen=self.per_node), set())
            if len(self._nodes) > self.max_nodes:
                self._nodes.popitem(last=False)
        else:
            self._nodes.move_to_end(h.node)
        q, held = got
        if h in held:  # a redelivered event is one event
            return
        if len(q) == q.maxlen:
            held.discard(q[0])
        q.append(h)
        held.add(h)

    def around(self, node: str, lo_ns: int, hi_ns: int) -> Iterator[Happening]:
        """The node's happenings with lo_ns <= ts_ns <= hi_ns, oldest first."""
        got = self._nodes.get(node)
        for h in got[0] if got is not None else ():
            if lo_ns <= h.ts_ns <= hi_ns:
                yield h
