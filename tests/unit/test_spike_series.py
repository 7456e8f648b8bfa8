"""A spike series' purge: whichever way it drops buckets (popping the released ones or rebuilding what is kept), it
keeps exactly the buckets at or past the cut, and their dropped counts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.detect.spike_series import BucketSeries


def _series(buckets: list[int]) -> BucketSeries:
    s = BucketSeries()
    for b in buckets:
        s.vals[b] = [float(b)]
        if b % 3 == 0:
            s.dropped[b] = 1
    s.lowest = min(buckets, default=2**62)
    s.newest = max(buckets, default=-(2**62))
    return s


@given(st.lists(st.integers(0, 5_000), unique=True, max_size=300), st.integers(-10, 6_000))
def test_purge_keeps_exactly_the_buckets_from_the_cut(buckets: list[int], keep_from: int) -> None:
    s = _series(buckets)
    s.purge(keep_from)
    kept = sorted(b for b in buckets if b >= keep_from)
    assert sorted(s.vals) == kept
    assert sorted(s.dropped) == [b for b in kept if b % 3 == 0]
    if kept and keep_from > min(buckets):
        assert s.lowest <= kept[0]


def test_a_poll_that_closes_many_ticks_pops_and_a_gap_of_hours_rebuilds() -> None:
    near = _series(list(range(1_000, 1_400)))
    near.purge(1_150)  # 150 released of 400 held: popped
    assert min(near.vals) == 1_150 and len(near.vals) == 250 and near.lowest == 1_150
    far = _series([*range(1_000, 1_010), 90_000])
    far.purge(80_000)  # a range of 79,000 buckets against 11 held: rebuilt
    assert list(far.vals) == [90_000] and far.lowest == 90_000 and far.cut == 80_000
