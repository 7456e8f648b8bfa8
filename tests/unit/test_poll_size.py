"""The ingest's poll size (``agents.ingest.poll_size``): turns stay near their target whatever a record costs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agents.ingest.poll_size import TURN_S, PollSize


@given(st.floats(1e-6, 1e-2), st.floats(0.0, 0.05), st.integers(1_000, 50_000))
def test_turns_settle_near_the_target_under_a_backlog(per_record_s: float, fixed_s: float, most: int) -> None:
    """A backlog (every poll full) of records costing ``per_record_s`` each, plus ``fixed_s`` a turn."""
    size = PollSize(most=most)
    turns = []
    for _ in range(12):
        n = size.asked
        seconds = fixed_s + n * per_record_s
        turns.append(seconds)
        size.took(n, seconds)
    settled = turns[-1]
    at_least = fixed_s + size.least * per_record_s
    at_most = fixed_s + most * per_record_s
    # Near the target unless the bounds forbid it (records too dear even at the floor, or cheap even at the ceiling).
    assert settled <= max(TURN_S * 1.5, at_least) and (settled >= TURN_S * 0.5 or size.asked == most), turns
    assert settled <= at_most


def test_a_price_rise_shrinks_the_polls_within_turns_and_live_polls_leave_them() -> None:
    size = PollSize(most=20_000)
    size.took(20_000, 6.0)  # 300 us a record (messages of 1,000 samples, or a profiler attached)
    assert size.asked == 10_000  # halved at most a turn: an outlier does not collapse it
    size.took(10_000, 3.0)
    size.took(5_000, 1.5)
    assert size.asked == 2_500
    size.took(2_500, 0.75)
    assert size.asked == 1_666
    for _ in range(10):
        size.took(12, 0.004)  # live: a few records a poll, whatever they cost
    size.took(0, 1.8)  # a turn that only closed cells earlier polls brought
    assert size.asked == 1_666
    size.took(1_666, 0.0833)  # the backlog again, cheaper: it doubles at most per turn
    assert size.asked == 3_332
