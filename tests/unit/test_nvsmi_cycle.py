"""nvidia-smi CSVs without an index or uuid column: GPUs told apart by position in the loop's cycle.

The fixtures have the shapes of real recordings (tests/fixtures/nvsmi/README.md): rows of one iteration
stamped milliseconds apart, iterations split across the loop's gaps, no two rows sharing a timestamp, a
last line cut off mid-write, a header repeated after a reboot with fewer GPUs. Each GPU draws its own
power level, so a row on the wrong GPU shows.
"""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.formats.nvsmi_csv import CsvFormatError, GpuRow, NvsmiCsvReader, Problem
from streams.formats.nvsmi_cycle import infer_cycle

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvsmi"


def read(name: str, gpus: int | None = None, lines: list[str] | None = None
         ) -> tuple[list[GpuRow], list[Problem]]:
    reader = NvsmiCsvReader(name, UTC, gpus=gpus)
    if lines is None:
        with (FIXTURES / name).open(encoding="utf-8", newline="") as f:
            out = list(reader.read(f))
    else:
        out = list(reader.read(lines))
    return [r for r in out if isinstance(r, GpuRow)], [p for p in out if isinstance(p, Problem)]


def power(row: GpuRow) -> float:
    return dict(row.values)["power"]


def test_split_iterations_with_skewed_timestamps_put_every_row_on_its_gpu() -> None:
    rows, problems = read("x8_no_index_split.csv")
    assert len(rows) == 48 * 8
    level = {"0": 290.0, **{str(g): 60.0 + 1.5 * g for g in range(1, 8)}}
    assert all(abs(power(r) - level[r.gpu]) <= 0.5 for r in rows), [(r.line, r.gpu, power(r)) for r in rows
                                                                   if abs(power(r) - level[r.gpu]) > 0.5][:5]
    assert {r.gpu: 0 for r in rows} == {str(g): 0 for g in range(8)}
    [note] = problems
    assert note.line == 1 and "8: the rhythm says 8 (47 iterations" in note.what
    assert note.what.endswith("the values repeat every 8 rows (--gpus N states it)")


def test_per_gpu_second_counts_and_means_are_the_recordings_own() -> None:
    # The recording's own view: nvidia-smi writes GPU 0..7 in turn, so data row i is GPU i mod 8.
    lines = (FIXTURES / "x8_no_index_split.csv").read_text(encoding="utf-8").splitlines()[1:]
    want: dict[tuple[str, str], list[float]] = defaultdict(list)
    for i, line in enumerate(lines):
        stamp, watts = line.split(", ")[:2]
        want[(str(i % 8), stamp[:19])].append(float(watts.removesuffix(" W")))
    rows, _ = read("x8_no_index_split.csv")
    got: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        second = lines[r.line - 2].split(", ")[0][:19]
        got[(r.gpu, second)].append(power(r))
    assert {k: (len(v), round(sum(v) / len(v), 6)) for k, v in got.items()} == \
        {k: (len(v), round(sum(v) / len(v), 6)) for k, v in want.items()}


def test_no_shared_timestamps_and_a_truncated_last_line() -> None:
    rows, problems = read("x3_no_shared_timestamps_truncated.csv")
    assert len(rows) == 40 * 3
    assert all(abs(power(r) - (100.0 + 50 * int(r.gpu))) <= 0.5 for r in rows)
    note, cut = problems
    assert "3: the rhythm says 3" in note.what and "the values repeat every 3 rows" in note.what
    assert cut.line == 122 and "malformed line" in cut.what


def test_a_header_after_a_reboot_counts_the_gpus_again() -> None:
    rows, problems = read("x4_then_x2_after_reboot.csv")
    first, second = rows[:48], rows[48:]
    assert all(abs(power(r) - (600.0 + 10 * int(r.gpu))) < 0.01 for r in first)
    assert all(abs(power(r) - (400.0 + 10 * int(r.gpu))) < 0.01 for r in second) and len(second) == 24
    assert ["4: the rhythm says 4" in p.what for p in problems] == [True, False]
    assert "2: the rhythm says 2" in problems[1].what and problems[1].line == 50


def mostly_split(seed: int, alike: bool = False) -> list[str]:
    """8 GPUs whose every iteration is split somewhere (a stall of 300-900 ms at a random row). Each GPU at
    its own power; or (``alike``) all at the same power, like an idle node, with rows 1-60 ms apart at
    random: then neither the rhythm nor the values tell the GPUs apart."""
    rng = random.Random(seed)
    out, t_ms = ["timestamp, power.draw [W]"], 0
    for _ in range(30):
        cut = rng.randint(1, 7)
        for g in range(8):
            t_ms += rng.randint(1, 60) if alike else rng.randint(300, 900) if g == cut else 1
            watts = 60.0 + rng.random() if alike else 100.0 + g
            out.append(f"2025/05/05 20:{t_ms // 60_000 % 60:02d}:{t_ms // 1000 % 60:02d}.{t_ms % 1000:03d}, "
                       f"{watts:.2f} W")
        t_ms += 0 if alike else 250
    return out


