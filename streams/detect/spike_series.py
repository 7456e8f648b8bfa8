"""The storage of one spike series (``streams.detect.spikes``): bounded buckets, their numpy mirror, the peak cache.

Why each part exists (bounded buckets, the mirror, the cache and when it is dropped) is in
``streams.detect.spikes``' module docstring; the engine decides when each method is called.

>>> s = BucketSeries()
>>> s.vals.update({3: [1.0], 4: [2.0], 5: [3.0]}); s.lowest, s.newest = 3, 5
>>> s.purge(5)
>>> sorted(s.vals), s.lowest, s.cut
([5], 5, 5)
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

_NOT_ONLY: Final = 2**62  # ``only_mirrored_from`` when every bucket held is in ``vals``
_NO_B: Final = np.zeros(0, np.int64)
_NO_V: Final = np.zeros(0, np.float64)


class BucketSeries:
    """One series' buckets (the largest values of each, and a count of the rest), its mirror and its cache."""


    __slots__ = ("cache", "cache_hi", "cut", "dropped", "lowest", "m_b", "m_chunks", "m_from", "m_last", "m_pb",
                 "m_pv", "m_v", "newest", "only_mirrored_from", "vals")

    def __init__(self) -> None:
        self.vals: dict[int, list[float]] = {}  # bucket -> kept values (the largest when truncated)
        self.dropped: dict[int, int] = {}  # bucket -> values not kept
        self.newest = -(2**62)  # newest bucket seen (an upper bound of every bucket held)
        self.lowest = 2**62  # a lower bound of the oldest bucket held
        # tick_ns -> (peak, first bucket its windows read); valid while that bucket >= cut
        self.cache: dict[int, tuple[float | None, int]] = {}
        self.cache_hi = -(2**62)  # the last bucket a cached window reads
        self.cut = -(2**62)  # buckets below this have been purged
        # The mirror: the values of every bucket >= m_from, as numpy (bucket, value) arrays in
        # bucket order (m_b, m_v, then the chunks m_chunks, then the lists m_pb, m_pv), fed by
        # the in-order appends; anything else that changes a bucket >= m_from resets it.
        self.m_b: npt.NDArray[np.int64] = _NO_B
        self.m_v: npt.NDArray[np.float64] = _NO_V
        self.m_chunks: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]] = []
        self.m_pb: list[int] = []
        self.m_pv: list[float] = []
        self.m_from = self.newest + 1  # (no bucket held yet)
        self.m_last = self.newest  # the last bucket in the mirror (or m_from - 1)
        # Buckets from here up are held in the mirror only, not in ``vals`` (``hold_mirrored``; ``settle``).
        self.only_mirrored_from = _NOT_ONLY

    def touch(self, low_bucket: int) -> None:
        """Buckets from ``low_bucket`` up change: drop the cached peaks if a window reads one."""
        if low_bucket <= self.cache_hi:
            self.cache = {}
            self.cache_hi = -(2**62)

    def unmirror(self) -> None:
        """A bucket changed outside the mirror: restart it past every bucket held."""
        self.settle()
        self.m_b, self.m_v, self.m_chunks, self.m_pb, self.m_pv = _NO_B, _NO_V, [], [], []
        self.m_from, self.m_last = self.newest + 1, self.newest

    def add_chunk(self, b: npt.NDArray[np.int64], v: npt.NDArray[np.float64]) -> None:
        """Append in-order buckets (all past every bucket mirrored) to the mirror."""
        self._pending_to_chunks()  # what small calls appended comes before this chunk
        self.m_chunks.append((b, v))
        self.m_last = int(b[-1])
        if len(self.m_chunks) > 32:  # a series nobody reads: keep the mirror bounded (trimmed as purged)
            self.mirrored()

    def hold_mirrored(self, b: npt.NDArray[np.int64], v: npt.NDArray[np.float64]) -> None:
        """New buckets of one value each, in order, all past every bucket held and at or past ``m_from``, whose
        values the mirror takes: held in the mirror alone. A batched feed's buckets are read from the mirror and
        then purged, so building a list and a dict entry per bucket (and popping it) would be wasted; a path
        that reads or changes ``vals`` calls ``settle`` first."""
        if self.only_mirrored_from == _NOT_ONLY:
            self.only_mirrored_from = int(b[0])
        self.add_chunk(b, v)

    def settle(self) -> None:
        """Copy the buckets held in the mirror alone into ``vals``."""
        start = self.only_mirrored_from
        if start == _NOT_ONLY:
            return
        self.only_mirrored_from = _NOT_ONLY
        mb, mv = self.mirrored()
        i = int(np.searchsorted(mb, start))
        vals = self.vals
        for b, v in zip(mb[i:].tolist(), mv[i:].tolist(), strict=True):
            kept = vals.get(b)
            if kept is None:
                vals[b] = [v]
            else:
                kept.append(v)

    def held(self) -> int:
        """Buckets held, at most (those in the mirror alone counted as if none were empty)."""
        start = self.only_mirrored_from
        return len(self.vals) + (max(0, self.newest - start + 1) if start != _NOT_ONLY else 0)

    def _pending_to_chunks(self) -> None:
        if self.m_pb:
            self.m_chunks.append((np.array(self.m_pb, np.int64), np.array(self.m_pv, np.float64)))
            self.m_pb, self.m_pv = [], []

    def mirrored(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        self._pending_to_chunks()
        if self.m_chunks:
            drop = int(np.searchsorted(self.m_b, self.m_from))  # trim what purges released
            self.m_b = np.concatenate([self.m_b[drop:], *(c[0] for c in self.m_chunks)])
            self.m_v = np.concatenate([self.m_v[drop:], *(c[1] for c in self.m_chunks)])
            self.m_chunks = []
        return self.m_b, self.m_v

    def purge(self, keep_from: int) -> None:
        if self.lowest >= keep_from:
            return
        if keep_from > self.cut:
            self.cut = keep_from
        if keep_from > self.m_from:
            self.m_from = keep_from  # the mirror drops what lies below (``mirrored``)
        only = self.only_mirrored_from
        if only != _NOT_ONLY and keep_from > only:
            self.only_mirrored_from = only = keep_from
        stop = min(keep_from, only)  # no bucket from ``only`` up is in vals
        if stop - self.lowest <= max(64, len(self.vals)):
            # The usual case (a tick closing releases ~10 buckets, a poll's closes a few ticks' worth): pop the
            # released ones; a rebuild would walk every bucket kept. Only a gap far wider than what is held (a
            # series back after hours) is cheaper to rebuild.
            pop = self.vals.pop
            for b in range(self.lowest, stop):
                pop(b, None)
            if self.dropped:
                for b in range(self.lowest, stop):
                    self.dropped.pop(b, None)
            self.lowest = keep_from if self.vals or only != _NOT_ONLY else 2**62
            return
        self.vals = {b: v for b, v in self.vals.items() if b >= keep_from}
        self.dropped = {b: n for b, n in self.dropped.items() if b >= keep_from}
        self.lowest = min(min(self.vals, default=2**62), only)
