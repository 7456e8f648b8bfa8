"""What the decision agent last wanted per workload, for the KEDA ``metrics-api`` endpoint.

The decide agent calls ``update`` after every evaluated tick of a workload; the web
endpoint reads ``get``. Both run on the worker's event loop, so a plain dict is enough.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Desired:
    namespace: str
    workload: str
    workload_class: str
    current: int  # replicas (pods) seen in the latest frames
    desired: int  # what the engine wants now: the last taken decision's target, else current
    metric: str  # the rule behind ``desired`` (e.g. "qps"), or "steady"
    value: float  # that rule's measured value
    ts_ns: int  # event time of the tick evaluated last
    stale: bool  # the workload's data is stale: desired is held at its last value
    decision_id: str | None = None  # the trigger that set ``desired``, if any


class ScaleView:
    def __init__(self, max_workloads: int = 100_000) -> None:
        self._by_key: dict[tuple[str, str], Desired] = {}
        self.max_workloads = max_workloads

    def update(self, d: Desired) -> None:
        key = (d.namespace, d.workload)
        if key not in self._by_key and len(self._by_key) >= self.max_workloads:
            self._by_key.pop(next(iter(self._by_key)))  # bounded: the oldest workload goes
        self._by_key[key] = d

    def remove(self, namespace: str, workload: str) -> None:
        """A workload whose partition moved to another worker: this one must not answer for it."""
        self._by_key.pop((namespace, workload), None)

    def get(self, namespace: str, workload: str) -> Desired | None:
        return self._by_key.get((namespace, workload))

    def all(self) -> list[Desired]:
        return list(self._by_key.values())
