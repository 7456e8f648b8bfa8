"""``flopwatch replay`` into real Kafka, the worker until idle, and gpu_frames against the file.

The expectation is built from the rows the parser reads (each file its own node, named
after the file), grouped on the grid by the oracle of tests/oracle.py: exactly those
frames, with those means, maxima and counts, and no other.
"""

from __future__ import annotations

import time
from pathlib import Path
from zoneinfo import ZoneInfo

import orjson
import pytest
from click.testing import CliRunner

from agents.collect.replay import replay, replay_command
from agents.collect.simulator import batch_messages
from agents.settings import Settings
from schemas.catalog import BY_NAME
from streams.formats.nvsmi_csv import GpuRow, NvsmiCsvReader
from streams.sim.simulate import ClusterSimulator, SimParams
from tests.integration.helpers import assert_frames_equal, run_worker_until_idle, stored_frames
from tests.oracle import Series, oracle, series_of

pytestmark = pytest.mark.integration
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvsmi"
TEN_YEARS_S = 10 * 365 * 86400.0  # the fixtures were recorded on 2026-12-03: older than the default 7-day bound


def expected_from_csv(paths: list[Path], tz: ZoneInfo) -> dict[Series, list[tuple[int, float]]]:
    series: dict[Series, list[tuple[int, float]]] = {}
    for path in paths:
        reader = NvsmiCsvReader(str(path), tz)
        with path.open(encoding="utf-8") as f:
            for row in reader.read(f):
                if isinstance(row, GpuRow):
                    for sensor, v in row.values:
                        series.setdefault((path.stem, row.gpu, BY_NAME[sensor].index), []).append((row.ts_ns, v))
    return series


def test_replaying_every_nvsmi_fixture_gives_exactly_the_frames_the_files_imply(base_settings: Settings) -> None:
    settings = base_settings.replace(max_age_s=TEN_YEARS_S)
    paths = sorted(FIXTURES.glob("*.csv"))
    runner = CliRunner()
    out = runner.invoke(replay_command, [*map(str, paths), "--batch-size", "7"], obj=settings)
    assert out.exit_code == 0, out.output
    summary = orjson.loads(out.stdout.strip().splitlines()[-1])
    assert "malformed.csv:3: malformed line" in out.stderr  # reported with file and line, and skipped
    assert summary["malformed_lines"] == 6 and summary["messages"] > 0  # 5 in malformed.csv, a cut last line
    assert summary["skipped_cells"]["Not Supported"] == 4
    run_worker_until_idle(settings)
    want = oracle(expected_from_csv(paths, ZoneInfo("UTC")))
    got, raw_rows = stored_frames(settings)
    assert_frames_equal(got, want)
    assert raw_rows == len(want) and len(want) > 8
    assert {node for node, _, _ in got} == {p.stem for p in paths}


def test_replaying_json_lines_publishes_each_good_line_and_skips_the_bad(base_settings: Settings,
                                                                          tmp_path: Path) -> None:
    params = SimParams(nodes=1, gpus=2, seed=4, start_ns=(time.time_ns() - 20 * 10**9) // 10**9 * 10**9)
    batches = ClusterSimulator(params).advance(params.start_ns + 12 * 10**9)
    lines = []
    for b in batches:
        for msg in batch_messages(b, 10):
            lines.append(orjson.dumps(orjson.loads(msg) | {"sensor": b.sensor}))
    lines.insert(3, b'{"sensor": "power", "v": 1, "node": "node-00", "gpu": "0", "ts_ns": 1, "value": 9e9}')
    lines.insert(5, b"not json")
    path = tmp_path / "recording.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    problems: list[str] = []
    result = replay(base_settings, [path], on_problem=lambda p: problems.append(str(p)))
    assert [p.split(": ")[0] for p in problems] == [f"{path}:4", f"{path}:6"]
    assert "out_of_range" in problems[0]
    assert result.messages == len(lines) - 2 and result.ok
    run_worker_until_idle(base_settings)
    got, raw_rows = stored_frames(base_settings)
    want = oracle(series_of(batches))
    assert raw_rows == len(want)
    assert_frames_equal(got, want)
