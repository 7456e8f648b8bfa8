"""Clock domains: how a domain's time relates to UTC (the truth the simulator knows) and
how the pipeline estimates that relation online from ``clock.sync`` beacons.

A beacon is one reading of the domain taken between two UTC readings of its host.
The UTC midpoint is the best guess of when the domain was read; its error is at most
half the round trip, so beacons with a short round trip are worth far more. The
estimator keeps a window of recent beacons, fits ``utc - domain = offset + drift *
(domain - ref)`` by weighted least squares over the shortest-round-trip ones (weights
1 / half-round-trip squared), drops points that disagree with the fit by more than
their own uncertainty allows, and starts over when the domain steps backwards (a
reboot or a process restart resets a monotonic clock).
"""

from __future__ import annotations

import bisect
import math
import random
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Final

from schemas.records import ClockBeacon

_NS: Final = 1_000_000_000


@dataclass(frozen=True, slots=True)
class DomainClock:
    """The true clock of a domain: ``domain = utc + offset + drift * (utc - start)``, with resets.

    At each UTC instant in ``resets_ns`` the domain steps back by ``reset_jump_ns`` and
    keeps running at the same rate.

    >>> c = DomainClock(offset_ns=1_000_000, drift_ppm=100.0, start_ns=0)
    >>> c.to_domain(10 * 10**9) - 10 * 10**9
    2000000
    """

    offset_ns: int
    drift_ppm: float
    start_ns: int
    resets_ns: tuple[int, ...] = ()
    reset_jump_ns: int = 2 * _NS

    def epoch(self, utc_ns: int) -> int:
        return sum(1 for r in self.resets_ns if r <= utc_ns)

    def to_domain(self, utc_ns: int) -> int:
        elapsed = utc_ns - self.start_ns
        return (utc_ns + self.offset_ns + round(elapsed * self.drift_ppm * 1e-6)
                - self.epoch(utc_ns) * self.reset_jump_ns)


@dataclass(frozen=True, slots=True)
class BeaconNoise:
    """Round trips of a beacon: log-uniform between the bounds, split at random between
    the way there and back (an asymmetric split is what makes a midpoint wrong)."""

    min_rtt_ns: int = 20_000
    max_rtt_ns: int = 2_000_000

    def beacon(self, rng: random.Random, node: str, clock: str, truth: DomainClock, utc_ns: int) -> ClockBeacon:
        rtt = round(math.exp(rng.uniform(math.log(self.min_rtt_ns), math.log(self.max_rtt_ns))))
        there = rng.randrange(rtt + 1)
        return ClockBeacon(node, clock, truth.to_domain(utc_ns), utc_ns - there, utc_ns - there + rtt)


@dataclass(frozen=True, slots=True)
class ClockParams:
    """Estimator settings.

    ``window``: beacons kept; ``best``: how many of the shortest round trips the fit
    uses; ``max_rtt_ns``: longer round trips are ignored outright; ``min_span_ns``:
    the domain time the fitted beacons must span before drift is estimated;
    ``outlier_k``: a point whose residual exceeds k times its half round trip (plus
    ``floor_ns``) is dropped from the fit. ``epoch_slack_ns``: how far before an
    epoch's first beacon (and after a finished epoch's last one) its samples may lie;
    ``old_epoch_beacons``: how many beacons of later epochs an epoch is kept for, to
    place its stragglers.
    """

    window: int = 48
    best: int = 8
    max_rtt_ns: int = 10_000_000
    min_span_ns: int = 5 * _NS
    outlier_k: float = 3.0
    floor_ns: int = 20_000
    history: int = 3_600  # fits a DomainTrack keeps for placing samples (one per beacon)
    epoch_slack_ns: int = 10 * _NS
    old_epoch_beacons: int = 120

    def __post_init__(self) -> None:
        if self.window < 2 or not 1 <= self.best <= self.window:
            raise ValueError("window must be >= 2 and 1 <= best <= window")


@dataclass(frozen=True, slots=True)
class ClockFit:
    """``utc = domain + base_ns + offset_ns + drift * (domain - ref_ns)``; ``uncertainty_ns`` bounds the error."""

    base_ns: int
    offset_ns: float
    drift: float
    ref_ns: int
    uncertainty_ns: int
    epoch: int

    def to_utc(self, domain_ns: int) -> int:
        return domain_ns + self.base_ns + round(self.offset_ns + self.drift * (domain_ns - self.ref_ns))


