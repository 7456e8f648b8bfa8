"""The nvidia-smi CSV reader on the fixtures of tests/fixtures/nvsmi/: every variant nvidia-smi writes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from streams.formats.nvsmi_csv import CsvFormatError, GpuRow, NvsmiCsvReader, Problem, tick_spacing_ns

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvsmi"
UTC_ZONE = ZoneInfo("UTC")


def read(name: str, tz: ZoneInfo = UTC_ZONE) -> tuple[list[GpuRow], list[Problem], NvsmiCsvReader]:
    path = FIXTURES / name
    reader = NvsmiCsvReader(name, tz)
    with path.open(encoding="utf-8", newline="") as f:
        out = list(reader.read(f))
    return [r for r in out if isinstance(r, GpuRow)], [p for p in out if isinstance(p, Problem)], reader


def ns(text: str, tz: ZoneInfo = UTC_ZONE) -> int:
    whole, _, frac = text.partition(".")
    dt = datetime.strptime(whole, "%Y/%m/%d %H:%M:%S").replace(tzinfo=tz)
    return int(dt.timestamp()) * 10**9 + int((frac or "0").ljust(9, "0"))


def test_units_in_header_and_values_padding_na_and_not_supported() -> None:
    rows, problems, reader = read("h100_units.csv")
    assert problems == []
    assert len(rows) == 70 and reader.report.rows == 70
    first = rows[0]
    assert first.line == 2 and first.ts_ns == ns("2026/12/03 14:05:05.900")
    assert first.gpu == "GPU-5f1c2a3b-0d4e-4a7f-9c21-7b8e1d2f3a40"  # the uuid names the GPU when present
    assert first.labels == {"gpu_model": "NVIDIA H100 80GB HBM3"}
    assert dict(first.values) == {"gpu_util": 0.0, "fb_used": 1024.0, "power": 150.0, "temperature": 40.0,
                                  "sm_clock": 1410.0}
    second = dict(rows[1].values)
    assert "sm_clock" not in second and second["power"] == 166.59  # [Not Supported] skipped, the rest kept
    rep = reader.report
    # N/A: fan.speed on every row (unknown column, but its cells are not counted: it is ignored) and
    # utilization twice; Not Supported: sm clock of GPU 1 on ticks 0, 10, 20, 30.
    assert dict(rep.skipped_cells) == {"N/A": 2, "Not Supported": 4}
    assert rep.unknown_columns == ["fan.speed"]
    assert rep.samples == 70 * 5 - 6
    assert rows[-1].ts_ns - rows[0].ts_ns == 34 * 100_000_000
    assert rep.time_went_back == 0 and rep.malformed_lines == 0


def test_nounits_with_index_and_crlf() -> None:
    rows, problems, _ = read("a100_nounits_index.csv")
    assert problems == [] and len(rows) == 8
    assert [r.gpu for r in rows[:2]] == ["0", "1"]
    assert dict(rows[1].values) == {"gpu_util": 11.0, "fb_used": 5120.0, "power": 166.59, "temperature": 41.0}
    assert rows[0].labels == {"gpu_model": "NVIDIA A100-SXM4-80GB"}


def test_without_index_or_uuid_the_gpus_of_a_tick_are_numbered_by_position() -> None:
    rows, problems, _ = read("l4_no_index.csv")
    assert [p.what for p in problems] == ["no index or uuid column: GPUs told apart by their position in each loop "
                                          "iteration, 3: the rhythm says 3 (2 iterations, loop gaps 101.0x the "
                                          "rows'), the values show no period (--gpus N states it)"]
    assert [(r.gpu, r.ts_ns - rows[0].ts_ns) for r in rows] == [
        (str(g), t * 100_000_000) for t in range(3) for g in range(3)]


def test_uuid_only_and_field_aliases() -> None:
    rows, _, reader = read("uuid_only.csv")
    assert {r.gpu for r in rows} == {"GPU-5f1c2a3b-0d4e-4a7f-9c21-7b8e1d2f3a40", "GPU-a07e9d31-66b2-4c0e-8f15-2d9c4b7e8a11"}
    assert set(dict(rows[0].values)) == {"sm_clock", "power"}  # clocks.current.sm, power.draw.instant
    assert reader.report.unknown_columns == []


def test_local_time_in_the_zone_given() -> None:
    rows, _, _ = read("berlin_local_time.csv", ZoneInfo("Europe/Berlin"))
    # 15:05:06 in Berlin in December (CET, UTC+1) is 14:05:06 UTC; -l 1 writes no fraction.
    assert rows[0].ts_ns == int(datetime(2026, 12, 3, 14, 5, 6, tzinfo=UTC).timestamp()) * 10**9
    assert rows[1].ts_ns - rows[0].ts_ns == 10**9
    assert read("berlin_local_time.csv")[0][0].ts_ns - rows[0].ts_ns == 3600 * 10**9  # read as UTC: an hour later


def test_malformed_lines_are_reported_with_their_line_and_skipped() -> None:
    rows, problems, reader = read("malformed.csv")
    assert [str(p) for p in problems] == [
        "malformed.csv:3: malformed line: 3 cells, the header has 4",
        "malformed.csv:4: malformed line: timestamp '2026/12/03 25:61:06.000' is not YYYY/MM/DD HH:MM:SS[.fff]",
        "malformed.csv:5: malformed line: timestamp 'yesterday' is not YYYY/MM/DD HH:MM:SS[.fff]",
        "malformed.csv:7: malformed line: no GPU id in column 'index'",
        "malformed.csv:9: malformed line: 5 cells, the header has 4",
    ]
    assert [r.line for r in rows] == [2, 6, 8, 11]
    assert dict(rows[1].values) == {"gpu_util": 50.0}  # "lots W" skipped, the row's other cell kept
    assert rows[2].values == ()  # both out of the catalog's range: one such value would sink a whole batch
    rep = reader.report
    assert rep.malformed_lines == 5 and rep.lines == 11
    assert dict(rep.skipped_cells) == {"unparsable": 1, "out_of_range": 2}


def test_a_repeated_header_is_skipped_and_a_different_one_taken() -> None:
    rows, problems, reader = read("repeated_header.csv")
    assert [str(p) for p in problems] == ["repeated_header.csv:6: a different header: read the following lines with it"]
    assert [dict(r.values) for r in rows] == [{"power": 300.0}, {"power": 301.0}, {"power": 302.0},
                                              {"power": 303.0, "temperature": 55.0}]
    assert reader.report.repeated_headers == 1 and reader.report.malformed_lines == 0


def test_a_file_without_a_header_cannot_be_read() -> None:
    reader = NvsmiCsvReader("x.csv", UTC_ZONE)
    with pytest.raises(CsvFormatError, match=r"x.csv:2: expected nvidia-smi's CSV header"):
        list(reader.read(["", "2026/12/03 14:05:06.000, 0, 300 W"]))


def test_units_convert_and_an_unknown_unit_is_skipped() -> None:
    reader = NvsmiCsvReader("u.csv", UTC_ZONE)
    out = list(reader.read(["timestamp, index, memory.used [MiB], power.draw [W]",
                            "2026/12/03 14:05:06.000, 0, 2 GiB, 500 mW",
                            "2026/12/03 14:05:06.100, 0, 2 parsecs, 1 W"]))
    assert isinstance(out[0], GpuRow) and dict(out[0].values) == {"fb_used": 2048.0, "power": 0.5}
    assert isinstance(out[1], GpuRow) and dict(out[1].values) == {"power": 1.0}
    assert dict(reader.report.skipped_cells) == {"unknown_unit": 1}


def test_ecc_totals_add_up_and_time_going_back_is_counted() -> None:
    reader = NvsmiCsvReader("e.csv", UTC_ZONE)
    out = list(reader.read(["timestamp, index, ecc.errors.corrected.volatile.total, ecc.errors.uncorrected.volatile.total",
                            "2026/12/03 14:05:06.500, 0, 3, 1",
                            "2026/12/03 14:05:06.400, 0, 3, [N/A]"]))
    assert [dict(r.values) for r in out if isinstance(r, GpuRow)] == [{"ecc_errors": 4.0}, {"ecc_errors": 3.0}]
    assert reader.report.time_went_back == 1


def test_tick_spacing_never_waits_backwards() -> None:
    assert tick_spacing_ns(None, 10) == 0 and tick_spacing_ns(10, 110) == 100 and tick_spacing_ns(110, 50) == 0


# --- the replay shell (agents/collect/replay.py) with a fake producer: no Kafka ------------------------------------------

class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, str | bytes | None]] = []
        self.flushes = 0

    def send(self, topic: str, value: bytes, key: str | bytes | None = None) -> None:
        self.sent.append((topic, value, key))

    def poll(self) -> None:
        pass

    def flush(self, timeout_s: float = 60.0) -> None:
        self.flushes += 1


class FakeClock:
    """Time moves only when replay sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def test_replay_batches_by_series_keys_by_node_and_counts_everything() -> None:
    from agents.collect.replay import replay
    from agents.settings import Settings
    from schemas.codec import decode_samples

    fake = FakeProducer()
    result = replay(Settings(topic_prefix="p."), [FIXTURES / "h100_units.csv", FIXTURES / "malformed.csv"],
                    batch_size=10, producer=fake)
    assert result.ok and fake.flushes == 1
    d = result.as_dict()
    assert d["rows"] == 70 + 4 and d["malformed_lines"] == 5
    assert d["skipped_cells"] == {"N/A": 2, "Not Supported": 4, "unparsable": 1, "out_of_range": 2}
    samples = 0
    for topic, value, key in fake.sent:
        sensor = topic.removeprefix("p.sensors.")
        batch = decode_samples(value, sensor)
        assert not hasattr(batch, "reason") and key in ("h100_units", "malformed") and batch.node == key
        assert len(batch) <= 10 and batch.clock == "utc" and list(batch.ts_ns) == sorted(batch.ts_ns)
        samples += len(batch)
    assert samples == d["samples"] == 344 + 5


