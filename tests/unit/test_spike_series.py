"""A spike series' storage: whichever way a purge drops buckets (popping the released ones or rebuilding what is
kept), it keeps exactly the buckets at or past the cut, and their dropped counts; buckets held in the mirror alone
give the same answers as buckets held in ``vals`` too."""

from __future__ import annotations

import json
import random

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.detect.spike_rule import SpikeParams
from streams.detect.spike_series import BucketSeries
from streams.detect.spikes import SpikeEngine

S = 1_000_000_000


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


def _eager(self: BucketSeries, b: npt.NDArray[np.int64], v: npt.NDArray[np.float64]) -> None:
    """What the feed did before buckets were held in the mirror alone: every bucket in ``vals`` too."""
    self.vals.update(zip(b.tolist(), ([x] for x in v.tolist()), strict=True))
    self.add_chunk(b, v)


def _run(seed: int) -> list[object]:
    """A random life of three series: batched and small messages, some late or out of order, peaks read as ticks
    close, releases, evictions and a snapshot round trip; everything the engine answers, in order."""
    rng = random.Random(seed)
    eng = SpikeEngine(SpikeParams(), S)
    said: list[object] = []
    now = {g: 0 for g in "abc"}
    closed = 0
    for _ in range(60):
        g = rng.choice("abc")
        n = rng.choice([1, 4, 40, 100, 150])
        start = now[g] - (rng.choice([0, 0, 0, 3 * S]) if n < 10 else 0)  # small late messages now and then
        ts = start + np.arange(n, dtype=np.int64) * (S // 10) + rng.randrange(0, 9 * S // 100)
        if rng.random() < 0.1:
            ts = ts[::-1].copy()  # out of order within a message
        vs = np.array([rng.choice([40.0, 60.0, 99.0, float("nan")]) for _ in range(n)])
        eng.add("n", g, "gpu_util", ts, vs)
        now[g] = max(now[g], int(ts.max()) + S // 10)
        while closed * S + 2 * S <= min(now.values()):
            ticks = [closed * S] * 3
            said.append(eng.close_ticks(["n"] * 3, list("abc"), "gpu_util", ticks).tolist())
            closed += 1
        if rng.random() < 0.05:
            eng.evict_before(max(0, closed - 1) * S)
        if rng.random() < 0.05:
            eng = SpikeEngine.restore(SpikeParams(), S, json.loads(json.dumps(eng.snapshot())))
        said.append(eng.tick_peak("n", rng.choice("abc"), "gpu_util", max(0, closed - rng.randint(0, 3)) * S))
    said += [eng.values_held(), eng.buckets_held(), eng.late_samples]
    return said


@pytest.mark.parametrize("seed", range(30))
def test_buckets_held_in_the_mirror_alone_answer_as_if_every_bucket_were_in_vals(seed: int,
                                                                                 monkeypatch: pytest.MonkeyPatch
                                                                                 ) -> None:
    lazy = _run(seed)
    monkeypatch.setattr(BucketSeries, "hold_mirrored", _eager)
    assert lazy == _run(seed)
