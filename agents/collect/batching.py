"""Open batches per series, sent when full or old: the one batcher of the SDK publisher and the replay.

Pure: the caller passes monotonic ``now`` in seconds (the replay, which sends only full
batches and on flush, passes a constant and an infinite ``max_age_s``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from schemas.records import WIRE_VERSION, Labels

SeriesKey = tuple[str, str, str, str, tuple[tuple[str, str | int], ...]]
"""(topic, node, gpu, clock, labels as sorted items): one open batch each."""


@dataclass(slots=True)
class OpenBatch:
    """Samples of one series waiting to be sent."""

    key: SeriesKey
    labels: Labels | None
    since: float  # monotonic seconds of its first sample
    ts_ns: list[int] = field(default_factory=list)
    value: list[float] = field(default_factory=list)

    @property
    def topic(self) -> str:
        return self.key[0]

    @property
    def node(self) -> str:
        return self.key[1]

    def encode(self) -> bytes:
        _, node, gpu, clock, _ = self.key
        obj: dict[str, Any] = {"v": WIRE_VERSION, "node": node, "gpu": gpu, "clock": clock,
                               "ts_ns": self.ts_ns, "value": self.value}
        if self.labels:
            obj["labels"] = self.labels
        return orjson.dumps(obj)


class Batcher:
    """Open batches per series; pure (the caller passes monotonic ``now`` in seconds).

    >>> b = Batcher(max_batch=2, max_age_s=1.0)
    >>> b.add(("t", "n", "0", "utc", ()), None, 1, 1.0, now=0.0) is None
    True
    >>> full = b.add(("t", "n", "0", "utc", ()), None, 2, 2.0, now=0.1)
    >>> full.ts_ns, full.value, b.pending
    ([1, 2], [1.0, 2.0], 0)
    """

    def __init__(self, max_batch: int = 100, max_age_s: float = 0.1) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_age_s < 0:
            raise ValueError(f"max_age_s must be >= 0, got {max_age_s}")
        self.max_batch = max_batch
        self.max_age_s = max_age_s
        self._open: dict[SeriesKey, OpenBatch] = {}
        self.pending = 0  # samples in open batches
        self._oldest = math.inf  # earliest ``since`` among open batches (a lower bound after removals)

    def add(self, key: SeriesKey, labels: Labels | None, ts_ns: int, value: float, now: float) -> OpenBatch | None:
        """Add one sample; returns the series' batch when this sample filled it."""
        batch = self._open.get(key)
        if batch is None:
            # A copy: the caller may change its dict after sending.
            batch = self._open[key] = OpenBatch(key, dict(labels) if labels else None, now)
            if now < self._oldest:
                self._oldest = now
        batch.ts_ns.append(ts_ns)
        batch.value.append(value)
        self.pending += 1
        if len(batch.ts_ns) >= self.max_batch:
            del self._open[key]
            self.pending -= len(batch.ts_ns)
            return batch
        return None

    def get(self, key: SeriesKey) -> OpenBatch | None:
        """The series' open batch, if any."""
        return self._open.get(key)

    def take(self, key: SeriesKey) -> OpenBatch | None:
        """Take the series' open batch (e.g. its labels changed and a batch carries one label set)."""
        batch = self._open.pop(key, None)
        if batch is not None:
            self.pending -= len(batch.ts_ns)
        return batch

    def has_due(self, now: float) -> bool:
        """Whether some batch may be due (cheap: one comparison)."""
        return self._oldest <= now - self.max_age_s

    def due(self, now: float) -> list[OpenBatch]:
        """Take the batches whose first sample is at least ``max_age_s`` old."""
        limit = now - self.max_age_s
        if self._oldest > limit:
            return []
        out = [b for b in self._open.values() if b.since <= limit]
        for b in out:
            del self._open[b.key]
            self.pending -= len(b.ts_ns)
        self._oldest = min((b.since for b in self._open.values()), default=math.inf)
        return out

    def drain(self) -> list[OpenBatch]:
        """Take every open batch."""
        out = list(self._open.values())
        self._open.clear()
        self.pending = 0
        self._oldest = math.inf
        return out


def label_key(labels: Labels | None) -> tuple[tuple[str, str | int], ...]:
    return tuple(sorted(labels.items())) if labels else ()