def test_replay_at_recorded_speed_sleeps_the_recorded_spacing() -> None:
    from agents.collect.replay import replay
    from agents.settings import Settings

    clock, fake = FakeClock(), FakeProducer()
    replay(Settings(), [FIXTURES / "l4_no_index.csv"], speed="recorded", producer=fake, sleep=clock.sleep,
           monotonic=clock.monotonic)
    assert [round(s, 6) for s in clock.sleeps] == [0.1, 0.1]  # three ticks 100 ms apart
    assert len(fake.sent) == 2 * 3 * 3  # what was due went out before each pause: 2 sensors x 3 GPUs x 3 ticks


def test_replay_of_json_lines_checks_each_line_and_can_rename_the_node(tmp_path: Path) -> None:
    from agents.collect.replay import detect_format, replay
    from agents.settings import Settings

    path = tmp_path / "rec.log"
    path.write_text("\n".join([
        '{"sensor": "power", "v": 1, "node": "a", "gpu": "0", "ts_ns": [1, 2], "value": [300.0, 301.0]}',
        '{"topic": "clock.sync", "v": 1, "node": "a", "clock": "nvml:a", "domain_ns": 5, "utc_before_ns": 1, '
        '"utc_after_ns": 2}',
        '{"topic": "k8s.events", "v": 1, "node": "a", "ts_ns": 3, "type": "Normal", "reason": "Started"}',
        '{"sensor": "power", "v": 1, "node": "a", "gpu": "0", "ts_ns": 4, "value": -5}',
        '{"v": 1, "node": "a"}',
        '{"topic": "flopwatch.frames", "v": 1}',
    ]) + "\n")
    assert detect_format(path) == "jsonl"
    fake, problems = FakeProducer(), []
    result = replay(Settings(), [path], node="renamed", producer=fake, on_problem=lambda p: problems.append(str(p)))
    assert [t for t, _, _ in fake.sent] == ["sensors.power", "clock.sync", "k8s.events"]
    assert all(k == "renamed" and b'"node":"renamed"' in v for _, v, k in fake.sent)
    assert [p.split(": ", 1)[0] for p in problems] == [f"{path}:4", f"{path}:5", f"{path}:6"]
    assert "out_of_range" in problems[0] and "no topic" in problems[1] and "unknown topic" in problems[2]
    assert result.as_dict()["samples"] == 2 and result.ok