def test_every_iteration_split_somewhere_still_shows_the_rhythm() -> None:
    """A stall splits each iteration at a different row; the loop's gap still ends every iteration."""
    rows, [note] = read("split.csv", lines=mostly_split(1))
    assert all(abs(power(r) - (100.0 + int(r.gpu))) < 0.01 for r in rows) and len(rows) == 240
    assert "the rhythm says 8 (29 iterations" in note.what and "the values repeat every 8 rows" in note.what


def test_without_a_rhythm_the_values_own_period_tells_the_gpus() -> None:
    rng = random.Random(3)
    lines, t_ms = ["timestamp, power.draw [W], memory.used [MiB]"], 0
    for _ in range(40):
        for g in range(6):
            t_ms += rng.randint(1, 60)  # no loop to read: rows at random
            lines.append(f"2025/05/05 20:{t_ms // 60_000 % 60:02d}:{t_ms // 1000 % 60:02d}.{t_ms % 1000:03d}, "
                         f"{150.0 + 20 * g + rng.random():.2f} W, {1000 * g + 7} MiB")
    rows, [note] = read("random.csv", lines=lines)
    assert "the rhythm is unclear, the values repeat every 6 rows" in note.what
    assert all(abs(power(r) - (150.0 + 20 * int(r.gpu))) < 1 for r in rows) and len(rows) == 240


def test_when_neither_witness_can_tell_the_file_is_refused_until_the_gpus_are_stated() -> None:
    with pytest.raises(CsvFormatError, match=r"the rhythm is unclear, the values show no period\): state it with "
                                             r"--gpus N"):
        read("split.csv", lines=mostly_split(1, alike=True))
    rows, [note] = read("split.csv", gpus=8, lines=mostly_split(1, alike=True))
    assert len(rows) == 240 and note.what.endswith("8 as stated")


def test_witnesses_that_disagree_refuse_the_file() -> None:
    """A clean rhythm of 4 rows per iteration over values that repeat every 8: not guessed either way."""
    lines, t_ms = ["timestamp, power.draw [W]"], 0
    for i in range(80):
        for g in range(4):
            lines.append(f"2025/05/05 20:{t_ms // 60_000 % 60:02d}:{t_ms // 1000 % 60:02d}.{t_ms % 1000:03d}, "
                         f"{100.0 + 10 * (g + 4 * (i % 2)):.2f} W")
            t_ms += 1
        t_ms += 100
    with pytest.raises(CsvFormatError, match=r"the rhythm says 4 .*the values repeat every 8 rows"):
        read("odd.csv", lines=lines)


def test_a_stated_count_that_the_rhythm_contradicts_is_named() -> None:
    _, [note] = read("x8_no_index_split.csv", gpus=4)
    assert note.what.endswith("4 as stated (the file suggests 8)")


def test_an_index_column_wins_over_a_stated_count() -> None:
    rows, problems = read("a100_nounits_index.csv", gpus=5)
    assert problems == [] and {r.gpu for r in rows} == {"0", "1"}


@pytest.mark.parametrize("gpus", [1, 2, 3, 8, 16])
def test_the_cycle_of_shared_or_skewed_stamps(gpus: int) -> None:
    rng = random.Random(gpus)
    for within_ms in (0, 1, 7):
        ts, t = [], 0
        for _ in range(50):
            for g in range(gpus):
                ts.append((t + g * within_ms + rng.randint(0, 1)) * 1_000_000)
            t += 100 + within_ms * gpus
        cycle = infer_cycle(ts)
        assert cycle is not None and cycle.gpus == gpus and not cycle.ambiguous, (within_ms, cycle)


def test_a_stall_in_a_one_gpu_recording_is_not_a_cycle() -> None:
    ts = [i * 250_000_000 for i in range(20)]
    ts[10:] = [t + 3_000_000_000 for t in ts[10:]]
    cycle = infer_cycle(ts)
    assert cycle is not None and cycle.gpus == 1


# --- property: N is found or the file is refused, never a wrong N ---------------------------------------------------

