"""How many GPUs an nvidia-smi CSV without an ``index`` or ``uuid`` column holds: the loop's rhythm.

nvidia-smi writes one row per GPU per loop iteration, GPU 0 first, so the GPUs of such a file are told
by position in a fixed cycle of N rows. Equal timestamps cannot tell N: the rows of one iteration are
often stamped milliseconds apart, and a stalled iteration is split, its rows up to seconds apart. What
holds is the rhythm: the rows of an iteration come within milliseconds, iterations follow the loop
interval (``-lms``). N is the typical count of rows between the loop's gaps.

>>> ms = 1_000_000
>>> # 3 GPUs every 100 ms, rows 6-7 ms apart (no two share a timestamp); the fourth iteration is split.
>>> ts = [0, 7, 13, 100, 107, 113, 200, 206, 213, 300, 600, 607, 700, 707, 713]
>>> infer_cycle([t * ms for t in ts])
Cycle(gpus=3, runs=5, typical=3)
>>> infer_cycle([t * ms for t in ts]).ambiguous
False
>>> infer_cycle([0, 250 * ms, 500 * ms]).gpus   # one GPU: every gap is the loop's
1
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

MAX_GPUS: Final = 64  # more GPUs than one node holds: not a cycle
# The smallest jump, as a ratio of consecutive sorted gaps, that separates the gaps within an iteration from
# those between iterations; below it every gap is the loop's (one GPU).
_MIN_JUMP: Final = 3.0
_FLOOR_NS: Final = 1_000_000  # 1 ms added before comparing gaps: equal timestamps give gaps of 0
_WITHIN_NS: Final = 50_000_000 + _FLOOR_NS  # the most two rows of one iteration are apart, but in a stall


@dataclass(frozen=True, slots=True)
class Cycle:
    """N GPUs per loop iteration, and the evidence: of ``runs`` runs of rows between the loop's gaps,
    ``typical`` had exactly N rows (the others are parts of iterations split across a gap)."""

    gpus: int
    runs: int
    typical: int

    @property
    def ambiguous(self) -> bool:
        """Fewer than half the runs have N rows: the caller should be told N (``--gpus``)."""
        return self.typical * 2 < self.runs


def infer_cycle(ts_ns: Sequence[int]) -> Cycle | None:
    """The cycle of rows stamped ``ts_ns`` (file order), or None with fewer than two rows."""
    if len(ts_ns) < 2:
        return None
    gaps = [max(b - a, 0) + _FLOOR_NS for a, b in itertools.pairwise(ts_ns)]
    threshold = _between_threshold(sorted(gaps))
    if threshold is None:
        return Cycle(1, len(ts_ns), len(ts_ns))
    runs, run = [], 1
    for g in gaps:
        if g >= threshold:
            runs.append(run)
            run = 1
        else:
            run += 1
    # The last run is left out: a recording stopped (or cut off) mid-iteration ends with a partial one.
    if not runs:
        runs = [run]
    counts = Counter(runs)
    gpus, typical = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))
    if gpus > MAX_GPUS:
        return Cycle(gpus, len(runs), 0)
    return Cycle(gpus, len(runs), typical)


def _between_threshold(sorted_gaps: list[int]) -> float | None:
    """The gap size from which a gap is between iterations: the geometric middle of the largest jump of the
    sorted gaps, or None where there is none (one GPU: every gap is the loop's).

    A jump counts only with at least one gap in ``MAX_GPUS + 1`` above it (each iteration ends with one) and
    with the gaps below it within ``_WITHIN_NS`` (an iteration's rows are written within milliseconds):
    otherwise a single stall in a one-GPU recording would pass for the loop's rhythm.
    """
    n = len(sorted_gaps)
    need_above = max(1, n // (MAX_GPUS + 1))
    best, at = _MIN_JUMP, -1
    for i in range(n - 1):
        if sorted_gaps[i] > _WITHIN_NS:
            break
        if n - 1 - i < need_above:
            break
        ratio = sorted_gaps[i + 1] / sorted_gaps[i]
        if ratio >= best:
            best, at = ratio, i
    if at < 0:
        return None
    return math.sqrt(sorted_gaps[at] * sorted_gaps[at + 1])
