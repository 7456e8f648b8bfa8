"""Reading recorded telemetry files for ``flopwatch replay``: each file as (event time, item) in
file order, where an item is a CSV row, a JSON line's wire message or a problem to report,
with its ``FileSummary`` filled in as it goes (see ``agents.collect.replay``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import tzinfo
from pathlib import Path
from typing import Any, Literal

import orjson

from schemas.codec import decode_beacon, decode_k8s_event, decode_samples
from schemas.counters import Counters
from schemas.records import UTC_CLOCK, ClockBeacon, K8sEvent, Reject, SampleBatch
from schemas.topic_schemas import CLOCK_SYNC, K8S_EVENTS
from streams.formats.nvsmi_csv import CsvFormatError, GpuRow, NvsmiCsvReader, Problem

_JSONL_EXT = (".jsonl", ".ndjson", ".json")


@dataclass(slots=True)
class FileSummary(Counters):
    path: str
    format: str
    node: str
    lines: int = 0
    rows: int = 0  # CSV rows (one GPU at one tick) or JSON lines published
    samples: int = 0
    malformed_lines: int = 0
    skipped_cells: Counter[str] = field(default_factory=Counter)
    repeated_headers: int = 0
    unknown_columns: list[str] = field(default_factory=list)
    time_went_back: int = 0
    error: str = ""  # the file could not be read (from where it says)


@dataclass(frozen=True, slots=True)
class Message:
    """One JSON line ready to publish."""

    topic: str  # without prefix
    key: str
    value: bytes
    samples: int


Item = GpuRow | Problem | Message


def detect_format(path: Path) -> Literal["jsonl", "nvsmi-csv"]:
    if path.suffix.lower() in _JSONL_EXT:
        return "jsonl"
    if path.suffix.lower() == ".csv":
        return "nvsmi-csv"
    with path.open("rb") as f:
        for raw in f:
            if raw.strip():
                return "jsonl" if raw.lstrip(b"\xef\xbb\xbf \t").startswith(b"{") else "nvsmi-csv"
    return "nvsmi-csv"


def jsonl_items(path: Path, lines: Iterator[str], node: str | None, summary: FileSummary
                 ) -> Iterator[tuple[int, Item]]:
    last_ts = 0
    for no, line in enumerate(lines, 1):
        summary.lines += 1
        text = line.strip().removeprefix("\ufeff")
        if not text:
            continue
        out = _jsonl_message(text.encode(), node)
        if isinstance(out, str):
            summary.malformed_lines += 1
            yield last_ts, Problem(str(path), no, out)
            continue
        msg, stamp = out
        ts = last_ts if stamp is None else stamp  # a clock-domain message keeps its place among the UTC ones
        summary.rows += 1
        summary.samples += msg.samples
        if ts < last_ts:
            summary.time_went_back += 1
        last_ts = ts
        yield ts, msg


def _jsonl_message(raw: bytes, node: str | None) -> tuple[Message, int | None] | str:
    """The line as a message and its UTC event time (for pacing; None: in another clock domain),
    or what is wrong with it."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return f"malformed JSON: {exc}"
    if not isinstance(obj, dict):
        return "malformed line: expected a JSON object"
    topic = obj.get("topic") or (f"sensors.{obj['sensor']}" if isinstance(obj.get("sensor"), str) else None)
    if not isinstance(topic, str):
        return 'no topic: name it with "sensor": "<name>" or "topic": "sensors.<name>" / "k8s.events" / "clock.sync"'
    if node is not None:
        obj["node"] = node
        raw = orjson.dumps(obj)
    decoded: object
    if topic.startswith("sensors."):
        decoded = decode_samples(raw, topic.removeprefix("sensors."))
    elif topic == K8S_EVENTS:
        decoded = decode_k8s_event(raw)
    elif topic == CLOCK_SYNC:
        decoded = decode_beacon(raw)
    else:
        return f"unknown topic {topic!r}: replay publishes to sensors.<name>, {K8S_EVENTS} and {CLOCK_SYNC}"
    if isinstance(decoded, Reject):
        return f"{decoded.reason}: {decoded.detail}"
    if isinstance(decoded, SampleBatch):
        return Message(topic, decoded.node, raw, len(decoded)), decoded.span[0] if decoded.clock == UTC_CLOCK else None
    if isinstance(decoded, K8sEvent):
        return Message(topic, decoded.node, raw, 0), decoded.ts_ns
    assert isinstance(decoded, ClockBeacon)
    return Message(topic, decoded.node, raw, 0), decoded.utc_after_ns


def csv_items(path: Path, lines: Iterator[str], tz: tzinfo, summary: FileSummary, gpus: int | None = None
              ) -> Iterator[tuple[int, Item]]:
    reader = NvsmiCsvReader(str(path), tz, gpus)
    last_ts = 0
    try:
        for item in reader.read(lines):
            if isinstance(item, GpuRow):
                last_ts = item.ts_ns
            yield last_ts, item
    except CsvFormatError as exc:
        summary.error = str(exc)
    finally:
        rep = reader.report
        summary.lines, summary.rows, summary.samples = rep.lines, rep.rows, rep.samples
        summary.malformed_lines, summary.repeated_headers = rep.malformed_lines, rep.repeated_headers
        summary.skipped_cells, summary.unknown_columns = rep.skipped_cells, rep.unknown_columns
        summary.time_went_back = rep.time_went_back


def numbered(items: Iterator[tuple[int, Item]], file_index: int) -> Iterator[tuple[int, int, int, Item]]:
    """Merge keys: event time, then file, then position in the file (items never compare)."""
    for seq, (ts, item) in enumerate(items):
        yield ts, file_index, seq, item


def lines_of(handle: Any, on_bytes: Callable[[int], None] | None) -> Iterator[str]:
    for raw in handle:
        if on_bytes is not None:
            on_bytes(len(raw))
        yield raw.decode("utf-8", "replace")