def recording(data: st.DataObject) -> tuple[list[str], list[int], bool]:
    """An index-less recording as nvidia-smi's loop writes it, with its GPU counts (one per boot)."""
    boots = data.draw(st.lists(st.integers(1, 16), min_size=1, max_size=2))
    loop_ms = data.draw(st.integers(50, 2_000))
    spread_ms = data.draw(st.integers(0, 40))
    split = data.draw(st.floats(0.10, 0.30))
    distinct = data.draw(st.booleans())  # each GPU at its own level, or all alike (an idle node)
    seed = data.draw(st.integers(0, 2**31))
    rng = random.Random(seed)
    lines, t_ms = [], 1_000
    for gpus in boots:
        lines.append("timestamp, power.draw [W], memory.used [MiB]")
        for _ in range(rng.randint(12, 40)):
            offsets = sorted(rng.uniform(0, spread_ms) for _ in range(gpus))
            if gpus > 1 and rng.random() < split:  # a stall splits this iteration after a random row
                at, stall = rng.randint(1, gpus - 1), rng.uniform(3, 3_000)
                offsets = [o + (stall if i >= at else 0) for i, o in enumerate(offsets)]
            for g, off in enumerate(offsets):
                t = int(t_ms + off)
                level = 100.0 + 23.0 * g if distinct else 80.0
                lines.append(f"2025/05/05 {t // 3_600_000 % 24:02d}:{t // 60_000 % 60:02d}:{t // 1000 % 60:02d}."
                             f"{t % 1000:03d}, {level + rng.gauss(0, 0.5):.2f} W, {(4000 * g if distinct else 500) + 3} MiB")
            t_ms = int(t_ms + offsets[-1]) + loop_ms
    lines[-1] = lines[-1][: len(lines[-1]) // 2]  # the recording was cut mid-line
    return lines, boots, distinct


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_gpu_count_is_found_or_refused_never_wrong(data: st.DataObject) -> None:
    lines, boots, distinct = recording(data)
    try:
        rows, problems = read("prop.csv", lines=lines)
    except CsvFormatError as e:
        assert "--gpus N" in str(e)
        return
    notes = [p for p in problems if "no index or uuid column" in p.what]
    assert [int(p.what.split(", ")[1].split(":")[0].split()[-1]) for p in notes] == boots, [p.what for p in notes]
    if distinct:  # every row on its own GPU: its power says which
        assert all(abs(power(r) - (100.0 + 23.0 * int(r.gpu))) < 5 for r in rows)


def real_shape(seed: int = 8) -> tuple[list[str], list[str]]:
    """The shape of a real 8-GPU recording (`--query-gpu=timestamp,power.draw,utilization.gpu,memory.used
    --format=csv -lms 100`, an 8-way tensor-parallel LLM server, 45,632 rows): rows of an iteration 0-2 ms
    apart, the loop's gaps 100-104 ms, and a few hundred stalls of 3-50 ms between rows of one iteration,
    so the gaps are no two clean clusters. The eight GPUs hold nearly the same memory and draw nearly the
    same power. Returns the lines and, per data line, its true GPU."""
    rng = random.Random(seed)
    lines, truth, t_ms = ["timestamp, power.draw [W], utilization.gpu [%], memory.used [MiB]"], [], 0.0
    stalls = set(rng.sample(range(45_632), 300))
    busy = 0.0
    for i in range(45_632 // 8):
        busy = min(1.0, max(0.0, busy + rng.gauss(0, 0.05)))
        for g in range(8):
            row = i * 8 + g
            t_ms += rng.uniform(3, 50) if row in stalls else rng.uniform(0, 2)
            t = int(t_ms)
            watts = 95.0 + 4 * g + 480 * busy + rng.gauss(0, 3)
            lines.append(f"2025/03/14 {t // 3_600_000 % 24:02d}:{t // 60_000 % 60:02d}:{t // 1000 % 60:02d}."
                         f"{t % 1000:03d}, {watts:.2f} W, {round(100 * busy)} %, {71_203 + 16 * g} MiB")
            truth.append(str(g))
        t_ms += rng.uniform(100, 104)
    return lines, truth


def test_a_recording_of_the_real_shape_is_exact_per_gpu_second() -> None:
    """Before: "4096 of 4096 runs of rows between the loop's gaps have 1", one GPU, 1 of 5,093 GPU-seconds
    exact. Now per GPU-second the count and mean of power equal the recording's own."""
    lines, truth = real_shape()
    rows, [note] = read("x8_real.csv", lines=lines)
    assert "8: the rhythm says 8" in note.what and "the values repeat every 8 rows" in note.what
    want: dict[tuple[str, str], list[float]] = defaultdict(list)
    for line, gpu in zip(lines[1:], truth, strict=True):
        stamp, watts = line.split(", ")[:2]
        want[(gpu, stamp[:19])].append(float(watts.removesuffix(" W")))
    got: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        got[(r.gpu, lines[r.line - 1].split(", ")[0][:19])].append(power(r))
    assert len(want) > 5_000
    assert {k: (len(v), round(sum(v) / len(v), 6)) for k, v in got.items()} == \
        {k: (len(v), round(sum(v) / len(v), 6)) for k, v in want.items()}
