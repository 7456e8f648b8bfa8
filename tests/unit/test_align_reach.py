"""A stream's reach (``streams.align.holds``): it holds its node's watermark at its newest sample plus its sampling
period (never past the node's newest event time), so a tick does not wait a period more for each slow stream; no
sample within the lateness of its node's newest event time becomes late."""

from __future__ import annotations

import statistics

from schemas.catalog import BY_NAME
from streams.align.aligner import AlignParams, GridAligner
from streams.sim.simulate import ClusterSimulator, SimParams
from tests.unit.test_align import GRID, T0, out

MS = 1_000_000
LATENESS = 2 * GRID
PARAMS = AlignParams(allowed_lateness_ns=LATENESS)
POWER, HOST = BY_NAME["power"].index, BY_NAME["host_cpu_util"].index


def test_a_live_clusters_ticks_close_once_the_lateness_has_passed_not_a_1hz_period_later() -> None:
    # The simulator's cluster in real time, 100 ms steps: NVML streams at 10 Hz, host and inference-server streams
    # at 1 Hz, each at its own phase. Waiting for every 1 Hz stream's sample past the tick's end plus the lateness
    # made each tick close about a second after that (1.02 s for every tick here, before the reach).
    start = T0 + 123 * MS
    sim = ClusterSimulator(SimParams(nodes=2, gpus=4, seed=5, start_ns=start, steady=True))
    a = GridAligner(PARAMS)
    now, delays, late = start, [], 0
    for step in range(400):
        now += 100 * MS
        for b in sim.advance(now):
            si = BY_NAME[b.sensor].index
            a.add(b.node, b.gpu, si, b.ts_ns, b.value, b.labels, si, step)
        adv = a.advance(now, None, {si: now - start for si in range(len(BY_NAME))})  # all caught up
        late += sum(len(x.indices) for x in adv.late)
        delays += [(now - tick - GRID - LATENESS) / GRID for tick in {f.tick_ns for f in out(adv)}
                   if tick >= start + 5 * GRID]  # from the first samples, each stream measures its period
    assert late == 0 and len(delays) >= 30
    # Within a step or two: the node's newest sample must pass the tick's end plus the lateness (a 10 Hz stream's
    # next sample), now and then a step more (the per-step streams' jitter).
    assert statistics.median(delays) < 0.15 and max(delays) < 0.3, sorted(delays)


def hz1(a: GridAligner, seconds: range, phase_ms: int = 0) -> None:
    """A 10 Hz GPU stream and a 1 Hz host stream of node n, live: each sample in a message of its own."""
    for i in seconds:
        for j in range(10):
            a.add("n", "0", POWER, [T0 + i * GRID + j * 100 * MS], [300.0], source="p", position=i * 10 + j)
        a.add("n", "host", HOST, [T0 + i * GRID + phase_ms * MS], [50.0], source="h", position=i)


def test_a_1hz_stream_reaches_a_second_past_its_newest_sample() -> None:
    a = GridAligner(PARAMS)
    hz1(a, range(10), phase_ms=100)  # host samples at 0.1, 1.1, ... 9.1 s
    a.advance(now_ns=T0 + 10 * GRID)
    # The host stream reaches 9.1 + 1 = 10.1 s, the 10 Hz stream 10.0 s, past the node's newest sample (9.9 s): the
    # watermark is 9.9 - 2 s, where the host stream alone held it at 9.1 - 2 s before the reach.
    assert a.watermark("n") == T0 + 7_900 * MS


def test_a_sample_in_time_order_sooner_than_its_period_is_not_late() -> None:
    a = GridAligner(PARAMS)
    hz1(a, range(10), phase_ms=900)
    adv = a.advance(now_ns=T0 + 10 * GRID)
    assert max(f.tick_ns for f in out(adv)) == T0 + 6 * GRID  # the watermark: the node's newest, 9.9 s, - 2 s
    # The host collector restarts at another phase: its next sample comes 0.2 s after its last, not 1 s.
    a.add("n", "host", HOST, [T0 + 10_100 * MS], [51.0], source="h", position=10)
    adv = a.advance(now_ns=T0 + 10_200 * MS)
    assert adv.late == []
    assert [f.count("n_host_cpu_util") for f in out(a.flush_all())][-1] == 1  # tick 10: the sample is in it


def test_a_sample_within_the_lateness_of_its_nodes_newest_is_never_late() -> None:
    a = GridAligner(PARAMS)
    hz1(a, range(12))  # host samples at whole seconds up to 11 s: it reaches 12 s, the GPU stream 12 s
    a.advance(now_ns=T0 + 12 * GRID)
    assert a.watermark("n") == T0 + 9_900 * MS  # the node's newest sample, 11.9 s, - 2 s: ticks up to 8 are written
    a.add("n", "host", HOST, [T0 + 9_950 * MS], [1.0], source="h", position=12)  # 1.95 s behind the node: kept
    a.add("n", "host", HOST, [T0 + 8_950 * MS], [1.0], source="h", position=13)  # tick 8: late, out of its order
    adv = a.advance(now_ns=T0 + 12 * GRID)
    assert [(x.position, x.why) for x in adv.late] == [(13, "disorder")]