def test_replay_goes_on_past_a_file_it_cannot_read_and_says_so(tmp_path: Path) -> None:
    from agents.collect.replay import replay
    from agents.settings import Settings

    bad = tmp_path / "bad.csv"
    bad.write_text("2026/12/03 14:05:06.000, 0, 300 W\n")
    fake = FakeProducer()
    result = replay(Settings(), [bad, tmp_path / "missing.csv", FIXTURES / "uuid_only.csv"], producer=fake)
    assert not result.ok
    errors = [f.error for f in result.files]
    assert "bad.csv:1: expected nvidia-smi's CSV header" in errors[0]
    assert "missing.csv: cannot open" in errors[1] and errors[2] == ""
    assert result.as_dict()["rows"] == 4 and fake.sent


def test_replay_shows_the_first_problems_of_a_file_and_counts_the_rest(tmp_path: Path) -> None:
    from agents.collect.replay import replay
    from agents.settings import Settings

    path = tmp_path / "many.csv"
    path.write_text("timestamp, index, power.draw [W]\n" + "garbage\n" * 60 + "2026/12/03 14:05:06.000, 0, 300 W\n")
    problems: list[str] = []
    result = replay(Settings(), [path], producer=FakeProducer(), on_problem=lambda p: problems.append(str(p)))
    assert len(problems) == 51 and problems[0].startswith(f"{path}:2: malformed line")
    assert problems[-1] == f"{path}:62: 10 more problems not shown (counted in the summary)"
    assert result.as_dict()["malformed_lines"] == 60 and result.as_dict()["samples"] == 1


