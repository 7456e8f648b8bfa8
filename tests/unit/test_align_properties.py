"""Property tests of the aligner: arrival order, duplicates, and conservation of samples."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.align import AlignParams, Frame, GridAligner
from tests.oracle import Series, oracle
from tests.unit.test_align import GRID, as_rows, assert_same, make_samples

LATENESS = 2 * GRID


def arrivals(samples: dict[Series, list[tuple[int, float]]], rng: random.Random, max_delay: int) -> list[tuple[tuple[str, str, int], int, float]]:
    """Single samples in the order they would arrive if each were delayed by up to ``max_delay``."""
    flat = [(k, t, v) for k, pts in samples.items() for t, v in pts]
    keyed = [(t + rng.randrange(max_delay + 1), i) for i, (_, t, _) in enumerate(flat)]
    return [flat[i] for _, i in sorted(keyed)]


def run(aligner: GridAligner, order: list[tuple[tuple[str, str, int], int, float]], every: int = 7) -> tuple[list[Frame], int]:
    frames: list[Frame] = []
    late = 0
    for i, ((node, gpu, si), t, v) in enumerate(order):
        aligner.add(node, gpu, si, [t], [v], source=si, position=i)
        if i % every == 0:
            adv = aligner.advance(now_ns=0)
            frames += adv.frames.frames()
            late += sum(len(x.indices) for x in adv.late)
    adv = aligner.flush_all()
    return frames + adv.frames.frames(), late + sum(len(x.indices) for x in adv.late)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 100_000))
def test_disorder_within_the_lateness_gives_the_in_order_frames(seed: int) -> None:
    rng = random.Random(seed)
    samples = make_samples(rng, nodes=2, gpus=1, seconds=5)
    frames, late = run(GridAligner(AlignParams(allowed_lateness_ns=LATENESS)), arrivals(samples, rng, LATENESS))
    assert late == 0
    assert_same(as_rows(frames), oracle(samples))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 100_000))
def test_exact_duplicates_count_once(seed: int) -> None:
    rng = random.Random(seed)
    samples = make_samples(rng, nodes=1, gpus=1, seconds=4)
    order = arrivals(samples, rng, GRID // 2)
    doubled = [x for x in order for _ in range(rng.choice([1, 1, 2, 3]))]
    frames, late = run(GridAligner(AlignParams(allowed_lateness_ns=LATENESS)), doubled)
    assert late == 0
    assert_same(as_rows(frames), oracle(samples))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 100_000), delay_s=st.integers(0, 8))
def test_every_sample_is_in_exactly_one_frame_or_late(seed: int, delay_s: int) -> None:
    rng = random.Random(seed)
    samples = make_samples(rng, nodes=2, gpus=1, seconds=6)
    order = arrivals(samples, rng, delay_s * GRID)  # disorder beyond the lateness: some must be late
    frames, late = run(GridAligner(AlignParams(allowed_lateness_ns=GRID // 2)), order, every=3)
    placed = sum(sum(f.counts) for f in frames)
    assert placed + late == len(order)
    keys = [(f.node, f.gpu, f.tick_ns) for f in frames]
    assert len(keys) == len(set(keys))
