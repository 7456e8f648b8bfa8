"""Each frame's FLOPS/W in 100 ms buckets (streams.efficiency.subticks): the profile, and bounded memory."""

from __future__ import annotations

import numpy as np
import pytest

from streams.efficiency.subticks import POWER, SM, TENSOR, SubTicks

S = 1_000_000_000
B = 100_000_000


def ts(start_s: float, n: int) -> np.ndarray:
    return (np.arange(n, dtype=np.int64) * B + int(start_s * S) + 5_000_000).astype(np.int64)


def test_without_tensor_activity_the_profile_follows_sm_activity() -> None:
    st = SubTicks(B, S)
    st.add("n", "0", SM, ts(0, 10), np.array([0.6] * 5 + [0.3] * 5))
    st.add("n", "0", POWER, ts(0, 10), np.array([500.0] * 5 + [250.0] * 5))  # the load halves, and its power
    prof = st.profile("n", "0", 0, fpw=1e12, activity=0.45, power=375.0)
    assert prof == pytest.approx([1e12 * (0.6 / 0.45) * (375 / 500)] * 5 + [1e12 * (0.3 / 0.45) * (375 / 250)] * 5)


def test_missing_buckets_and_frames_without_a_fpw_have_none() -> None:
    st = SubTicks(B, S)
    st.add("n", "0", TENSOR, ts(0, 10), np.array([0.5] * 3 + [np.nan] * 7))
    st.add("n", "0", POWER, ts(0, 10), np.full(10, 400.0))
    assert st.profile("n", "0", 0, 1e12, 0.5, 400.0)[3:] == (None,) * 7
    assert st.profile("n", "0", 0, float("nan"), 0.5, 400.0) == (None,) * 10
    assert st.profile("other", "0", 0, 1e12, 0.5, 400.0) == (None,) * 10


def test_closed_ticks_release_their_buckets_and_old_gpus_go() -> None:
    st = SubTicks(B, S, max_series=3)
    for g in range(5):  # beyond max_series the least recently fed GPU goes
        st.add("n", str(g), POWER, ts(0, 30), np.full(30, 300.0))
    assert st.buckets_held() == 3 * 30
    for t in range(2):
        st.release("n", "4", t * S)
    assert st.buckets_held() == 2 * 30 + 10
    st.evict_before(2 * S)
    assert st.buckets_held() == 3 * 10
    st.add("n", "4", POWER, ts(0, 10), np.full(10, 1.0))  # behind the eviction floor: not kept
    assert st.buckets_held() == 3 * 10


def test_a_grid_that_is_not_a_multiple_of_the_bucket_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple"):
        SubTicks(B, 150_000_000)


@pytest.mark.parametrize("batched", [True, False])
def test_release_drops_exactly_the_closed_ticks_whatever_was_held(batched: bool) -> None:
    """Buckets held far ahead (a batched message), late buckets below what was released, a long gap between
    releases: after each release no bucket of a closed tick is left and every later one is."""
    st = SubTicks(B, S)
    n = 100 if batched else 20
    st.add("n", "0", POWER, ts(0, n), np.full(n, 300.0))
    st.release("n", "0", 0)
    assert st.buckets_held() == n - 10
    st.add("n", "0", POWER, ts(0.2, 1), np.full(1, 300.0))  # late: a bucket of the released tick again
    st.release("n", "0", S)
    assert st.buckets_held() == n - 20
    st.add("n", "0", POWER, ts(600, n), np.full(n, 300.0))  # far ahead: the range to the next release is long
    st.release("n", "0", 600 * S)
    assert st.buckets_held() == n - 10
    held = st._series[("n", "0")]
    assert min(held) == (601 * S) // B and max(held) == (600 * S + (n - 1) * B + 5_000_000) // B
