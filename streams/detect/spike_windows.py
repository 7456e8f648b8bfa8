"""Window quantile evaluation for the L1 spike engine (streams/detect/spikes.py).

The engine stores each series as buckets of kept values (the largest ``max_per_bucket``,
plus a count of the rest) and a numpy mirror of the recent buckets; this module turns
those into the highest window quantile per tick. Windows end at bucket boundaries and
cover the ``nb`` buckets before them; the window ending at boundary ``j`` reads buckets
``j - nb .. j - 1``. The quantile is the nearest rank, numpy's ``method="inverted_cdf"``
(Hyndman-Fan 1), to the bit: the smallest value with at least ``q`` of the window's ``n``
values at or below it, the value at 0-based ascending position ``ceil(n * q) - 1`` (as
numpy computes it in float, see ``position``). For ``n <= 100`` at ``q = 0.99`` that is the
window's maximum. It is always one of the window's samples, never an interpolation.

Why nearest rank: at 10 Hz a 1 s window holds ~10 samples, and a sample above the threshold
in so sparse a window is a spike that lasted at least one sampling interval. The linear
method (numpy's default) puts the P99 of 10 values at position 8.91, i.e. 0.91 * spike +
0.09 * the next value down, so a spike that jitter left with one sample is pulled towards
the background and under the threshold: it hides exactly the single-sample spikes.

Exactness with bounded buckets: nearest rank reads the ``n - pos``-th largest value,
``n - pos = floor(n * (1 - q)) + 1 <= ceil(n * (1 - q)) + 1``, so it needs only that many
values from the top. The top ``max_per_bucket`` values of every bucket contain the top
``max_per_bucket`` of any union of buckets, so the figure is exact while
``floor(n * (1 - q)) + 1 <= max_per_bucket`` and otherwise a lower bound.

Two evaluations, the same figures:

- ``peak_one``: one tick, a plain loop sliding one sorted list along the buckets. It
  reads the kept values and the dropped counts, so it is exact for any bucket state the
  engine holds; the hot path when nothing is left to read ahead.
- ``peaks_ahead``: several consecutive ticks at once with numpy, from the mirror (which
  holds every value of its buckets, none dropped), so the engine can cache them: a 10 s
  message closes ~10 ticks at once. Where no window holds more values than its rank is
  the largest of (99 at q = 0.99: every 10 Hz window), a tick's peak is the largest value
  its windows read together, taken without sorting a window.

Nothing here holds series state: the engine owns storage, mirror and cache, and passes
this module plain dicts and arrays (so neither module imports the other's internals).

>>> wq = WindowQuantiles(nb=2, max_per_bucket=4, q=0.6)
>>> vals = {0: [1.0, 3.0], 1: [2.0], 2: [9.0]}
>>> wq.peak_one(vals, {}, 2, 3)   # windows ending at 2 ({1, 2, 3}: 2.0) and 3 ({2, 9}: 2.0 at 0.5, 9.0 at 0.6)
9.0
>>> mb, mv = np.array([0, 0, 1, 2], np.int64), np.array([1.0, 3.0, 2.0, 9.0])
>>> wq.peaks_ahead(mb, mv, [2, 3, 4])
[2.0, 9.0]
>>> [float(np.quantile(w, 0.6, method="inverted_cdf")) for w in ([1.0, 3.0, 2.0], [2.0, 9.0])]
[2.0, 9.0]
"""

from __future__ import annotations

import bisect
import math
from typing import Final

import numpy as np
import numpy.typing as npt

_CELLS: Final = 1 << 16  # peaks_ahead sorts at most about this many window x value cells in one go


# Nearest rank, not numpy's default linear method: in a sparse window (~10 samples at 10 Hz)
# a sample above the threshold is a spike that lasted at least one sampling interval, and
# interpolating towards the next value down (the background) hides single-sample spikes.
def position(n: int, q: float) -> int:
    """Nearest rank, as numpy's ``inverted_cdf``: the order statistic (ascending, 0-based) of ``n`` values.

    ``n * q - 1`` rounded up, computed in float as numpy does (so ``n * q`` that rounds to an
    integer takes that integer), at least 0.

    >>> [position(n, 0.99) for n in (1, 10, 100, 101, 1_000)]
    [0, 9, 98, 99, 989]
    """
    v = n * q - 1
    lo = math.floor(v)
    return max(lo if v == lo else lo + 1, 0)


def quantile_of_top(kept: list[float], n: int, q: float) -> float:
    """The nearest-rank quantile of ``n`` values whose largest ``len(kept)`` are ``kept`` (ascending);
    a lower bound when the rank falls below ``kept`` (see the module docstring).

    >>> xs = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    >>> quantile_of_top(sorted(xs), len(xs), 0.99) == float(np.quantile(xs, 0.99, method="inverted_cdf"))
    True
    >>> quantile_of_top([9.0, 99.0], 10, 0.99)   # the top 2 of 10 suffice at q=0.99 (the maximum)
    99.0
    """
    return kept[max(position(n, q) - (n - len(kept)), 0)]


