"""The River wrappers: why alpha=1 and clock=1, detection, reset and snapshot round trips."""

from __future__ import annotations

import json
from typing import Any, Literal

import numpy as np
import pytest
from river import drift

from streams.detect.change import AdwinDetector, ChangeDetector, PageHinkleyDown, make_detector

Kind = Literal["page_hinkley", "adwin"]
PH: dict[str, Any] = {"delta": 0.01, "threshold": 0.3, "min_instances": 10}  # the drift defaults
RIVER_PH: Any = drift.PageHinkley  # River 0.26 is only partly annotated
RIVER_ADWIN: Any = drift.ADWIN


def stationary(seed: int, n: int = 100_000, noise: float = 0.02) -> list[float]:
    xs: list[float] = (1.0 + np.random.default_rng(seed).normal(0.0, noise, n)).tolist()
    return xs


def test_default_fading_false_alarms_on_a_long_stationary_stream_and_ours_does_not() -> None:
    xs = stationary(seed=1)
    river_default = RIVER_PH(mode="down", **PH)  # alpha = 0.9999
    ours = PageHinkleyDown(**PH)
    default_alarms, our_alarms = [], []
    for i, x in enumerate(xs):
        river_default.update(x)
        if river_default.drift_detected:
            default_alarms.append(i)
        if ours.update(x):
            our_alarms.append(i)
    # Faded sums swing ~70 sigma once ~10^4 samples are in: alarms every ~10^4 samples.
    assert len(default_alarms) >= 5 and default_alarms[0] > 5_000
    assert our_alarms == []


def test_page_hinkley_finds_a_drop_within_a_few_samples() -> None:
    xs = stationary(seed=2, n=500)
    xs += [0.85 * x for x in stationary(seed=3, n=50)]
    d = PageHinkleyDown(**PH)
    fired = [i for i, x in enumerate(xs) if d.update(x)]
    assert fired and 500 <= fired[0] <= 504


def test_adwin_checks_every_sample() -> None:
    xs = stationary(seed=4, n=600) + [0.85 * x for x in stationary(seed=5, n=200)]
    d = AdwinDetector()
    ours = [i for i, x in enumerate(xs) if d.update(x)]
    default = RIVER_ADWIN()  # clock=32: looks only every 32 samples
    seen = []
    for i, x in enumerate(xs):
        default.update(x)
        if default.drift_detected:
            seen.append(i)
    assert ours and seen and ours[0] < seen[0]
    assert seen[0] % 32 == 31  # the default's checks land on its clock


@pytest.mark.parametrize("kind", ["page_hinkley", "adwin"])
def test_snapshot_round_trips_through_json_and_continues_identically(kind: Kind) -> None:
    params = PH if kind == "page_hinkley" else {"delta": 0.002}
    xs = stationary(seed=6, n=400) + [0.8 * x for x in stationary(seed=7, n=100)] + stationary(seed=8, n=300)
    for cut in (0, 1, 250, 420, 700):
        a: ChangeDetector = make_detector(kind, **params)
        first = [a.update(x) for x in xs[:cut]]
        b: ChangeDetector = make_detector(kind, **params)
        b.load(json.loads(json.dumps(a.snapshot())))
        assert [a.update(x) for x in xs[cut:]] == [b.update(x) for x in xs[cut:]], cut
        assert len(first) == cut


@pytest.mark.parametrize("kind", ["page_hinkley", "adwin"])
def test_reset_forgets(kind: Kind) -> None:
    d = make_detector(kind)
    fresh = d.snapshot()
    for x in stationary(seed=9, n=100):
        d.update(x)
    assert d.snapshot() != fresh
    d.reset()
    assert d.snapshot() == fresh


def test_bad_parameters_fail_clearly() -> None:
    with pytest.raises(ValueError, match="unknown detector"):
        make_detector("cusum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="threshold > 0"):
        PageHinkleyDown(threshold=0)
    with pytest.raises(ValueError, match="delta < 1"):
        AdwinDetector(delta=2)
