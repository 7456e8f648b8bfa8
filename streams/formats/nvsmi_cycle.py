"""How many GPUs an nvidia-smi CSV without an ``index`` or ``uuid`` column holds: two witnesses that must agree.

nvidia-smi writes one row per GPU per loop iteration, GPU 0 first, so the GPUs of such a file are told
by position in a fixed cycle of N rows. Equal timestamps cannot tell N: the rows of one iteration are
often stamped milliseconds apart, and a stalled iteration is split, its rows up to seconds apart. Two
things do, and each is asked on its own:

- **The rhythm.** Fold the gaps between consecutive rows by their position in a candidate cycle of n
  rows. For the true N the gap after an iteration's last row is the loop's (tens of ms to seconds) in
  nearly every iteration, while the gap after any other position is a few ms in most of them (a stall
  splits some iteration somewhere, never the same place in most). So N is the n whose last position's
  lower quartile gap is ``_CONTRAST`` times its other positions' median gaps. Half of N fails (only
  every other block ends with the loop's gap), twice N fails (a block holds a loop's gap inside). One
  GPU shows no such n, and every gap is the loop's.
- **The values.** Each GPU's readings (``memory.used``, power, ...) repeat every N rows far better
  than at any other lag: the rows N apart are the same GPU a loop later. The smallest lag whose median
  difference is well below the typical other lag's is the values' N. GPUs that all read alike (an
  idle node) leave this witness silent.

Where the two disagree, or neither can say, the count is not guessed: the caller asks for ``--gpus``.

>>> ms = 1_000_000
>>> # 3 GPUs every 100 ms, rows 6-7 ms apart (no two share a timestamp); the fourth iteration is split.
>>> ts = [0, 7, 13, 100, 107, 113, 200, 206, 213, 300, 600, 607, 700, 707, 713, 800, 807, 813]
>>> c = infer_cycle([t * ms for t in ts])
>>> c.gpus, c.ambiguous
(3, False)
>>> infer_cycle([0, 250 * ms, 500 * ms, 750 * ms]).gpus   # one GPU: every gap is the loop's
1
>>> vals = [(100.0 + 50 * (i % 3), 1000.0 * (i % 3)) for i in range(len(ts))]
>>> infer_cycle([t * ms for t in ts], vals).evidence
"the rhythm says 3 (5 iterations, loop gaps 11.0x the rows'), the values repeat every 3 rows"
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

MAX_GPUS: Final = 64  # more GPUs than one node holds: not a cycle
_CONTRAST: Final = 3.0  # the loop's gap over the within-iteration gaps, for a rhythm to count
_FLOOR_NS: Final = 1_000_000  # 1 ms added to every gap: equal timestamps give gaps of 0
_ONE_GPU_NS: Final = 45_000_000  # every gap at least this (lower quartile): one GPU, a loop of >= ~50 ms
_MIN_BLOCKS: Final = 2  # iterations a candidate needs before its rhythm counts
_FULL_BLOCKS: Final = 8  # iterations from which its contrast counts in full against another candidate's
_VALUE_CONTRAST: Final = 0.5  # the values' lag N differs at most this much of the typical other lag
_VALUE_FLOOR: Final = 0.01  # of a column's spread: differences this small are the reading's noise


@dataclass(frozen=True, slots=True)
class Cycle:
    """N GPUs per loop iteration (None: not told), and what each witness said."""

    gpus: int
    rhythm: int | None  # None: the gaps show no cycle
    values: int | None  # None: the values show no period (or there were none)
    evidence: str

    @property
    def ambiguous(self) -> bool:
        """The witnesses disagree, or neither could say: the caller should be told N (``--gpus``)."""
        return (self.rhythm is None and self.values is None) or (
            self.rhythm is not None and self.values is not None and self.rhythm != self.values)


def infer_cycle(ts_ns: Sequence[int | None], values: Sequence[Sequence[float | None]] | None = None
                ) -> Cycle | None:
    """The cycle of rows stamped ``ts_ns`` in file order (None where a row's stamp is unreadable: it still
    holds its place) with each row's readings ``values`` (the same columns in every row; None where
    missing), or None with fewer than two stamps."""
    if sum(t is not None for t in ts_ns) < 2:
        return None
    gaps: list[float | None] = [None if a is None or b is None else max(b - a, 0) + _FLOOR_NS
                                for a, b in itertools.pairwise(ts_ns)]
    rhythm, contrast, blocks = _rhythm(gaps)
    period = _period(values) if values else None
    said = []
    if rhythm is not None and rhythm > 1:
        said.append(f"the rhythm says {rhythm} ({blocks} iterations, loop gaps {contrast:.1f}x the rows')")
    elif rhythm == 1:
        said.append("the rhythm says 1 (every gap is the loop's)")
    else:
        said.append("the rhythm is unclear")
    if period is not None:
        said.append(f"the values repeat every {period} rows")
    elif values:
        said.append("the values show no period")
    gpus = rhythm if rhythm is not None else period if period is not None else 1
    return Cycle(gpus, rhythm, period, ", ".join(said))


def _rhythm(gaps: Sequence[float | None]) -> tuple[int | None, float, int]:
    """(N, its contrast, its iterations) from the gaps, N None when no cycle shows."""
    best: tuple[float, int, int, float] | None = None
    for n in range(2, MAX_GPUS + 1):
        blocks = (len(gaps) + 1) // n - 1  # the last, maybe partial, iteration is left out
        if blocks < _MIN_BLOCKS:
            break
        phases: list[list[float]] = [[] for _ in range(n)]
        for i in range(blocks * n):
            g = gaps[i]
            if g is not None:
                phases[i % n].append(g)
        if any(not p for p in phases):
            continue
        end = _quantile(phases[-1], 0.25)
        inner = max(_quantile(p, 0.5) for p in phases[:-1])
        contrast = end / inner
        # A few iterations can line up by chance (a stall or two as long as the loop's gap): a candidate's
        # contrast counts in full from _FULL_BLOCKS iterations on, less with fewer.
        score = contrast * min(1.0, blocks / _FULL_BLOCKS)
        if contrast >= _CONTRAST and (best is None or score > best[3]):
            best = (contrast, n, blocks, score)
    if best is not None:
        return best[1], best[0], best[2]
    known = [g for g in gaps if g is not None]
    if _quantile(known, 0.25) >= _ONE_GPU_NS:
        return 1, 1.0, len(known)
    return None, 0.0, 0


def _period(values: Sequence[Sequence[float | None]]) -> int | None:
    """The rows' period by their readings: each column's, where the columns that show one agree."""
    found = {p for col in zip(*values, strict=True) if (p := _column_period(col)) is not None}
    return found.pop() if len(found) == 1 else None


def _column_period(col: Sequence[float | None]) -> int | None:
    """The smallest lag at which one column's readings repeat clearly (relative to the column's spread)."""
    known = sorted(v for v in col if v is not None and math.isfinite(v))
    if len(known) < 2 * _MIN_BLOCKS:
        return None
    spread = known[len(known) * 3 // 4] - known[len(known) // 4]
    if spread <= 0:
        return None  # one value throughout: says nothing of the period
    scaled = [None if v is None or not math.isfinite(v) else v / spread for v in col]
    diffs: dict[int, float] = {}
    for lag in range(1, min(MAX_GPUS, len(col) // _MIN_BLOCKS) + 1):
        d = [abs(a - b) for a, b in zip(scaled[lag:], scaled, strict=False) if a is not None and b is not None]
        if d:
            diffs[lag] = _quantile(d, 0.5)
    if len(diffs) < 3:
        return None
    # The closest lag, then the smallest lag as close (N's multiples are as close as N). Lag 1 cannot be a
    # cycle of GPUs (every lag is its multiple), and the period must beat the neighbouring row as well as
    # the typical other lag: a single GPU's smooth series is closest to its last reading, and readings
    # the GPUs share (the same utilisation on every GPU of a tensor-parallel job) are closest there too.
    low = min(d for lag, d in diffs.items() if lag > 1)
    lag = min(k for k, d in diffs.items() if k > 1 and d <= 1.25 * low + _VALUE_FLOOR)
    others = [x for k, x in diffs.items() if k % lag]
    if not others:
        return None
    apart = min(diffs[1], _quantile(others, 0.5))  # how far readings of different GPUs typically are
    return lag if apart > _VALUE_FLOOR and diffs[lag] <= _VALUE_CONTRAST * apart else None


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(int(q * len(s)), len(s) - 1)]
