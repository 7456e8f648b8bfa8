"""Per-step streams (torch, NCCL, dataloader) pause with their job; the node's frames do not wait for them."""

from __future__ import annotations

from schemas.catalog import BY_NAME
from streams.align.aligner import AlignParams, GridAligner
from tests.unit.test_align import GRID, T0, out

MS = 1_000_000
POWER, TEMP, WAIT = BY_NAME["power"].index, BY_NAME["temperature"].index, BY_NAME["dataloader_wait_ms"].index
PARAMS = AlignParams(allowed_lateness_ns=2 * GRID, idle_ns=15 * GRID, step_idle_ns=500 * MS)


def live(a: GridAligner, until_s: float, pauses: dict[int, range], start_s: float = 0.0) -> dict[int, float]:
    """Each stream sends one sample every 100 ms, stamped as it is sent (the wall clock, and the
    quiet clock); a stream is silent in its ``pauses`` (in 100 ms steps). Returns when each tick closed,
    in seconds after its end."""
    closed: dict[int, float] = {}
    for k in range(int(start_s * 10), int(until_s * 10)):
        now = k * 100 * MS
        for si, src in ((POWER, "p"), (TEMP, "t"), (WAIT, "w")):
            if k not in pauses.get(si, range(0)):
                a.add("n", "0", si, [T0 + now], [1.0], source=src, position=k)
        adv = a.advance(now_ns=T0 + now)
        assert adv.late == []
        for f in out(adv):
            tick = (f.tick_ns - T0) // GRID
            closed[tick] = round((now - (tick + 1) * GRID) / GRID, 1)
    return closed


def test_a_paused_per_step_stream_does_not_hold_its_node() -> None:
    # A checkpoint: the dataloader is silent from 10 s to 30 s while the GPU's streams go on.
    closed = live(GridAligner(PARAMS), 40, {WAIT: range(100, 300)})
    # Every tick closes once the lateness has passed: the dataloader's last sample and reach (its 100 ms period)
    # cover the tick its pause began in, and its step bound runs out before the clocked streams reach the next one.
    assert set(closed) == set(range(37)) and set(closed.values()) == {2.0}


def test_a_paused_clocked_stream_holds_its_node_for_the_idle_bound() -> None:
    # The same silence on a clocked stream (a collector that stopped) holds the node for the idle bound.
    closed = live(GridAligner(PARAMS), 40, {TEMP: range(100, 300)})
    # Its last sample (9.9 s) and reach cover tick 7; tick 8 waits until it counts as idle (behind from 12 s, + 15 s).
    assert closed[7] == 2.0 and closed[8] == 18.0 and closed[5] == 2.0 and closed[35] == 2.0


def test_a_per_step_streams_samples_after_the_pause_find_their_cells_open() -> None:
    a = GridAligner(PARAMS)
    live(a, 40, {WAIT: range(100, 300)})
    frames = out(a.flush_all())
    assert [f.count("n_dataloader_wait_ms") for f in frames] == [10, 10, 10]  # ticks 37 to 39


def burst(a: GridAligner, si: int, src: str, seconds: range) -> None:
    for i in seconds:
        a.add("n", "0", si, [T0 + i * GRID + j * 100 * MS for j in range(10)], [1.0] * 10, source=src)


def test_a_per_step_topics_part_of_a_backlog_holds_like_any_other() -> None:
    a = GridAligner(PARAMS)
    a.expect(["p", "w"])
    burst(a, POWER, "p", range(10))
    burst(a, WAIT, "w", range(10))
    assert len(out(a.advance(now_ns=T0 + 20 * GRID))) == 7
    assert len(out(a.advance(now_ns=T0 + 60 * GRID))) == 3  # the rest: the node's tail is written
    # A collector's backlog after an outage (30 s of old data at once); the dataloader's part 9 s later.
    burst(a, POWER, "p", range(10, 40))
    assert out(a.advance(now_ns=T0 + 60 * GRID)) == []
    assert out(a.advance(now_ns=T0 + 69 * GRID)) == []
    burst(a, WAIT, "w", range(10, 40))
    adv = a.advance(now_ns=T0 + 69 * GRID)
    assert adv.late == [] and [f.count("n_dataloader_wait_ms") for f in out(adv)] == [10] * 27


def test_after_a_rest_a_live_node_waits_the_step_bound_for_its_per_step_topics() -> None:
    for lands_ms, waited in ((400, True), (600, False)):
        a = GridAligner(PARAMS)
        live(a, 30, {})
        # A collector that flushes every two seconds: a rest, then two seconds of samples on each topic.
        assert out(a.advance(now_ns=T0 + 32 * GRID)) == []
        burst(a, POWER, "p", range(30, 32))
        burst(a, TEMP, "t", range(30, 32))
        # Tick 27 closes at once: the dataloader's last sample (29.9 s) and reach cover it.
        assert [f.tick_ns for f in out(a.advance(now_ns=T0 + 32 * GRID))] == [T0 + 27 * GRID]
        # Tick 28 may close, but the dataloader holds it for the step bound after the flush began.
        assert [f.tick_ns for f in out(a.advance(now_ns=T0 + 32 * GRID + lands_ms * MS))] == (
            [] if waited else [T0 + 28 * GRID])
        burst(a, WAIT, "w", range(30, 32))
        assert a.advance(now_ns=T0 + 32 * GRID + lands_ms * MS).late == []  # within the lateness either way
        assert [f.count("n_dataloader_wait_ms") for f in out(a.flush_all())][-1] == 10


def test_a_live_nodes_buffered_flush_after_a_broker_outage_holds_its_per_step_topic_like_any_other() -> None:
    a = GridAligner(PARAMS)
    live(a, 30, {})
    # The broker was away 10 s; the collector's client then sends its buffer: the clocked topics' part
    # in one poll, the dataloader's 5 s later (recent data: the node counts as live).
    burst(a, POWER, "p", range(30, 40))
    burst(a, TEMP, "t", range(30, 40))
    # Tick 27 closes at once: the dataloader's last sample (29.9 s) and reach cover it.
    assert [f.tick_ns for f in out(a.advance(now_ns=T0 + 40 * GRID))] == [T0 + 27 * GRID]
    assert out(a.advance(now_ns=T0 + 45 * GRID)) == []  # the peers ran 10 s ahead at once: not a pause
    burst(a, WAIT, "w", range(30, 40))
    adv = a.advance(now_ns=T0 + 45 * GRID)
    # Ticks 28 to 36 (37 waits for the next messages' first stamps).
    assert adv.late == [] and [f.count("n_dataloader_wait_ms") for f in out(adv)] == [10] * 9
