"""What FLOPS/Watt one GPU achieves at each power draw: the load-conditioned norm of ``streams.detect.drift``.

A GPU's static power does not fall with its load, so FLOPS/W falls whenever the load
does (seed-level physics, not a fault). Drift is judged against what this GPU and
workload achieved *at the same power*: the curve holds recent healthy (power, FLOPS/W)
pairs in bands of ``band`` relative width on a log-power axis, each band a median of its
last ``cap`` pairs, and answers the norm at a power by linear interpolation between the
two nearest ready bands around it (a band is ready with ``need`` pairs).

Limits, on purpose: it does not extrapolate. At a power no ready band brackets closely
(within ``span`` band widths, or half a band of one centroid), the norm is unknown and
the tick is not judged, only learnt: a drop that starts together with a move to a load
never seen before is learnt as that load's norm. Which pairs are healthy (the drift
rule's accepted ticks) is the caller's business.

>>> c = LoadCurve(band=0.03, cap=8, need=3, max_bands=8)
>>> for _ in range(3):
...     c.accept(300.0, 1.0)
...     c.accept(600.0, 2.0)
>>> c.expected(300.0), c.expected(600.0), c.expected(450.0)  # 450 W: between bands 2x apart, too far to join
(1.0, 2.0, None)
>>> for _ in range(3):
...     c.accept(320.0, 1.2)
>>> round(c.expected(310.0), 3), c.expected(200.0)
(1.1, None)
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Protocol

from streams.detect.drift_baseline import Baseline


class LoadNorm(Protocol):
    """What a GPU's healthy FLOPS/W is at a load: the drift rule needs only this of a load model."""

    def accept(self, power: float, value: float) -> None:
        """Learn one healthy tick: ``value`` FLOPS/W at ``power`` W."""
        ...

    def expected(self, power: float | None) -> float | None:
        """The healthy FLOPS/W at ``power``, or None where the model cannot say."""
        ...

    def bracket(self, power: float | None) -> tuple[float, float] | None:
        """The powers of the healthy loads the norm at ``power`` is read from (low, high), or None."""
        ...

    def reset(self) -> None:
        """Forget everything (a new workload)."""
        ...

    def snapshot(self) -> list[list[Any]]:
        """The state as JSON-able plain data (parameters excluded: they come from the caller)."""
        ...

    def load(self, snap: list[list[Any]]) -> None:
        """Take the state of ``snapshot``."""
        ...


class _Band:
    __slots__ = ("power", "value")

    def __init__(self, cap: int, need: int) -> None:
        self.power, self.value = Baseline(cap, need), Baseline(cap, need)

    def centroid(self) -> tuple[float, float] | None:
        p, v = self.power.value, self.value.value
        return None if p is None or v is None else (p, v)


class LoadCurve:
    """Healthy FLOPS/W by power band, for one GPU and workload (bounded: ``max_bands`` x ``cap`` pairs)."""

    def __init__(self, band: float, cap: int, need: int, max_bands: int = 12, span: float = 3.0) -> None:
        if not 0 < band < 1:
            raise ValueError(f"band must be a fraction in (0, 1), got {band}")
        if not 1 <= need <= cap or max_bands < 1 or span < 1:
            raise ValueError("need 1 <= need <= cap, max_bands >= 1 and span >= 1")
        self.band, self.cap, self.need, self.max_bands, self.span = band, cap, need, max_bands, span
        self._log_w = math.log1p(band)
        self._bands: OrderedDict[int, _Band] = OrderedDict()  # least recently taught first

    def __len__(self) -> int:
        return len(self._bands)

    def _key(self, power: float) -> int:
        return math.floor(math.log(power) / self._log_w)

    def accept(self, power: float, value: float) -> None:
        """A healthy tick: ``value`` FLOPS/W at ``power`` W (ignored unless both are finite and power > 0)."""
        if not (power > 0 and math.isfinite(power) and math.isfinite(value)):
            return
        k = self._key(power)
        b = self._bands.get(k)
        if b is None:
            b = self._bands[k] = _Band(self.cap, self.need)
            if len(self._bands) > self.max_bands:
                self._bands.popitem(last=False)
        else:
            self._bands.move_to_end(k)
        b.power.accept(power)
        b.value.accept(value)

    def expected(self, power: float | None) -> float | None:
        """The norm at ``power``, or None when no ready band is close enough to say."""
        got = self._read(power)
        return None if got is None else got[0]

    def bracket(self, power: float | None) -> tuple[float, float] | None:
        """The centroid powers of the ready bands the norm at ``power`` is read from (equal for one band)."""
        got = self._read(power)
        return None if got is None else (got[1], got[2])

    def _read(self, power: float | None) -> tuple[float, float, float] | None:
        if power is None or not (power > 0 and math.isfinite(power)):
            return None
        lo: tuple[float, float] | None = None
        hi: tuple[float, float] | None = None
        for b in self._bands.values():
            c = b.centroid()
            if c is None:
                continue
            if c[0] <= power and (lo is None or c[0] > lo[0]):
                lo = c
            if c[0] >= power and (hi is None or c[0] < hi[0]):
                hi = c
        if lo is not None and hi is not None and math.log(hi[0] / lo[0]) <= self.span * self._log_w:
            if hi[0] == lo[0]:
                return lo[1], lo[0], lo[0]
            return lo[1] + (hi[1] - lo[1]) * (power - lo[0]) / (hi[0] - lo[0]), lo[0], hi[0]
        near = [c for c in (lo, hi) if c is not None and abs(math.log(power / c[0])) <= self._log_w / 2]
        if not near:
            return None
        c = min(near, key=lambda c: abs(c[0] - power))
        return c[1], c[0], c[0]

    def reset(self) -> None:
        self._bands.clear()

    def snapshot(self) -> list[list[Any]]:
        return [[k, b.power.values(), b.value.values()] for k, b in self._bands.items()]

    def load(self, snap: list[list[Any]]) -> None:
        self._bands.clear()
        for k, powers, values in snap:
            b = self._bands[int(k)] = _Band(self.cap, self.need)
            b.power.reset(float(p) for p in powers)
            b.value.reset(float(v) for v in values)
