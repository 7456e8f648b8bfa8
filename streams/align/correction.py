"""Clock corrections applied to a poll of samples: domain times onto UTC, over whole arrays."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]


class Correction(Protocol):
    """A clock-domain-to-UTC mapping (``streams.align.clock.ClockFit`` is one)."""

    @property
    def base_ns(self) -> int: ...
    @property
    def offset_ns(self) -> float: ...
    @property
    def drift(self) -> float: ...
    @property
    def ref_ns(self) -> int: ...
    @property
    def uncertainty_ns(self) -> int: ...


def to_utc(ts: I64, lens: I64, fixes: Sequence[tuple[int, Correction]]) -> tuple[I64, I64]:
    """utc = t + base + round(offset + drift * (t - ref)) for the messages that carry a correction;
    ``fixes`` are (message index, correction) pairs, ``lens`` the messages' sample counts. Returns
    the UTC times and each sample's uncertainty.

    Every message of the poll takes part, the uncorrected ones with the identity, so the
    arithmetic runs over whole arrays with no masks, gathers or scatters (it is memory-bound).
    """
    m = len(lens)
    base, ref, unc = np.zeros(m, np.int64), np.zeros(m, np.int64), np.zeros(m, np.int64)
    off, drift = np.zeros(m), np.zeros(m)
    at = [i for i, _ in fixes]
    fits = [c for _, c in fixes]
    base[at] = [c.base_ns for c in fits]
    ref[at] = [c.ref_ns for c in fits]
    unc[at] = [c.uncertainty_ns for c in fits]
    off[at] = [c.offset_ns for c in fits]
    drift[at] = [c.drift for c in fits]
    shift = (ts - np.repeat(ref, lens)).astype(np.float64)
    shift *= np.repeat(drift, lens)  # exactly 0 where drift is 0, however coarse the float
    shift += np.repeat(off, lens)
    np.rint(shift, out=shift)
    out = ts + shift.astype(np.int64)
    out += np.repeat(base, lens)
    return out, np.repeat(unc, lens)
