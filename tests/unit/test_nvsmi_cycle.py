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
    assert note.line == 1 and "8 from the rhythm (36 of 59 runs" in note.what and "23 are parts of iterations split" in note.what


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
    assert "3 from the rhythm" in note.what and "split" not in note.what
    assert cut.line == 122 and "malformed line" in cut.what


def test_a_header_after_a_reboot_counts_the_gpus_again() -> None:
    rows, problems = read("x4_then_x2_after_reboot.csv")
    first, second = rows[:48], rows[48:]
    assert all(abs(power(r) - (600.0 + 10 * int(r.gpu))) < 0.01 for r in first)
    assert all(abs(power(r) - (400.0 + 10 * int(r.gpu))) < 0.01 for r in second) and len(second) == 24
    assert ["4 from the rhythm" in p.what for p in problems] == [True, False]
    assert "2 from the rhythm" in problems[1].what and problems[1].line == 50


def mostly_split(seed: int) -> list[str]:
    """8 GPUs whose every iteration is split somewhere: no rhythm to read."""
    rng = random.Random(seed)
    out, t_ms = ["timestamp, power.draw [W]"], 0
    for _ in range(30):
        cut = rng.randint(1, 7)
        for g in range(8):
            t_ms += rng.randint(300, 900) if g == cut else 1
            out.append(f"2025/05/05 20:{t_ms // 60_000 % 60:02d}:{t_ms // 1000 % 60:02d}.{t_ms % 1000:03d}, "
                       f"{100.0 + g:.2f} W")
        t_ms += 250
    return out


def test_an_ambiguous_rhythm_is_refused_until_the_gpus_are_stated() -> None:
    with pytest.raises(CsvFormatError, match="state it with --gpus N"):
        read("split.csv", lines=mostly_split(1))
    rows, [note] = read("split.csv", gpus=8, lines=mostly_split(1))
    assert all(abs(power(r) - (100.0 + int(r.gpu))) < 0.01 for r in rows) and len(rows) == 240
    assert note.what.endswith("8 as stated")


def test_a_stated_count_that_the_rhythm_contradicts_is_named() -> None:
    _, [note] = read("x8_no_index_split.csv", gpus=4)
    assert note.what.endswith("4 as stated (the rhythm suggests 8)")


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
