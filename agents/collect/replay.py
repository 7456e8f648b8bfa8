"""``flopwatch replay FILE...``: publish recorded telemetry to the sensor topics.

Two formats (``--format auto`` picks by extension, then by the first non-blank line):

- ``nvsmi-csv``: what ``nvidia-smi --query-gpu=timestamp,... --format=csv -lms 100`` writes
  (parsed by ``streams/formats/nvsmi_csv.py``); rows become batch messages of ``sensors.<name>``,
  clock ``utc``, keyed by the node (``--node``, default the file's name without extension).
- ``jsonl``: one wire message per line, as a producer would send it, naming its topic with
  ``"sensor": "<name>"`` (a sensor message, single or batch form) or ``"topic"`` (any input
  topic: ``sensors.<name>``, ``k8s.events``, ``clock.sync``). Each line is checked with the
  pipeline's own codec and published unchanged (keyed by its ``node``; ``--node`` rewrites it).

Files are merged by event time, so several nodes' recordings play together. A bad line is
reported with file:line and skipped; a file that cannot be read at all is reported and the
others go on; a summary (JSON on stdout) counts everything. The exit code is 1 if a file
could not be read or Kafka did not take every message.
"""

from __future__ import annotations

import heapq
import logging
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import tzinfo
from pathlib import Path
from typing import Any, Literal, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click
import orjson

from agents.collect.batching import Batcher, OpenBatch, SeriesKey
from agents.collect.replay_files import (
    FileSummary,
    Item,
    csv_items,
    detect_format,
    jsonl_items,
    lines_of,
    numbered,
)
from agents.kafka.producer import DeliveryError, SampleProducer
from agents.kafka.topics import Topics
from agents.settings import Settings
from schemas.catalog import BY_NAME
from schemas.codec import encode_batch, encode_sample
from schemas.records import UTC_CLOCK, Labels, Sample, SampleBatch
from streams.formats.nvsmi_csv import GpuRow, Problem

__all__ = ["FileSummary", "ReplayResult", "detect_format", "replay", "replay_command"]

log = logging.getLogger(__name__)
Format = Literal["auto", "jsonl", "nvsmi-csv"]
Speed = Literal["recorded", "max"]
_SHOWN_PROBLEMS = 50  # per file; the rest are counted in the summary


class Sender(Protocol):
    """What replay needs of ``SampleProducer`` (tests pass a fake)."""

    def send(self, topic: str, value: bytes, key: str | bytes | None = None) -> None: ...

    def poll(self) -> None: ...

    def flush(self, timeout_s: float = 60.0) -> None: ...


class _RowSender:
    """Sends each series' rows as batch messages of ``batch_size`` through the ``Batcher``: one open batch
    per series, closed when full, when its labels change (a batch carries one label set) and on flush."""

    def __init__(self, producer: Sender, topics: Topics, batch_size: int) -> None:
        self.producer, self.batch_size = producer, batch_size
        self.topic_of = {name: topics.prefix + s.topic for name, s in BY_NAME.items()}
        self.sensor_of = {topic: name for name, topic in self.topic_of.items()}
        self.batcher = Batcher(batch_size, math.inf)  # no age limit: rows go out when full or on flush
        self.messages = 0
        # The label set of each GPU's open batches: compared once per row, not once per sample (a
        # recording has ~5 readings a row; the per-sample check cost the replay ~15%).
        self._labels: dict[tuple[str, str], Labels | None] = {}

    def add(self, node: str, row: GpuRow) -> None:
        gpu, labels = row.gpu, row.labels or None
        if self._labels.get((node, gpu), labels) != labels:
            self._close_gpu(node, gpu)
        self._labels[(node, gpu)] = labels
        add, topic_of, ts_ns = self.batcher.add, self.topic_of, row.ts_ns
        for sensor, value in row.values:
            full = add((topic_of[sensor], node, gpu, UTC_CLOCK, ()), labels, ts_ns, value, 0.0)
            if full is not None:
                self._send(full)

    def _close_gpu(self, node: str, gpu: str) -> None:
        """Send the GPU's open batches: a batch carries one label set."""
        for topic in self.topic_of.values():
            key: SeriesKey = (topic, node, gpu, UTC_CLOCK, ())
            open_ = self.batcher.take(key)
            if open_ is not None:
                self._send(open_)

    def _send(self, batch: OpenBatch) -> None:
        sensor, node, gpu, labels = self.sensor_of[batch.topic], batch.node, batch.key[2], batch.labels or None
        value = encode_sample(Sample(sensor, node, gpu, batch.ts_ns[0], batch.value[0], UTC_CLOCK, labels)) \
            if self.batch_size == 1 else encode_batch(SampleBatch(sensor, node, gpu, batch.ts_ns, batch.value,
                                                                  UTC_CLOCK, labels))
        self.producer.send(batch.topic, value, node)
        self.messages += 1

    def flush(self) -> None:
        for batch in self.batcher.drain():
            self._send(batch)
        self.producer.poll()