@dataclass(slots=True)
class ClockEstimator:
    """Online offset and drift of one (node, clock domain) against UTC.

    >>> est = ClockEstimator(ClockParams())
    >>> est.fit is None
    True
    >>> est.add(ClockBeacon("n", "nvml:n", 5_000, 1_000_000, 1_000_040))
    True
    >>> est.fit.to_utc(5_000), est.fit.uncertainty_ns
    (1000020, 20)
    """

    params: ClockParams
    beacons: deque[ClockBeacon] = field(default_factory=deque)
    fit: ClockFit | None = None
    epoch: int = 0
    last_domain_ns: int | None = None
    last_utc_ns: int | None = None
    # The window again, as (round trip, arrival number) sorted, kept up to date with bisect
    # rather than re-sorted per beacon; the arrival number breaks ties in window order.
    # Arrival numbers in the window are consecutive, ending at ``_seq``.
    _by_rtt: list[tuple[int, int]] = field(default_factory=list)
    _seq: int = 0
    _best: list[tuple[int, int]] = field(default_factory=list)

    def add(self, b: ClockBeacon) -> bool:
        """Take a beacon; False if it was ignored (round trip too long or out of order)."""
        rtt = b.utc_after_ns - b.utc_before_ns
        if rtt < 0 or rtt > self.params.max_rtt_ns:
            return False
        if self.last_utc_ns is not None and b.utc_after_ns <= self.last_utc_ns:
            return False  # a stale or replayed beacon: the estimate already saw later ones
        if self.last_domain_ns is not None and b.domain_ns < self.last_domain_ns:
            # UTC moved on but the domain went back: it restarted. Old beacons describe
            # another epoch and would poison the fit.
            self.beacons.clear()
            self._by_rtt.clear()
            self.epoch += 1
        self.last_domain_ns, self.last_utc_ns = b.domain_ns, b.utc_after_ns
        self._seq += 1
        self.beacons.append(b)
        bisect.insort(self._by_rtt, (rtt, self._seq))
        while len(self.beacons) > self.params.window:
            key = (_round_trip(self.beacons[0]), self._seq - len(self.beacons) + 1)
            self.beacons.popleft()
            del self._by_rtt[bisect.bisect_left(self._by_rtt, key)]
        best = self._by_rtt[: self.params.best]
        # The fit is a function of the best beacons alone (so a replay that rebuilds the
        # window rebuilds the fit): when they did not change, neither does the fit.
        if self.fit is None or best != self._best:
            first = self._seq - len(self.beacons) + 1
            self.fit = self._fit([self.beacons[seq - first] for _, seq in best])
            self._best = best
        return True

    def _fit(self, best: list[ClockBeacon]) -> ClockFit:
        p = self.params
        first = best[0]
        ref = first.domain_ns
        # Offsets are ~1e18 for a monotonic clock: fit in floats relative to an integer base.
        base = first.utc_before_ns - first.domain_ns
        pts = [(float(b.domain_ns - ref), (b.utc_before_ns - b.domain_ns - base) + b.round_trip_ns / 2,
                max(b.round_trip_ns / 2, 1.0)) for b in best]
        kept = _consensus(pts, p)
        a, slope = _weighted_line(kept, p.min_span_ns)
        # The error of a weighted mean of points each within +-h: about h_eff / sqrt(n),
        # never better than the best single beacon's own bound divided by that.
        h_eff = 1.0 / math.sqrt(sum(1.0 / (h * h) for _, _, h in kept))
        uncertainty = max(1, round(h_eff * (1.0 if len(kept) == 1 else 2.0)))
        return ClockFit(base, a, slope, ref, min(uncertainty, round(min(h for _, _, h in kept))), self.epoch)


def _round_trip(b: ClockBeacon) -> int:
    return b.utc_after_ns - b.utc_before_ns


def _consensus(pts: list[tuple[float, float, float]], p: ClockParams) -> list[tuple[float, float, float]]:
    """The points that agree with the robust trend (Theil-Sen slope, median level).

    A least-squares fit would let one beacon with a tiny round trip but a wrong domain
    reading (the reading thread was preempted) drag every other point; medians do not.
    Plain Python: for the handful of points a fit uses, numpy's per-call cost dominates.
    """
    n = len(pts)
    if n < 3:
        return pts
    xs = [x for x, _, _ in pts]
    ys = [y for _, y, _ in pts]
    slope = 0.0
    if max(xs) - min(xs) >= p.min_span_ns:
        slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(n) for j in range(i + 1, n)
                  if abs(xs[j] - xs[i]) >= _NS]
        if slopes:
            slope = statistics.median(slopes)
    resid = [y - slope * x for x, y in zip(xs, ys, strict=True)]
    center = statistics.median(resid)
    dev = [abs(r - center) for r in resid]
    spread = 3 * 1.4826 * statistics.median(dev)
    kept = [pt for pt, d in zip(pts, dev, strict=True) if d <= max(p.outlier_k * pt[2] + p.floor_ns, spread)]
    return kept or pts


