"""Node churn: the aligner forgets nodes that went away (``streams.align.forget``) and its frames do not change."""

from __future__ import annotations

import pickle

import pytest

from streams.align.aligner import AlignParams, Frame, GridAligner
from tests.oracle import oracle
from tests.unit.test_align import GRID, T0, as_rows, assert_same

POWER, ECC = 4, 11  # a gauge and a counter
STEP = GRID // 4
PARAMS = AlignParams(allowed_lateness_ns=GRID, idle_ns=2 * GRID, forget_ns=4 * GRID)
NEVER = AlignParams(allowed_lateness_ns=GRID, idle_ns=2 * GRID, forget_ns=10**18, remember_ns=10**18)

Series = tuple[str, str, int]


def churn_schedule(nodes: int, stay_s: int, every_s: int) -> list[tuple[int, Series, float]]:
    """Node ``n`` sends power and an ECC counter for 2 GPUs, 4 samples a second, during ``stay_s`` seconds from
    ``n * every_s``; then it is gone. Sorted by event time."""
    out = []
    for n in range(nodes):
        start = T0 + n * every_s * GRID
        for i in range(stay_s * GRID // STEP):
            t = start + i * STEP
            for gpu in ("0", "1"):
                out.append((t, (f"node-{n:04d}", gpu, POWER), 200.0 + (n * 7 + i) % 90))
                out.append((t + 1, (f"node-{n:04d}", gpu, ECC), float(n + i // 3)))
    return sorted(out)


def run(aligner: GridAligner, schedule: list[tuple[int, Series, float]], tail_s: int = 10
        ) -> tuple[list[Frame], int, list[int]]:
    """Feed one sample at a time, advancing live (the wall clock at event time) every quarter second; the
    node count the aligner holds after each advance."""
    frames: list[Frame] = []
    late, held = 0, []
    next_advance = T0
    end = schedule[-1][0] + tail_s * GRID
    i = 0
    while next_advance <= end:
        while i < len(schedule) and schedule[i][0] < next_advance:
            t, (node, gpu, si), v = schedule[i]
            aligner.add(node, gpu, si, [t], [v], source=si, position=i)
            i += 1
        adv = aligner.advance(now_ns=next_advance)
        frames += adv.frames.frames()
        late += sum(len(x.indices) for x in adv.late)
        held.append(len(aligner.closed_ticks()))
        next_advance += STEP
    done = aligner.flush_all()
    return frames + done.frames.frames(), late, held


def test_under_churn_the_nodes_held_stay_few_and_the_frames_are_those_of_an_aligner_that_never_forgets() -> None:
    schedule = churn_schedule(nodes=120, stay_s=5, every_s=2)
    frames, late, held = run(GridAligner(PARAMS), schedule)
    kept_frames, kept_late, kept_held = run(GridAligner(NEVER), schedule)
    assert late == kept_late == 0
    assert as_rows(frames) == as_rows(kept_frames)
    samples: dict[Series, list[tuple[int, float]]] = {}
    for t, key, v in schedule:
        samples.setdefault(key, []).append((t, v))
    assert_same(as_rows(frames), oracle(samples))
    assert max(kept_held) == 120  # never forgetting: every node ever seen
    assert max(held) <= 12  # ~3 live at a time, and those quiet for forget_ns until enough of them can go


def test_a_node_that_comes_back_keeps_its_written_ticks_final_and_its_counter_continuous() -> None:
    first = [(t, k, v) for t, k, v in churn_schedule(nodes=1, stay_s=6, every_s=0)]
    back_at = T0 + 30 * GRID  # quiet 24 s: forgotten after 4
    again = [(t + 30 * GRID, k, v + 100.0 if k[2] == ECC else v) for t, k, v in first]
    old = [(back_at + GRID, ("node-0000", "0", POWER), 250.0), (back_at + GRID + 2, ("node-0000", "0", ECC), 1.0)]

    def feed(aligner: GridAligner) -> tuple[list[Frame], list[int], GridAligner]:
        frames, late = [], []
        for i, (t, (node, gpu, si), v) in enumerate(first):
            aligner.add(node, gpu, si, [t], [v], source=si, position=i)
        for now in range(T0, back_at, STEP):
            frames += aligner.advance(now_ns=now).frames.frames()
        if aligner.params.forget_ns == PARAMS.forget_ns:
            assert aligner.closed_ticks() == {} and aligner.forgotten == 1
        aligner = pickle.loads(pickle.dumps(aligner))  # a snapshot keeps what it remembers
        # It comes back with samples of ticks written before it went away: late, not written twice.
        for t, (node, gpu, si), v in old:
            aligner.add(node, gpu, si, [t - 30 * GRID], [v], source=si, position=0)
        adv = aligner.advance(now_ns=back_at)
        late = [len(x.indices) for x in adv.late]
        frames += adv.frames.frames()
        for i, (t, (node, gpu, si), v) in enumerate(again):
            aligner.add(node, gpu, si, [t], [v], source=si, position=i)
        frames += aligner.advance(now_ns=back_at + 3 * GRID).frames.frames()
        frames += aligner.flush_all().frames.frames()
        return frames, late, aligner

    frames, late, aligner = feed(GridAligner(PARAMS))
    kept_frames, kept_late, _ = feed(GridAligner(NEVER))
    assert late == kept_late == [1, 1]
    assert as_rows(frames) == as_rows(kept_frames)
    ecc = [v for t, k, v in first if k == ("node-0000", "0", ECC)]
    back = [v for t, k, v in again if k == ("node-0000", "0", ECC) and t < back_at + GRID]
    # Counted from the last value before the node went away (7 -> 100), not from its first value back.
    assert as_rows(frames)[("node-0000", "0", back_at)]["ecc_errors"] == back[-1] - ecc[-1] == 94.0
    assert aligner.forgotten == 2  # back with late samples only, it had nothing open: forgotten again at once


def test_forgotten_nodes_are_remembered_for_remember_ns_of_event_time_only() -> None:
    params = AlignParams(allowed_lateness_ns=GRID, idle_ns=2 * GRID, forget_ns=4 * GRID, remember_ns=20 * GRID)
    schedule = churn_schedule(nodes=20, stay_s=3, every_s=3)
    aligner = GridAligner(params)
    run(aligner, schedule[: len(schedule) // 2], tail_s=0)
    run(aligner, schedule[len(schedule) // 2:])
    assert aligner.forgotten >= 15
    assert aligner.nodes_remembered() <= 10  # the rest were dropped 20 s of event time after they went quiet


@pytest.mark.parametrize(("forget_s", "remember_s"), [(1, 10), (30, 10)])
def test_forgetting_sooner_than_the_idle_bound_or_remembering_less_is_refused(forget_s: int, remember_s: int) -> None:
    with pytest.raises(ValueError, match="forget_ns"):
        AlignParams(idle_ns=2 * GRID, forget_ns=forget_s * GRID, remember_ns=remember_s * GRID)
