"""Property tests of the aligner: arrival order, duplicates, and conservation of samples."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.catalog import CATALOG
from streams.align.aggregate import _cells
from streams.align.aligner import AlignParams, Frame, GridAligner
from tests.oracle import Series, oracle
from tests.unit.test_align import GRID, T0, as_rows, assert_same, make_samples

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


IDLE = 10 * GRID  # the idle bound of the burst tests
STEP_IDLE = GRID // 2  # and that of the per-step streams


def burst_schedule(rng: random.Random, samples: dict[Series, list[tuple[int, float]]], cuts: list[int],
                   chunk: int) -> list[tuple[int, list[tuple[Series, list[tuple[int, float]]]]]]:
    """Per burst (event time [cuts[k], cuts[k+1])), each topic's messages in the order its
    collector publishes them: each series in order, chunks sorted by their first stamp."""
    out = []
    for lo, hi in itertools.pairwise(cuts):
        topics: dict[int, list[tuple[int, float, Series, list[tuple[int, float]]]]] = {}
        for key, pts in samples.items():
            part = [p for p in pts if lo <= p[0] < hi]
            for i in range(0, len(part), chunk):
                msg = part[i:i + chunk]
                topics.setdefault(key[2], []).append((msg[0][0], rng.random(), key, msg))
        for si, msgs in sorted(topics.items()):
            out.append((si, [(key, msg) for _, _, key, msg in sorted(msgs)]))
    return out


@pytest.mark.parametrize("forget", [False, True])
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 100_000), bursts=st.integers(1, 4), chunk=st.sampled_from([1, 5, 20]))
def test_bursts_in_any_topic_order_poll_cut_and_caught_up_state_give_the_oracle_frames(
        forget: bool, seed: int, bursts: int, chunk: int) -> None:
    """Bursts of whole seconds; within one, each topic lands at its own moment within its idle
    bound and is read in arbitrary polls; quiet clocks run or stand still at random. A per-step
    topic's bound is the short one, and its bursts come after a rest (``streams.align.holds``).
    With ``forget``, a node quiet for the idle bound between bursts is forgotten (``streams.align.forget``:
    in about half the examples) and comes back as a new node: the frames are the same."""
    rng = random.Random(seed)
    seconds = rng.randint(bursts, 12 * bursts)
    samples = make_samples(rng, nodes=2, gpus=rng.randint(1, 2), seconds=seconds)
    used = rng.sample(sorted({k[2] for k in samples}), rng.randint(2, 6))
    samples = {k: v for k, v in samples.items() if k[2] in used}
    bound = {si: STEP_IDLE if CATALOG[si].cadence == "step" else IDLE for si in used}
    least = min(bound.values())
    cuts = [T0, *sorted(rng.sample(range(T0 + GRID, T0 + seconds * GRID, GRID), bursts - 1)), T0 + seconds * GRID]
    per_burst: dict[int, list[tuple[int, list[tuple[Series, list[tuple[int, float]]]]]]] = {}
    for i, item in enumerate(burst_schedule(rng, samples, cuts, chunk)):
        per_burst.setdefault(i // len(used), []).append(item)
    aligner = GridAligner(AlignParams(allowed_lateness_ns=LATENESS, idle_ns=IDLE, step_idle_ns=STEP_IDLE,
                                      forget_ns=IDLE if forget else 3600 * GRID))
    aligner.expect([*used, 99])  # 99: a topic of the assignment that never delivers
    quiet = {s: 0 for s in [*used, 99]}
    frames: list[Frame] = []
    late: list[object] = []
    now, pos = rng.randrange(3 * IDLE), 0

    def step(dt: int, delivered: set[int], caught_up: bool = False) -> None:
        nonlocal now
        now += dt
        for s in quiet:  # a source's clock runs while "caught up": here, whenever it likes
            if s not in delivered and (caught_up or rng.random() < 0.7):
                quiet[s] += dt
        adv = aligner.advance(T0 + now, quiet_ns=quiet)  # the wall clock near the event times: live, at times
        frames.extend(adv.frames.frames())
        late.extend(adv.late)

    for k in sorted(per_burst):
        if least < IDLE:
            step(least, set(), caught_up=True)  # a burst follows a rest
        start = now
        queues = {si: (start + rng.randrange(bound[si] * 9 // 10), list(msgs)) for si, msgs in per_burst[k]}
        last = {si: 0 for si in queues}
        while any(q for _, q in queues.values()):
            delivered = set()
            for si, (lands, q) in queues.items():
                if now < lands or not q:
                    continue
                # A random prefix of what is left; never quiet for more than half the bound.
                n = rng.randint(0 if now - last[si] < bound[si] // 2 else 1, len(q))
                for key, msg in q[:n]:
                    aligner.add(key[0], key[1], key[2], [t for t, _ in msg], [v for _, v in msg], source=si,
                                position=pos)
                    pos += 1
                del q[:n]
                if n:
                    delivered.add(si)
                    last[si] = now
            step(rng.randrange(least // 4), delivered)
        for _ in range(rng.randint(0, 3)):  # quiet between bursts, perhaps past the bound
            step(rng.randrange(2 * IDLE), set())
    done = aligner.flush_all()
    assert late == [] and done.late == []
    assert_same(as_rows(frames + done.frames.frames()), oracle(samples))


@given(st.lists(st.integers(0, 5_000), max_size=300), st.sampled_from([5_001, 10**9]))
def test_the_pivot_finds_the_cells_numpys_unique_finds(keys: list[int], size: int) -> None:
    """By table (a key range near the keys' count) or by sorting (a wide one), the same cells and rows."""
    arr = np.array(keys, np.int64)
    want_u, want_inv = np.unique(arr, return_inverse=True)
    got_u, got_inv = _cells(arr, size)
    assert got_u.tolist() == want_u.tolist() and got_inv.tolist() == want_inv.reshape(-1).tolist()