@dataclass
class ReplayResult:
    files: list[FileSummary]
    messages: int
    seconds: float
    timed: int = 0  # rows and records with a UTC time
    too_old: int = 0  # of them, older than the worker's max_age_s: it rejects them (too_old)
    past_retention: int = 0  # of them, older than gpu_frames' retention: ClickHouse drops their frames

    @property
    def ok(self) -> bool:
        return not any(f.error for f in self.files)

    def as_dict(self) -> dict[str, Any]:
        return {"files": [f.as_dict() for f in self.files], "messages": self.messages,
                "rows": sum(f.rows for f in self.files), "samples": sum(f.samples for f in self.files),
                "malformed_lines": sum(f.malformed_lines for f in self.files),
                "skipped_cells": dict(sum((f.skipped_cells for f in self.files), Counter())),
                "too_old": self.too_old, "past_retention": self.past_retention, "seconds": round(self.seconds, 3)}

    def age_warnings(self, settings: Settings) -> list[str]:
        """What a user must hear about the age of what was published: none of it would otherwise show."""
        out = []
        if self.too_old:
            out.append(f"{self.too_old} of {self.timed} rows are older than FLOPWATCH_MAX_AGE_S "
                       f"({settings.max_age_s / 86400:g} days): the worker rejects them as too_old (to the "
                       "dead-letter topic); raise it to keep them")
        if self.past_retention:
            out.append(f"{self.past_retention} of {self.timed} rows are older than the frames' retention "
                       f"(FLOPWATCH_FRAMES_RETENTION_DAYS={settings.frames_retention_days}): ClickHouse drops "
                       "their frames at its next merge; raise it to keep them")
        return out


