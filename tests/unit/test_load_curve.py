"""The load-conditioned norm of the drift rule: healthy FLOPS/W by power band, no extrapolation."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.detect.load_curve import LoadCurve, LoadNorm


def taught(pairs: list[tuple[float, float]], times: int = 3, **kw: float) -> LoadCurve:
    c = LoadCurve(**{"band": 0.03, "cap": 8, "need": 3, "max_bands": 8, **kw})  # type: ignore[arg-type]
    for _ in range(times):
        for p, v in pairs:
            c.accept(p, v)
    return c


def test_it_is_a_load_norm() -> None:
    norm: LoadNorm = LoadCurve(band=0.03, cap=8, need=3)
    assert norm.expected(300.0) is None


def test_a_band_answers_only_once_ready() -> None:
    c = taught([(400.0, 2.0)], times=2)
    assert c.expected(400.0) is None  # 2 of the 3 pairs a band needs
    c.accept(400.0, 2.0)
    assert c.expected(400.0) == 2.0


def test_the_norm_is_the_median_of_a_band_not_its_mean() -> None:
    c = taught([(400.0, 2.0)])
    c.accept(401.0, 100.0)  # one wild tick does not move a median of four
    assert c.expected(400.5) == pytest.approx(2.0, rel=0.05)


def test_close_bands_are_interpolated_linearly_in_power() -> None:
    c = taught([(300.0, 1.0), (318.0, 1.3)])  # two neighbouring 3% bands
    assert c.expected(309.0) == pytest.approx(1.15)
    assert c.expected(300.0) == pytest.approx(1.0)


@pytest.mark.parametrize("power", [150.0, 450.0, 900.0])
def test_no_verdict_where_no_band_is_close(power: float) -> None:
    """Below, above or between bands twice apart, the norm is unknown: the rule judges nothing there."""
    c = taught([(300.0, 1.0), (600.0, 2.0)])
    assert c.expected(power) is None


def test_one_band_answers_within_half_its_width_only() -> None:
    c = taught([(400.0, 2.0)])
    assert c.expected(400.0 * 1.014) == 2.0
    assert c.expected(400.0 * 1.04) is None


@pytest.mark.parametrize("bad", [None, 0.0, -5.0, math.nan, math.inf])
def test_unusable_powers_have_no_norm_and_teach_nothing(bad: float | None) -> None:
    c = taught([(400.0, 2.0)])
    assert c.expected(bad) is None
    if bad is not None:
        c.accept(bad, 5.0)
        c.accept(400.0, math.nan)
    assert len(c) == 1 and c.expected(400.0) == 2.0


def test_bands_are_bounded_and_the_least_recently_taught_goes_first() -> None:
    c = LoadCurve(band=0.03, cap=8, need=3, max_bands=3)
    for i in range(5):
        for _ in range(3):
            c.accept(100.0 * 1.1**i, float(i))
    assert len(c) == 3
    assert c.expected(100.0) is None and c.expected(100.0 * 1.1**4) == 4.0


def test_snapshot_is_json_and_restores_the_same_answers() -> None:
    c = taught([(300.0, 1.0), (318.0, 1.3), (600.0, 2.0)])
    d = LoadCurve(band=0.03, cap=8, need=3, max_bands=8)
    d.load(json.loads(json.dumps(c.snapshot())))
    for p in (300.0, 309.0, 450.0, 600.0, 601.0):
        assert d.expected(p) == c.expected(p)
    c.reset()
    assert len(c) == 0 and c.expected(300.0) is None


@pytest.mark.parametrize("kw", [{"band": 0.0}, {"band": 1.0}, {"need": 0}, {"need": 9}, {"max_bands": 0},
                                {"span": 0.5}])
def test_parameters_are_validated(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LoadCurve(**{"band": 0.03, "cap": 8, "need": 3, **kw})  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(50, 1000), st.floats(0.1, 10)), min_size=1, max_size=60),
       st.floats(30, 1200))
def test_the_norm_never_leaves_the_range_of_what_was_taught(pairs: list[tuple[float, float]], power: float) -> None:
    """Interpolation, never extrapolation: any answer lies between values the GPU has shown."""
    c = taught(pairs, max_bands=12)
    got = c.expected(power)
    if got is not None:
        vals = [v for _, v in pairs]
        assert min(vals) - 1e-9 <= got <= max(vals) + 1e-9