class WindowQuantiles:
    """Sliding-window ``q`` quantiles over windows of ``nb`` buckets of at most ``max_per_bucket`` values."""

    def __init__(self, nb: int, max_per_bucket: int, q: float) -> None:
        self.nb, self.q = nb, q
        self._positions: dict[int, int] = {}  # window size -> position(n, q)
        # peaks_ahead's table, by the number n of values in a window (none dropped) up to
        # top_n: the nearest-rank position in the ascending window (position).
        self.top_n = nb * max_per_bucket
        self._at = np.array([position(n, q) if n else 0 for n in range(self.top_n + 1)], np.int64)
        # Up to this many values in a window, its nearest rank is its largest value (99 at q = 0.99).
        self.max_rank_upto = next((n - 1 for n in range(1, self.top_n + 1) if self._at[n] != n - 1), self.top_n)
        self._tables: dict[int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = {}

    def peaks_ahead(self, mb: npt.NDArray[np.int64], mv: npt.NDArray[np.float64],
                    ends: list[int]) -> list[float | None] | None:
        """Peaks of consecutive ticks from the mirror ``mb``, ``mv`` (bucket-ordered (bucket, value)
        arrays holding every value of the buckets the windows read); tick k's windows end at
        boundaries ``ends[k] .. ends[k + 1] - 1``. Dense windows evaluate fewer ticks (at least
        one): the result's length says how many. None when too dense for the tables: take
        ``peak_one``."""
        nb = self.nb
        ahead = len(ends) - 1
        first, last = ends[0], ends[-1] - 1
        # cum[i]: mirror values before bucket first - nb + i; window w (ending at first + w) is cum[w] .. cum[w + nb]
        cum = np.searchsorted(mb, np.arange(first - nb, last + 1, dtype=np.int64))
        n_win = last - first + 1
        cnt = cum[nb:] - cum[:n_win]
        width = int(cnt.max())
        if width == 0:
            return [None] * ahead
        if width <= self.max_rank_upto:  # every window's rank is its largest value (the 10 Hz feed)
            return self._largest(mv, cum, np.asarray(ends, np.int64) - first)
        if width * n_win > _CELLS:  # dense windows: fewer ticks per go
            ahead = max(1, ahead * _CELLS // (width * n_win))
            last = ends[ahead] - 1
            n_win = last - first + 1
            cnt = cnt[:n_win]
            width = int(cnt.max())
        if width > self.top_n:  # windows too dense for the tables: one tick, the plain loop
            return None
        # Each window's values, ascending, right-aligned in a row of ``width`` (padded with
        # the lowest value: ties are the same value).
        tab = self._tables
        if width not in tab:
            tab[width] = (np.arange(width, dtype=np.int64), np.arange(-width, 0, dtype=np.int64))
        col, back = tab[width]
        stop = cum[nb:nb + n_win]
        idx = stop[:, None] + back  # the row's last cell is the window's last value (stop - 1)
        mat = mv[np.maximum(idx, cum[0])]
        mat[col < (width - cnt)[:, None]] = float(mv[cum[0]:stop[-1]].min())
        mat.sort(axis=1)
        # Nearest rank (see position), by table; no value is dropped (mirrored)
        off = np.arange(0, n_win * width, width, dtype=np.int64) + (width - cnt)
        flat = mat.ravel()
        # An empty window's position points one past its row; clamped, the read is harmless
        # (its result is replaced by -inf below) even for the last row.
        x = flat[np.minimum(off + self._at[cnt], flat.size - 1)]
        x[cnt == 0] = -np.inf
        seg = np.asarray(ends[:ahead], np.int64) - first
        peaks: list[float] = np.maximum.reduceat(x, seg).tolist()
        any_: list[bool] = np.logical_or.reduceat(cnt > 0, seg).tolist()
        return [p if a else None for p, a in zip(peaks, any_, strict=True)]

    def _largest(self, mv: npt.NDArray[np.float64], cum: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]
                 ) -> list[float | None]:
        """``peaks_ahead`` where every window's quantile is its largest value: then a tick's peak is the largest
        value its windows read together, buckets ``ends[k] - nb .. ends[k + 1] - 2`` (``ends`` and ``cum`` as in
        ``peaks_ahead``, counted from its first boundary), and no window needs sorting."""
        lo = cum[ends[:-1]]
        span = cum[ends[1:] - 1 + self.nb] - lo
        at = lo[:, None] + np.arange(int(span.max()), dtype=np.int64)
        rows = mv[np.minimum(at, len(mv) - 1)]
        rows[at >= (lo + span)[:, None]] = -np.inf
        peaks: list[float] = rows.max(axis=1).tolist()
        return [p if n else None for p, n in zip(peaks, span.tolist(), strict=True)]

    def peak_one(self, vals: dict[int, list[float]], dropped: dict[int, int], first: int,
                 last: int) -> float | None:
        """The highest quantile among the windows ending at boundaries ``first .. last``, from the
        kept values ``vals`` and the dropped counts ``dropped`` (bucket -> ...); None without values."""
        nb, q, pos = self.nb, self.q, self._positions
        span = range(first - nb, last)
        got = [vals.get(k) for k in span]
        lost = [dropped.get(k, 0) for k in span] if dropped else [0] * len(span)
        # The window ending at bucket j covers buckets j - nb .. j - 1: slide one sorted
        # list along, taking the leaving bucket out and the entering one in.
        win = sorted(v for kept in got[:nb] if kept for v in kept)
        missing = sum(lost[:nb])
        best: float | None = None
        for i in range(last - first + 1):
            if i:
                out, into = got[i - 1], got[i - 1 + nb]
                if out:
                    for v in out:
                        del win[bisect.bisect_left(win, v)]
                if into:
                    for v in into:
                        bisect.insort(win, v)
                missing += lost[i - 1 + nb] - lost[i - 1]
            if win:
                n = len(win) + missing
                at = pos.get(n)
                if at is None:
                    at = position(n, q)
                    if len(pos) < 4_096:
                        pos[n] = at
                # quantile_of_top, inlined (this loop is the hot path): nearest rank
                x = win[max(at - missing, 0)]
                best = x if best is None or x > best else best
        return best