def replay(settings: Settings, paths: list[Path], fmt: Format = "auto", speed: Speed = "max",
           node: str | None = None, tz: tzinfo | None = None, batch_size: int = 100,
           on_problem: Callable[[Problem], None] | None = None, on_bytes: Callable[[int], None] | None = None,
           sleep: Callable[[float], None] = time.sleep, monotonic: Callable[[], float] = time.monotonic,
           producer: Sender | None = None, gpus: int | None = None,
           wall_ns: Callable[[], int] = time.time_ns) -> ReplayResult:
    """Publish ``paths`` and return what was read and sent; raises ``DeliveryError`` if Kafka refused messages.
    ``gpus``: GPUs per loop iteration of nvidia-smi CSVs without an index or uuid column (else read from the
    rows' rhythm)."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    tz = tz or ZoneInfo("UTC")
    topics = Topics(settings.topic_prefix)
    producer = producer or SampleProducer(settings)
    batcher = _RowSender(producer, topics, batch_size)
    summaries: list[FileSummary] = []
    streams: list[Iterator[tuple[int, int, int, Item]]] = []
    handles = []
    for i, path in enumerate(paths):
        kind = detect_format(path) if fmt == "auto" else fmt
        summary = FileSummary(str(path), kind, node or path.stem)
        summaries.append(summary)
        try:
            handle = path.open("rb")
        except OSError as exc:
            summary.error = f"{path}: cannot open: {exc.strerror or exc}"
            continue
        handles.append(handle)
        lines = lines_of(handle, on_bytes)
        items = csv_items(path, lines, tz, summary, gpus) if kind == "nvsmi-csv" else jsonl_items(path, lines, node,
                                                                                                  summary)
        streams.append(numbered(items, i))
    t0 = monotonic()
    now = wall_ns()
    old_ns = now - int(settings.max_age_s * 1e9)
    expired_ns = now - settings.frames_retention_days * 86_400 * 1_000_000_000
    timed = too_old = past_retention = 0
    start_ts: int | None = None
    shown: Counter[str] = Counter()
    try:
        for ts, i, _, item in heapq.merge(*streams, key=lambda x: x[:3]):
            if isinstance(item, Problem):
                shown[item.source] += 1
                if on_problem is not None and shown[item.source] <= _SHOWN_PROBLEMS:
                    on_problem(item)
                continue
            if speed == "recorded" and ts:  # 0: no UTC time seen yet in its file, nothing to pace by
                start_ts = ts if start_ts is None else start_ts
                wait = (ts - start_ts) / 1e9 - (monotonic() - t0)
                if wait > 0:
                    batcher.flush()  # what was due goes out before the pause
                    sleep(wait)
            if ts:
                timed += 1
                too_old += ts < old_ns
                past_retention += ts < expired_ns
            if isinstance(item, GpuRow):
                batcher.add(summaries[i].node, item)
            else:
                producer.send(topics.prefix + item.topic, item.value, item.key)
                batcher.messages += 1
        batcher.flush()
        producer.flush()
    finally:
        for handle in handles:
            handle.close()
    for s in summaries:
        hidden = shown[s.path] - _SHOWN_PROBLEMS
        if hidden > 0 and on_problem is not None:
            on_problem(Problem(s.path, s.lines, f"{hidden} more problems not shown (counted in the summary)"))
    return ReplayResult(summaries, batcher.messages, monotonic() - t0, timed, too_old, past_retention)


def _zone(ctx: click.Context, param: click.Parameter, value: str) -> tzinfo:
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise click.BadParameter(f"{value!r} is not an IANA time zone (e.g. UTC, Europe/Berlin)") from None


@click.command("replay")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["auto", "jsonl", "nvsmi-csv"]), default="auto",
              show_default=True, help="auto: .csv is nvidia-smi CSV, .jsonl/.ndjson/.json JSON lines, "
                                      "otherwise a first line starting with '{' is JSON lines.")
@click.option("--speed", type=click.Choice(["recorded", "max"]), default="max", show_default=True,
              help="recorded: keep the recorded spacing between rows; max: as fast as Kafka takes it.")
@click.option("--node", default=None, help="Node name (the Kafka key) [default: each file's name without "
                                          "extension, e.g. node-07.csv -> node-07].")
@click.option("--tz", "tz", default="UTC", show_default=True, callback=_zone,
              help="IANA zone of nvidia-smi's local-time timestamps (the recording host's zone).")
@click.option("--batch-size", type=click.IntRange(min=1), default=100, show_default=True,
              help="Samples per message (1 = single-sample form).")
@click.option("--gpus", type=click.IntRange(min=1), default=None,
              help="GPUs per loop iteration of an nvidia-smi CSV without an index or uuid column [default: read "
                   "from the rows' rhythm]; an index or uuid column always wins.")
@click.pass_context
def replay_command(ctx: click.Context, files: tuple[Path, ...], fmt: Format, speed: Speed, node: str | None,
                   tz: tzinfo, batch_size: int, gpus: int | None) -> None:
    """Publish recorded telemetry (nvidia-smi CSV or JSON lines) to the sensor topics."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from agents.kafka.admin import ensure_topics

    settings: Settings = ctx.obj
    ensure_topics(settings)
    console = Console(stderr=True, soft_wrap=True)  # file:line messages stay one line each, for grep
    total = sum(p.stat().st_size for p in files if p.is_file())
    with Progress(TextColumn("replay"), BarColumn(), DownloadColumn(), TimeRemainingColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("replay", total=total)
        pending = [0]

        def on_bytes(n: int) -> None:  # the bar redraws a few times a second; add up between updates
            pending[0] += n
            if pending[0] >= 1 << 16:
                bar.advance(task, pending[0])
                pending[0] = 0

        try:
            result = replay(settings, list(files), fmt, speed, node, tz, batch_size,
                            on_problem=lambda p: console.print(str(p), markup=False, highlight=False),
                            on_bytes=on_bytes, gpus=gpus)
        except DeliveryError as exc:
            console.print(f"replay: Kafka did not take every message: {exc}", markup=False)
            sys.exit(1)
    for f in result.files:
        if f.error:
            console.print(f"replay: {f.error}", markup=False)
        if f.unknown_columns:
            console.print(f"{f.path}: columns with no catalog sensor, ignored: {', '.join(f.unknown_columns)}",
                          markup=False)
    for warning in result.age_warnings(settings):
        console.print(f"replay: WARNING: {warning}", markup=False, highlight=False, style="bold red")
    d = result.as_dict()
    console.print(f"replay: {d['rows']} rows, {d['samples']} samples, {d['messages']} messages in "
                  f"{d['seconds']} s; {d['malformed_lines']} malformed lines skipped; skipped cells: "
                  f"{d['skipped_cells'] or 'none'}", markup=False, highlight=False)
    click.echo(orjson.dumps(d).decode())
    if not result.ok:
        sys.exit(1)