def _weighted_line(pts: list[tuple[float, float, float]], min_span_ns: int) -> tuple[float, float]:
    """Weighted least squares y = a + b x with weights 1/h^2; b = 0 while x spans too little."""
    # Plain Python: for a couple of dozen points it is faster than numpy's per-call cost.
    sw = sx = sy = 0.0
    lo = hi = pts[0][0]
    for x, y, h in pts:
        w = 1.0 / (h * h)
        sw += w
        sx += w * x
        sy += w * y
        lo, hi = min(lo, x), max(hi, x)
    mx, my = sx / sw, sy / sw
    if hi - lo < min_span_ns:
        return my, 0.0
    sxx = sxy = 0.0
    for x, y, h in pts:
        w = 1.0 / (h * h)
        sxx += w * (x - mx) ** 2
        sxy += w * (x - mx) * (y - my)
    slope = sxy / sxx if sxx > 0 else 0.0
    return my - slope * mx, slope


@dataclass(slots=True)
class _Epoch:
    """One epoch of a domain: per fit, the domain time of its beacon, and the fit with its pin."""

    domain_ns: list[int] = field(default_factory=list)
    fits: list[tuple[ClockFit, int]] = field(default_factory=list)
    ended_at: int = 0  # the track's beacon count when a later epoch began


@dataclass(slots=True)
class DomainTrack:
    """A domain's beacons in arrival order with the fit after each, for placing samples
    deterministically: a sample is corrected with the fit of the first beacon read after
    it (interpolation, not extrapolation), which depends only on the beacons' order in
    Kafka, so a replay after a crash places every sample exactly where it was.

    ``position`` of a beacon is its Kafka offset; ``pin`` of a fit is the offset of the
    oldest beacon its window holds: replaying from there rebuilds that same fit.

    After a reset the previous epoch is kept for a while: its stragglers (samples stamped
    before the reset, read after it) are placed with its fits, the ones after its last
    beacon with its last fit. Samples are told apart by domain time, which works when a
    reset steps back further than ``epoch_slack_ns`` (a reboot, a clock that restarts
    from zero); a collector whose clock only steps a little should name each epoch as its
    own domain (``nvml:node-07:boot-3``), which needs no guessing at all.

    >>> t = DomainTrack(ClockParams())
    >>> t.add(ClockBeacon("n", "d", 1_000, 5_000, 5_040), position=7)
    >>> t.fit_for(900, 900)[0].to_utc(900), t.fit_for(900, 900)[1]
    (4920, 7)
    >>> t.fit_for(1_001, 1_001) is None  # no beacon after it yet: wait
    True
    """

    params: ClockParams
    estimator: ClockEstimator = field(init=False)
    epochs: list[_Epoch] = field(default_factory=list)  # oldest first; the last is the current one
    positions: deque[int] = field(default_factory=deque)  # of the beacons in the estimator's window
    added: int = 0  # beacons taken so far: a cheap "anything new?" for callers

    def __post_init__(self) -> None:
        self.estimator = ClockEstimator(self.params)

    def add(self, b: ClockBeacon, position: int) -> None:
        epoch = self.estimator.epoch
        if not self.estimator.add(b):
            return
        if self.estimator.epoch != epoch or not self.epochs:
            if self.epochs:
                self.epochs[-1].ended_at = self.added
            self.epochs.append(_Epoch())
            self.positions.clear()
        self.added += 1
        if len(self.epochs) > 1:
            kept = [e for e in self.epochs[:-1] if self.added - e.ended_at <= self.params.old_epoch_beacons]
            self.epochs = [*kept[-3:], self.epochs[-1]]  # bounded, whatever the reset rate
        self.positions.append(position)
        while len(self.positions) > len(self.estimator.beacons):
            self.positions.popleft()
        fit = self.estimator.fit
        assert fit is not None
        cur = self.epochs[-1]
        cur.domain_ns.append(b.domain_ns)
        cur.fits.append((fit, self.positions[0]))
        if len(cur.fits) > self.params.history:  # bounded: a sample older than this is late anyway
            del cur.domain_ns[0]
            del cur.fits[0]

    def fit_for(self, lo: int, hi: int) -> tuple[ClockFit, int] | None:
        """The fit for samples stamped ``lo``..``hi`` and the offset it pins; None until a
        beacon after them is read (or when no epoch can hold them)."""
        if not self.epochs:
            return None
        slack = self.params.epoch_slack_ns
        cur = self.epochs[-1]
        if cur.domain_ns[0] - slack <= lo and hi <= cur.domain_ns[-1]:
            return cur.fits[bisect.bisect_left(cur.domain_ns, hi)]
        for old in reversed(self.epochs[:-1]):
            if old.domain_ns[0] - slack <= lo and hi <= old.domain_ns[-1] + slack:
                return old.fits[min(bisect.bisect_left(old.domain_ns, hi), len(old.fits) - 1)]
        return None

    @property
    def latest(self) -> ClockFit | None:
        return self.epochs[-1].fits[-1][0] if self.epochs else None

    def pin(self) -> int | None:
        """The oldest beacon offset a replay needs for the fits samples still to come may use."""
        pins = [e.fits[-1][1] for e in self.epochs]
        return min(pins) if pins else None
