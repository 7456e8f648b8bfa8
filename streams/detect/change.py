"""Change detectors: River's drift detectors behind a small Protocol of ours.

Only this module touches River (its drift API changed between releases; the project
pins 0.26 in ``pyproject.toml``). A detector says whether a sample completes a
detected change; it never raises an alert by itself (``streams.detect.drift`` confirms).

Both wrappers reset the River object as soon as it reports a change. River would
reset it on the next ``update`` anyway; doing it at once means a snapshot never holds
a pending "detected" flag, so ``snapshot``/``restore`` carry plain numbers only.

>>> ph = make_detector("page_hinkley", delta=0.01, threshold=0.3, min_instances=10)
>>> [i for i, x in enumerate([1.0] * 50 + [0.8] * 10) if ph.update(x)]
[51]
"""

from __future__ import annotations

import base64
import math
from typing import Any, Literal, Protocol


def _river_drift() -> Any:
    """River's drift module, imported at the first detector: it loads all of scipy.stats (~0.7 s), which
    every CLI command and an ingest-only worker would otherwise pay at start.

    Any: River 0.26 annotates some of these signatures and not others, and strict mypy would reject
    each call; the tests pin the behaviour instead."""
    from river import drift

    return drift


class ChangeDetector(Protocol):
    def update(self, x: float) -> bool:
        """Feed one sample; True when this sample completes a detected change."""
        ...

    def reset(self) -> None:
        """Forget everything seen so far."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """The state as JSON-able plain data (parameters excluded: they come from the caller)."""
        ...

    def load(self, snap: dict[str, Any]) -> None:
        """Replace the state with one from ``snapshot`` of a detector with the same parameters."""
        ...


class PageHinkleyDown:
    """Page-Hinkley test for a fall in the mean, without fading.

    ``alpha=1.0`` because River's default forgetting factor (0.9999) turns the
    cumulative sum into an AR(1) process whose spread grows to ``sigma / sqrt(2 (1 -
    alpha))`` (about 70 sigma): after ~10^4 samples of a stationary noisy stream its
    swings exceed any threshold scaled to the signal and it false-alarms, which on a
    stream that runs for days means forever (see ``tests/unit/test_change.py``).

    >>> d = PageHinkleyDown(delta=0.01, threshold=0.3, min_instances=10)
    >>> [d.update(1.0) for _ in range(3)]
    [False, False, False]
    >>> d2 = PageHinkleyDown(delta=0.01, threshold=0.3, min_instances=10)
    >>> d2.load(d.snapshot()); d2.snapshot() == d.snapshot()
    True
    """

    def __init__(self, delta: float = 0.01, threshold: float = 0.3, min_instances: int = 10) -> None:
        self.check(delta, threshold, min_instances)
        self.delta, self.threshold, self.min_instances = delta, threshold, min_instances
        self._ph = self._new()

    @staticmethod
    def check(delta: float, threshold: float, min_instances: int) -> None:
        """Raise what the constructor would for these parameters, without importing River."""
        if delta < 0 or threshold <= 0 or min_instances < 1:
            raise ValueError("PageHinkleyDown needs delta >= 0, threshold > 0, min_instances >= 1")

    def _new(self) -> Any:  # River 0.26's drift classes are only partly annotated
        return _river_drift().PageHinkley(min_instances=self.min_instances, delta=self.delta,
                                          threshold=self.threshold, alpha=1.0, mode="down")

    def update(self, x: float) -> bool:
        self._ph.update(x)
        fired = bool(self._ph.drift_detected)
        if fired:
            self.reset()
        return fired

    def reset(self) -> None:
        self._ph = self._new()

    def snapshot(self) -> dict[str, Any]:
        # River 0.26's PageHinkley state: a running mean and four sums. The minimum starts
        # at +inf (not JSON), which is written as None.
        ph = self._ph
        low = ph._min_increase
        return {"n": ph._x_mean.n, "mean": ph._x_mean._mean, "inc": ph._sum_increase, "dec": ph._sum_decrease,
                "min_inc": None if math.isinf(low) else low, "max_dec": ph._max_decrease}

    def load(self, snap: dict[str, Any]) -> None:
        ph = self._new()
        ph._x_mean.n = float(snap["n"])
        ph._x_mean._mean = float(snap["mean"])
        ph._sum_increase = float(snap["inc"])
        ph._sum_decrease = float(snap["dec"])
        ph._min_increase = math.inf if snap["min_inc"] is None else float(snap["min_inc"])
        ph._max_decrease = float(snap["max_dec"])
        self._ph = ph


class AdwinDetector:
    """ADWIN, checking for a cut at every sample.

    ``clock=1`` because River's default (32) tests the window only every 32 samples: at
    a 1 s grid a change could wait half a minute to be seen, far past the 3 s hold.

    >>> d = AdwinDetector()
    >>> [i for i, x in enumerate([1.0, 1.02] * 50 + [0.5] * 40) if d.update(x)]
    [126]
    """

    def __init__(self, delta: float = 0.002) -> None:
        self.check(delta)
        self.delta = delta
        self._ad = self._new()

    @staticmethod
    def check(delta: float) -> None:
        """Raise what the constructor would for this ``delta``, without importing River."""
        if not 0 < delta < 1:
            raise ValueError("AdwinDetector needs 0 < delta < 1")

    def _new(self) -> Any:
        return _river_drift().ADWIN(delta=self.delta, clock=1)

    def update(self, x: float) -> bool:
        self._ad.update(x)
        fired = bool(self._ad.drift_detected)
        if fired:
            self.reset()
        return fired

    def reset(self) -> None:
        self._ad = self._new()

    def snapshot(self) -> dict[str, Any]:
        # The window lives in River's Rust helper, which serialises itself to bytes
        # (pickle of the Python object fails in 0.26); base64 keeps it JSON-able.
        return {"window": base64.b64encode(self._ad._helper.__getstate__()).decode("ascii")}

    def load(self, snap: dict[str, Any]) -> None:
        ad = self._new()
        ad._helper.__setstate__(base64.b64decode(snap["window"]))
        self._ad = ad


_KINDS: dict[str, type[PageHinkleyDown] | type[AdwinDetector]] = {
    "page_hinkley": PageHinkleyDown, "adwin": AdwinDetector}


def make_detector(kind: Literal["page_hinkley", "adwin"], **params: Any) -> ChangeDetector:
    """A detector by name; ``params`` go to its constructor.

    >>> type(make_detector("adwin", delta=0.01)).__name__
    'AdwinDetector'
    """
    return _kind(kind)(**params)


def check_detector(kind: str, **params: Any) -> None:
    """Raise the ``ValueError`` (or ``TypeError``) ``make_detector`` would, without building a detector: River,
    imported at the first one, pulls in scipy.stats (~0.7 s), which validating settings should not cost.

    >>> check_detector("adwin", delta=2.0)
    Traceback (most recent call last):
    ...
    ValueError: AdwinDetector needs 0 < delta < 1
    """
    _kind(kind).check(**params)


def _kind(kind: str) -> type[PageHinkleyDown] | type[AdwinDetector]:
    if kind not in _KINDS:
        raise ValueError(f"unknown detector {kind!r}: expected 'page_hinkley' or 'adwin'")
    return _KINDS[kind]
