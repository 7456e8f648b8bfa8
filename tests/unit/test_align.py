"""Alignment: streaming frames equal a batch computation over the same samples."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.catalog import BY_NAME, CATALOG
from schemas.records import Labels
from streams.align.aligner import VALUE_COLUMNS, Advance, AlignParams, Frame, GridAligner, LateSamples, Recovered
from tests.oracle import oracle

GRID = 1_000_000_000
T0 = 1_796_200_000 * GRID
Series = tuple[str, str, int]  # node, gpu, sensor index


def make_samples(rng: random.Random, nodes: int = 2, gpus: int = 2, seconds: int = 6) -> dict[Series, list[tuple[int, float]]]:
    out: dict[Series, list[tuple[int, float]]] = {}
    for n in range(nodes):
        for g in [*map(str, range(gpus)), "host"]:
            for s in CATALOG:
                if (g == "host") != (s.scope == "host"):
                    continue
                period = rng.choice([100, 250, 1000]) * 1_000_000
                t, level, pts = T0 + rng.randrange(period), 0.0, []
                while t < T0 + seconds * GRID:
                    if s.kind == "counter":
                        level = 0.0 if rng.random() < 0.05 else level + rng.randrange(3)
                        v = level
                    elif s.kind == "event":
                        v = float(rng.choice([0, 0, 0, 13, 79]))
                    else:
                        v = round(rng.uniform(s.lo, min(s.hi, 1000.0)), 3)
                    pts.append((t, v))
                    t += period
                out[(f"node-{n}", g, s.index)] = pts
    return out


def as_rows(frames: list[Frame]) -> dict[tuple[str, str, int], dict[str, object]]:
    rows = {}
    for f in frames:
        row: dict[str, object] = dict(zip(VALUE_COLUMNS, f.values, strict=True))
        row |= {s.count_column: n for s, n in zip(CATALOG, f.counts, strict=True)}
        key = (f.node, f.gpu, f.tick_ns)
        assert key not in rows, f"frame {key} emitted twice"
        rows[key] = row
    return rows


def feed(aligner: GridAligner, samples: dict[Series, list[tuple[int, float]]], chunk: int,
         rng: random.Random | None = None) -> list[Frame]:
    """Send each series in messages of ``chunk`` samples, series interleaved (randomly if rng)."""
    queues = {k: [v[i:i + chunk] for i in range(0, len(v), chunk)] for k, v in samples.items()}
    # Every series announces itself first (a series the aligner has never seen cannot
    # hold its node's watermark back); after that, any interleaving.
    first = sorted(queues)
    rest = [k for k, q in queues.items() for _ in q[1:]]
    if rng is not None:
        rng.shuffle(first)
        rng.shuffle(rest)
    order = first + rest
    frames: list[Frame] = []
    pos = {k: 0 for k in queues}
    for i, k in enumerate(order):
        msg = queues[k][pos[k]]
        pos[k] += 1
        aligner.add(k[0], k[1], k[2], [t for t, _ in msg], [v for _, v in msg])
        if i >= len(first):
            frames += out(aligner.advance(now_ns=0))
    return frames + out(aligner.flush_all())


def out(adv: Advance) -> list[Frame]:
    assert adv.late == []
    return adv.frames.frames()


def assert_same(got: dict[tuple[str, str, int], dict[str, object]], want: dict[tuple[str, str, int], dict[str, object]]) -> None:
    assert got.keys() == want.keys()
    for key, row in want.items():
        for col, v in row.items():
            assert got[key][col] == (pytest.approx(v, rel=1e-12) if isinstance(v, float) else v), (key, col)


@pytest.mark.parametrize("chunk", [1, 7, 100])
def test_streaming_frames_equal_the_batch_oracle(chunk: int) -> None:
    samples = make_samples(random.Random(chunk))
    aligner = GridAligner(AlignParams(allowed_lateness_ns=0))
    assert_same(as_rows(feed(aligner, samples, chunk, random.Random(1))), oracle(samples))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), chunk=st.sampled_from([1, 3, 50]))
def test_any_interleaving_of_series_gives_the_same_frames(seed: int, chunk: int) -> None:
    samples = make_samples(random.Random(seed), nodes=1, gpus=1, seconds=4)
    aligner = GridAligner(AlignParams(allowed_lateness_ns=0))
    assert_same(as_rows(feed(aligner, samples, chunk, random.Random(seed + 1))), oracle(samples))


def test_empty_cells_are_null_with_zero_count() -> None:
    a = GridAligner(AlignParams(allowed_lateness_ns=0))
    a.add("n", "0", BY_NAME["power"].index, [T0 + 5], [300.0])
    [f] = out(a.flush_all())
    row = as_rows([f])[("n", "0", T0)]
    assert row["power"] == 300.0 and row["n_power"] == 1
    assert row["temperature"] is None and row["n_temperature"] == 0


def test_watermark_waits_for_the_slowest_series_then_closes() -> None:
    p, t = BY_NAME["power"].index, BY_NAME["temperature"].index
    a = GridAligner(AlignParams(allowed_lateness_ns=500_000_000))
    a.add("n", "0", p, [T0 + i * GRID for i in range(10)], [1.0] * 10)
    a.add("n", "0", t, [T0], [40.0])
    assert out(a.advance(0)) == []  # temperature has only reached T0
    a.add("n", "0", t, [T0 + 3 * GRID + 600_000_000], [41.0])
    ticks = [f.tick_ns for f in out(a.advance(0))]
    # watermark = 3.6 s + 0.25 s reach (its period as measured, at most half the lateness) - 0.5 s lateness
    assert ticks == [T0, T0 + GRID, T0 + 2 * GRID]
    assert a.watermark("n") == T0 + 3 * GRID + 350_000_000


def test_late_samples_are_reported_not_merged() -> None:
    p = BY_NAME["power"].index
    a = GridAligner(AlignParams(allowed_lateness_ns=0))
    a.add("n", "0", p, [T0], [1.0])
    a.add("n", "0", p, [T0 + 2 * GRID], [2.0])
    assert [f.tick_ns for f in out(a.advance(0))] == [T0]  # tick 1 is empty: no frame, but closed
    a.add("n", "0", p, [T0 + 5, T0 + 2 * GRID + 1, T0 + GRID + 7], [9.0, 3.0, 9.0], source="s", position=7)
    done = a.flush_all()
    assert done.late == [LateSamples("s", 7, [0, 2], 3)]
    [f] = done.frames.frames()
    assert f.counts[p] == 2 and f.value("power") == 2.5


def test_each_message_gets_its_own_late_samples_among_many() -> None:
    p = BY_NAME["power"].index
    rng = random.Random(9)
    a = GridAligner(AlignParams(allowed_lateness_ns=0))
    a.add("n", "0", p, [T0], [1.0])
    a.add("n", "0", p, [T0 + 3 * GRID], [2.0])
    a.advance(0)  # ticks 0-2 closed
    want = []
    for k in range(400):  # a backlog: late messages, on-time ones and mixed ones in one poll
        ts = [T0 + rng.randrange(5 * GRID) for _ in range(rng.randrange(1, 6))]
        a.add("n", "0", p, ts, [1.0] * len(ts), source=f"s{k % 3}", position=k)
        late = [i for i, t in enumerate(ts) if t < T0 + 3 * GRID]
        if late:
            want.append(LateSamples(f"s{k % 3}", k, late, len(ts)))
    assert a.flush_all().late == want


def ticks(adv: Advance) -> list[int]:
    return [(f.tick_ns - T0) // GRID for f in out(adv)]


def test_a_series_that_fell_behind_holds_for_the_idle_bound_then_stops() -> None:
    p, t = BY_NAME["power"].index, BY_NAME["temperature"].index
    a = GridAligner(AlignParams(allowed_lateness_ns=0, idle_ns=5 * GRID))
    a.add("n", "0", t, [T0], [40.0], source="t")
    a.add("n", "0", p, [T0 + i * GRID for i in range(8)], [1.0] * 8, source="p")
    assert ticks(a.advance(now_ns=0)) == []  # temperature fell behind now: it holds
    assert ticks(a.advance(now_ns=4 * GRID)) == []
    a.add("n", "0", p, [T0 + 8 * GRID], [1.0], source="p")
    assert ticks(a.advance(now_ns=4 * GRID + GRID // 2)) == []
    assert ticks(a.advance(now_ns=5 * GRID)) == list(range(8))  # quiet for 5 s while behind: idle
    assert ticks(a.advance(now_ns=9 * GRID)) == []  # power delivered 4.5 s ago: not quiet long enough
    assert ticks(a.advance(now_ns=9 * GRID + GRID // 2)) == [8]  # every series quiet: the tail is written
    # A delivery makes the series hold again; an old straggler of it is late by disorder.
    a.add("n", "0", t, [T0 + 9 * GRID + 5], [41.0], source="t", position=3)
    assert ticks(a.advance(now_ns=10 * GRID)) == []
    a.add("n", "0", t, [T0 + GRID], [42.0], source="t", position=4)
    assert [(x.position, x.why) for x in a.advance(now_ns=10 * GRID).late] == [(4, "disorder")]


def test_a_burst_on_one_topic_waits_for_the_others_however_far_ahead() -> None:
    p, t = BY_NAME["power"].index, BY_NAME["temperature"].index
    a = GridAligner(AlignParams(allowed_lateness_ns=GRID, idle_ns=10 * GRID))
    a.expect(["p", "t"])
    def burst(si: int, src: str, seconds: range) -> None:  # a message a sample
        for i in seconds:
            a.add("n", "0", si, [T0 + i * GRID], [1.0], source=src)

    burst(p, "p", range(20))
    burst(t, "t", range(20))
    assert ticks(a.advance(now_ns=0)) == list(range(18))
    assert ticks(a.advance(now_ns=100 * GRID)) == [18, 19]  # quiet between bursts: the tail is written
    # The next burst: 40 s of power lands first, temperature a moment (or 9 s) later.
    burst(p, "p", range(20, 60))
    assert ticks(a.advance(now_ns=100 * GRID)) == []
    assert ticks(a.advance(now_ns=109 * GRID)) == []
    burst(t, "t", range(20, 60))
    adv = a.advance(now_ns=109 * GRID)
    assert adv.late == [] and ticks(adv) == list(range(20, 58))


def test_a_source_that_never_delivers_holds_at_first_then_counts_as_idle() -> None:
    p = BY_NAME["power"].index
    a = GridAligner(AlignParams(allowed_lateness_ns=0, idle_ns=5 * GRID))
    a.expect(["p", "t", "u"])
    assert ticks(a.advance(now_ns=0)) == []
    assert ticks(a.advance(now_ns=60 * GRID)) == []  # nothing to hold for before any data
    a.add("n", "0", p, [T0 + i * GRID for i in range(10)], [1.0] * 10, source="p")
    assert ticks(a.advance(now_ns=61 * GRID)) == []  # t and u may carry this burst's other series
    assert ticks(a.advance(now_ns=65 * GRID)) == []
    assert ticks(a.advance(now_ns=66 * GRID)) == list(range(10))  # t, u idle; power quiet too: tail
    # A source that arrives after it counted as idle: late, and the reason says so.
    a.add("n", "0", BY_NAME["temperature"].index, [T0 + 2 * GRID], [40.0], source="t", position=4)
    [late] = a.advance(now_ns=67 * GRID).late
    assert (late.source, late.position, late.why) == ("t", 4, "idle")


def test_idleness_counts_only_quiet_clock_time() -> None:
    """A source whose quiet clock stands still (Kafka not answering) never counts as idle."""
    p, t = BY_NAME["power"].index, BY_NAME["temperature"].index
    a = GridAligner(AlignParams(allowed_lateness_ns=0, idle_ns=5 * GRID))
    a.expect(["p", "t"])
    a.add("n", "0", t, [T0], [40.0], source="t")
    a.add("n", "0", p, [T0 + i * GRID for i in range(8)], [1.0] * 8, source="p")
    for now in (0, 10 * GRID, 100 * GRID):
        assert ticks(a.advance(now_ns=now, quiet_ns={"p": now, "t": 0})) == []
        a.add("n", "0", p, [T0 + 8 * GRID + now // 1000], [1.0], source="p")  # power keeps coming
    assert ticks(a.advance(now_ns=101 * GRID, quiet_ns={"p": 101 * GRID, "t": 5 * GRID})) == list(range(8))


def test_open_ticks_are_capped() -> None:
    p, t = BY_NAME["power"].index, BY_NAME["temperature"].index
    a = GridAligner(AlignParams(allowed_lateness_ns=0, max_open_ticks=3))
    a.add("n", "0", t, [T0], [40.0])
    a.add("n", "0", p, [T0 + i * GRID for i in range(10)], [1.0] * 10)
    assert len(out(a.advance(0))) == 7 and a.open_cells() == 3


@pytest.mark.parametrize("spread_s", [3, 100_000])  # few ticks: the table count; far apart: the sort
def test_open_cells_counts_each_gpu_and_tick_once(spread_s: int) -> None:
    rng = random.Random(spread_s)
    a = GridAligner(AlignParams(allowed_lateness_ns=10**6 * GRID, max_open_ticks=10**6))  # every sample stays open
    cells: set[tuple[str, str, int]] = set()  # a GPU's frame-to-be per tick, whatever its sensors
    for _ in range(40):  # one chunk per add, so the count spans chunks
        node, gpu = f"n{rng.randrange(3)}", str(rng.randrange(4))
        s = rng.choice([BY_NAME["power"].index, BY_NAME["temperature"].index, BY_NAME["gpu_util"].index])
        ts = sorted(T0 + rng.randrange(spread_s * GRID) for _ in range(rng.randrange(1, 6)))
        a.add(node, gpu, s, ts, [1.0] * len(ts))
        cells |= {(node, gpu, t // GRID) for t in ts}
    assert a.open_cells() == 0  # placed by the next advance
    a.advance(0)
    assert a.open_cells() == len(cells)


def test_open_samples_are_capped_whatever_the_skew() -> None:
    p, t = BY_NAME["power"].index, BY_NAME["temperature"].index
    a = GridAligner(AlignParams(allowed_lateness_ns=0, max_open_samples=25))
    a.add("n", "0", t, [T0], [40.0])  # a stalled series would hold everything open
    a.add("n", "0", p, [T0 + i * GRID // 10 for i in range(60)], [1.0] * 60)
    frames = out(a.advance(0))
    assert [f.tick_ns for f in frames] == [T0 + i * GRID for i in range(4)]
    assert a.open_samples() <= 25
    a.add("n", "0", p, [T0 + GRID], [5.0], source="s", position=1)
    a.add("n", "0", t, [T0 + GRID], [41.0], source="s", position=2)
    # Power's straggler is older than its series' newest by more than the lateness; temperature's is in order,
    # behind a tick the cap wrote.
    assert [(x.position, x.indices, x.why) for x in a.advance(0).late] == [(1, [0], "disorder"), (2, [0], "cap")]


def test_oldest_positions_pin_open_cells_per_source() -> None:
    p, t = BY_NAME["power"].index, BY_NAME["temperature"].index
    a = GridAligner(AlignParams(allowed_lateness_ns=0))
    a.add("n", "0", p, [T0], [1.0], source="power", position=10)
    a.add("n", "0", p, [T0 + 2 * GRID], [1.0], source="power", position=11)
    a.add("n", "0", t, [T0 + GRID], [40.0], source="temp", position=3)
    assert a.oldest_positions() == {"power": 10, "temp": 3}
    a.add("n", "0", t, [T0 + 3 * GRID], [40.0], source="temp", position=4)
    assert [f.tick_ns for f in out(a.advance(0))] == [T0, T0 + GRID]  # watermark 2 s: the power series
    assert a.oldest_positions() == {"power": 11, "temp": 4}


def test_recovered_boundary_and_counter_continue_a_crashed_run() -> None:
    e = BY_NAME["ecc_errors"].index
    full = GridAligner(AlignParams(allowed_lateness_ns=0))
    pts = [(T0 + i * 400_000_000, float(v)) for i, v in enumerate([5, 6, 6, 9, 1, 2, 4])]
    full.add("n", "0", e, [t for t, _ in pts], [v for _, v in pts])
    frames = out(full.flush_all())
    first, rest = frames[0], frames[1:]
    # A restart that knows tick T0 is written and the counter stood at 6 there.
    last = first.value("ecc_errors_last")
    assert last is not None  # the first cell has samples
    again = GridAligner(AlignParams(allowed_lateness_ns=0), Recovered({"n": first.tick_ns}, {("n", "0", e): last}))
    again.add("n", "0", e, [t for t, _ in pts], [v for _, v in pts])
    done = again.flush_all()
    assert [x.indices for x in done.late] == [[0, 1, 2]]
    assert [(f.tick_ns, f.values) for f in done.frames.frames()] == [(f.tick_ns, f.values) for f in rest]
    assert [f.value("ecc_errors") for f in frames] == [1.0, 3.0 + 1.0, 1.0 + 2.0]


def test_snapshot_round_trips_through_pickle() -> None:
    samples = make_samples(random.Random(3), nodes=1, gpus=1, seconds=3)
    a = GridAligner(AlignParams(allowed_lateness_ns=0))
    items = sorted(samples.items())
    for (node, gpu, si), pts in items[: len(items) // 2]:
        a.add(node, gpu, si, [t for t, _ in pts], [v for _, v in pts], source=si, position=1)
    b = GridAligner.restore(pickle.loads(pickle.dumps(a.snapshot())))
    for (node, gpu, si), pts in items[len(items) // 2:]:
        for x in (a, b):
            x.add(node, gpu, si, [t for t, _ in pts], [v for _, v in pts], source=si, position=2)
    assert b.oldest_positions() == a.oldest_positions()
    assert [(f.tick_ns, f.values, f.counts) for f in out(b.flush_all())] == [(f.tick_ns, f.values, f.counts) for f in out(a.flush_all())]


def test_params_are_validated() -> None:
    with pytest.raises(ValueError):
        AlignParams(grid_ns=10_000_000)
    with pytest.raises(ValueError):
        AlignParams(grid_ns=61_000_000_000)
    with pytest.raises(ValueError):
        AlignParams(allowed_lateness_ns=-1)


def test_a_clock_correction_moves_samples_onto_utc_and_reports_its_uncertainty() -> None:
    from streams.align.clock import ClockFit

    p = BY_NAME["power"].index
    a = GridAligner(AlignParams(allowed_lateness_ns=0))
    fit = ClockFit(base_ns=T0 - 5 * GRID, offset_ns=250.0, drift=0.0, ref_ns=0, uncertainty_ns=40_000, epoch=0)
    a.add("n", "0", p, [5 * GRID + 1, 5 * GRID + GRID // 2], [100.0, 200.0], correction=fit)  # domain times
    a.add("n", "host", BY_NAME["host_cpu_util"].index, [T0 + 10], [50.0])
    done = a.flush_all()
    frames = {f.gpu: f for f in done.frames.frames()}
    assert frames["0"].tick_ns == T0 and frames["0"].value("power") == 150.0
    unc = dict(zip(done.frames.gpu, done.frames.clock_uncertainty_ns.tolist(), strict=True))
    assert unc == {"0": 40_000, "host": 0}


def test_corrections_of_a_poll_match_each_fit_applied_alone() -> None:
    """The vectorized correction of a mixed poll (UTC messages among corrected ones) gives
    exactly what ``ClockFit.to_utc`` gives sample by sample."""
    from streams.align.clock import ClockFit

    rng = random.Random(5)
    grid = 100_000_000
    a = GridAligner(AlignParams(grid_ns=grid, allowed_lateness_ns=0))
    p = BY_NAME["power"].index
    want: dict[str, int] = {}
    for i in range(300):
        t = T0 + rng.randrange(60 * 10**9)
        if i % 3 == 0:
            a.add("n", f"u{i}", p, [t], [1.0])
            want[f"u{i}"] = t // grid * grid
            continue
        fit = ClockFit(base_ns=rng.randrange(-2 * 10**9, 2 * 10**9), offset_ns=rng.uniform(-1e6, 1e6),
                       drift=rng.uniform(-1e-4, 1e-4), ref_ns=t - rng.randrange(10**11), uncertainty_ns=7, epoch=0)
        a.add("n", f"c{i}", p, [t], [1.0], correction=fit)
        want[f"c{i}"] = fit.to_utc(t) // grid * grid
    got = {f.gpu: f.tick_ns for f in a.flush_all().frames.frames()}
    assert got == want


def test_frames_are_read_by_column_name() -> None:
    p = BY_NAME["power"].index
    a = GridAligner(AlignParams(allowed_lateness_ns=0))
    a.add("n", "0", p, [T0, T0 + 5], [100.0, 200.0])
    batch = a.flush_all().frames
    assert batch.column("power").tolist() == [150.0] and batch.column("n_power").tolist() == [2]
    [f] = batch.frames()
    assert f.value("power") == 150.0 and f.count("n_power") == 2 and f.value("temperature") is None
    with pytest.raises(KeyError, match="'watts' is not a value, count or derived column"):
        batch.column("watts")
    with pytest.raises(KeyError, match="'n_power' is not a value column"):
        f.value("n_power")


@pytest.mark.parametrize("seed", range(4))
def test_a_poll_added_as_blocks_aligns_as_its_messages_added_one_by_one(seed: int) -> None:
    """``add_block`` (a poll's messages of one sensor and source at once) gives the frames, late reports,
    labels and commit positions of ``add`` per message: some messages come late, labels change mid-way."""
    rng = random.Random(seed)
    params = AlignParams(allowed_lateness_ns=GRID // 2)
    one, block = GridAligner(params), GridAligner(params)
    samples = make_samples(rng, nodes=2, gpus=2, seconds=8)
    msgs = []
    for series, pts in samples.items():
        k = rng.randrange(1, 5)  # samples a message
        msgs += [(series, pts[i:i + k]) for i in range(0, len(pts), k)]
    msgs.sort(key=lambda m: m[1][0][0] + rng.randrange(3 * GRID))  # out of order across series, some late
    pos = 0
    for step in range(0, len(msgs), 97):  # a poll
        poll = msgs[step:step + 97]
        by_sensor: dict[int, list[tuple[str, str, list[tuple[int, float]], Labels | None, int]]] = {}
        for (node, gpu, s), pts in poll:
            pos += 1
            labels: Labels | None = {"pod": f"p{pos // 300}"} if rng.random() < 0.3 else None
            by_sensor.setdefault(s, []).append((node, gpu, pts, labels, pos))
        # A poll comes a topic-partition (one sensor) at a time, as the ingest adds it: the last labels win.
        for s, got in by_sensor.items():
            for node, gpu, pts, labels, at in got:
                one.add(node, gpu, s, [t for t, _ in pts], [v for _, v in pts], labels, source=f"src{s % 3}",
                        position=at)
        for s, got in by_sensor.items():
            block.add_block(s, [m[0] for m in got], [m[1] for m in got], [m[3] for m in got],
                            [len(m[2]) for m in got], np.array([t for m in got for t, _ in m[2]], np.int64),
                            np.array([v for m in got for _, v in m[2]]), f"src{s % 3}", [m[4] for m in got])
        assert block.oldest_positions() == one.oldest_positions()
        a, b = one.advance(T0), block.advance(T0)
        assert sorted(map(repr, b.frames.frames())) == sorted(map(repr, a.frames.frames()))
        assert sorted(map(repr, b.late)) == sorted(map(repr, a.late))
        assert block.oldest_positions() == one.oldest_positions()
    a, b = one.flush_all(), block.flush_all()
    assert sorted(map(repr, b.frames.frames())) == sorted(map(repr, a.frames.frames())) != []


def test_add_block_refuses_columns_that_do_not_match_their_messages() -> None:
    a = GridAligner(AlignParams())
    p = BY_NAME["power"].index
    with pytest.raises(ValueError, match="3 times and 2 values for 2 messages of 3 samples"):
        a.add_block(p, ["n", "n"], ["0", "1"], [None, None], [1, 2], np.array([T0, T0, T0]), np.array([1.0, 2.0]),
                    "s", [1, 2])
    assert a.oldest_positions() == {} and not a.advance(0).frames.frames()