def test_the_replay_command_refuses_an_unknown_zone_before_touching_kafka() -> None:
    from click.testing import CliRunner

    from agents.collect.replay import replay_command
    from agents.settings import Settings

    out = CliRunner().invoke(replay_command, [str(FIXTURES / "uuid_only.csv"), "--tz", "Mars/Olympus"],
                             obj=Settings(kafka_bootstrap="127.0.0.1:1"))
    assert out.exit_code == 2 and "'Mars/Olympus' is not an IANA time zone" in out.output


def test_the_replay_sends_one_label_set_per_batch_in_series_order() -> None:
    from agents.collect.replay import _RowSender
    from agents.kafka.topics import Topics
    from schemas.codec import decode_samples
    from schemas.records import Labels, SampleBatch

    class Sent:
        def __init__(self) -> None:
            self.messages: list[tuple[str, bytes]] = []

        def send(self, topic: str, value: bytes, key: str | bytes | None = None) -> None:
            self.messages.append((topic, value))

        def poll(self) -> None:
            pass

        def flush(self, timeout_s: float = 30.0) -> None:
            pass

    out = Sent()
    rows = _RowSender(out, Topics(""), batch_size=3)
    a: Labels = {"gpu_model": "L4"}
    b: Labels = {"gpu_model": "L4", "pod": "p"}
    for i, labels in enumerate([a, a, b, b, b, b, a]):
        rows.add("n", GpuRow(i, i, "0", (("power", 100.0 + i),), labels))
    rows.flush()
    batches = [decode_samples(v, "power") for _, v in out.messages]
    got = [[(s.ts_ns, dict(s.labels or {})) for s in b.samples()] for b in batches if isinstance(b, SampleBatch)]
    assert got == [[(0, a), (1, a)], [(2, b), (3, b), (4, b)], [(5, b)], [(6, a)]] and rows.messages == 4


def test_replay_counts_what_the_worker_would_refuse_or_clickhouse_expire_and_says_so() -> None:
    """A recording older than the retention used to replay without an error and leave nothing."""
    from datetime import datetime

    from agents.collect.replay import replay
    from agents.settings import Settings

    recorded = int(datetime(2026, 12, 3, 14, 5, 6, tzinfo=UTC).timestamp() * 1e9)  # l4_no_index.csv, 9 rows
    day = 86_400 * 10**9
    s = Settings(max_age_s=7 * 86_400.0, frames_retention_days=30)
    fresh = replay(s, [FIXTURES / "l4_no_index.csv"], producer=FakeProducer(), wall_ns=lambda: recorded + day)
    assert (fresh.timed, fresh.too_old, fresh.past_retention) == (9, 0, 0) and fresh.age_warnings(s) == []
    old = replay(s, [FIXTURES / "l4_no_index.csv"], producer=FakeProducer(), wall_ns=lambda: recorded + 40 * day)
    assert (old.too_old, old.past_retention) == (9, 9)
    assert old.as_dict()["too_old"] == old.as_dict()["past_retention"] == 9
    too_old, expired = old.age_warnings(s)
    assert too_old.startswith("9 of 9 rows are older than FLOPWATCH_MAX_AGE_S (7 days): the worker rejects them")
    assert expired.startswith("9 of 9 rows are older than the frames' retention (FLOPWATCH_FRAMES_RETENTION_DAYS=30)")
    edge = replay(s, [FIXTURES / "l4_no_index.csv"], producer=FakeProducer(),
                  wall_ns=lambda: recorded + 100_000_000 + 7 * day)  # the first tick's 3 rows are past 7 days
    assert (edge.too_old, edge.past_retention) == (3, 0)
