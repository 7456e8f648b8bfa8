"""The CSV that ``nvidia-smi --query-gpu=... --format=csv -lms 100`` writes, read into GPU rows.

Pure: lines in, ``GpuRow`` and ``Problem`` out, time zone as an argument. What it
accepts is what nvidia-smi prints, and the ways recordings go wrong:

- a header naming the fields, with units in brackets (``power.draw [W]``), or without
  them (``--format=csv,nounits``); values with units (``312.45 W``, ``45 %``) or bare;
- spaces after the commas; blank lines; CRLF line ends; a UTF-8 byte-order mark;
- cells nvidia-smi could not fill (``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``,
  ``[GPU is lost]``): skipped and counted by reason, the rest of the row kept;
- ``timestamp`` in nvidia-smi's local-time format ``2026/12/03 14:05:06.123`` (fraction
  optional), in the zone given (nvidia-smi writes the host's local time, with no offset);
- with an ``uuid`` column (the GPU's id), else an ``index`` column, else neither: then
  the GPUs are told apart by position in a fixed cycle of N rows (nvidia-smi writes GPU 0
  first in every loop iteration), N read from the recording's rhythm (``nvsmi_cycle``) or
  given (``gpus``), and a warning says the file has no GPU id; equal timestamps are no
  guide, since the rows of one iteration are often stamped milliseconds apart;
- the header repeated (concatenated recordings): skipped; a different header: taken
  from there on, and reported;
- a malformed line (wrong cell count, bad timestamp): reported with its line and skipped.

Fields map to catalog sensors by ``NVSMI_FIELDS``; other columns are reported once and
ignored. ``name`` becomes the ``gpu_model`` label.

>>> from datetime import timezone
>>> reader = NvsmiCsvReader("gpu.csv", timezone.utc)
>>> out = list(reader.read([
...     "timestamp, index, name, power.draw [W], utilization.gpu [%], fan.speed [%]",
...     "2026/12/03 14:05:06.100, 0, NVIDIA H200, 312.45 W, [N/A], 30 %",
...     "2026/12/03 14:05:06.100, 1",
... ]))
>>> row, problem = out[0], out[1]
>>> row.gpu, row.ts_ns, row.values, row.labels
('0', 1796306706100000000, (('power', 312.45),), {'gpu_model': 'NVIDIA H200'})
>>> str(problem)
'gpu.csv:3: malformed line: 2 cells, the header has 6'
>>> dict(reader.report.skipped_cells), reader.report.unknown_columns
({'N/A': 1}, ['fan.speed'])
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Final

from schemas.catalog import BY_NAME
from schemas.counters import Counters
from schemas.records import Labels
from streams.formats.nvsmi_cycle import Cycle, infer_cycle

# nvidia-smi query field -> (catalog sensor, the unit the catalog wants). Aliases are the
# names nvidia-smi has used across driver releases for the same reading.
NVSMI_FIELDS: Final[dict[str, tuple[str, str]]] = {
    "utilization.gpu": ("gpu_util", "%"),
    "memory.used": ("fb_used", "MiB"),
    "power.draw": ("power", "W"),
    "power.draw.average": ("power", "W"),
    "power.draw.instant": ("power", "W"),
    "temperature.gpu": ("temperature", "C"),
    "clocks.sm": ("sm_clock", "MHz"),
    "clocks.current.sm": ("sm_clock", "MHz"),
    # The volatile ECC totals: their sum is the catalog's counter (corrected + uncorrected).
    "ecc.errors.corrected.volatile.total": ("ecc_errors", ""),
    "ecc.errors.uncorrected.volatile.total": ("ecc_errors", ""),
}
# Conversions into the catalog's unit, by the unit a value or header names.
_UNITS: Final[dict[str, dict[str, float]]] = {
    "%": {"%": 1.0},
    "MiB": {"MiB": 1.0, "KiB": 1 / 1024, "GiB": 1024.0, "B": 1 / 1024**2},
    "W": {"W": 1.0, "mW": 1e-3, "kW": 1e3},
    "C": {"C": 1.0},
    "MHz": {"MHz": 1.0, "kHz": 1e-3, "GHz": 1e3},
    "": {"": 1.0},
}
_LABEL_FIELDS: Final = {"name": "gpu_model"}
_ID_FIELDS: Final = ("uuid", "index")  # the first present names the GPU
_KNOWN: Final = frozenset({"timestamp", *NVSMI_FIELDS, *_LABEL_FIELDS, *_ID_FIELDS})
_NS: Final = 1_000_000_000
CYCLE_WINDOW: Final = 4096  # rows read ahead to find an index-less file's cycle (~64 iterations of 64 GPUs)


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One GPU at one tick: its readings as (sensor, value) in the catalog's units."""

    line: int
    ts_ns: int
    gpu: str
    values: tuple[tuple[str, float], ...]
    labels: Labels


@dataclass(frozen=True, slots=True)
class Problem:
    """Something in the file the replay could not use; ``str()`` names file and line."""

    source: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.what}"


@dataclass(slots=True)
class ParseReport(Counters):
    """What a read found: counts for the replay's summary."""

    lines: int = 0
    rows: int = 0
    samples: int = 0
    malformed_lines: int = 0
    repeated_headers: int = 0
    skipped_cells: Counter[str] = field(default_factory=Counter)
    unknown_columns: list[str] = field(default_factory=list)
    time_went_back: int = 0  # rows stamped before the row before them (a clock step, a DST fall-back)


class CsvFormatError(ValueError):
    """The file cannot be read at all (no header, no timestamp column); names file and line."""


@dataclass(frozen=True, slots=True)
class _Column:
    index: int
    sensor: str  # "" for a non-sensor column
    scale: float  # header unit -> catalog unit, when values come without a unit
    unit: str  # the catalog unit of the sensor


@dataclass(slots=True)
class _Header:
    cells: tuple[str, ...]
    ts: int
    gpu_id: int  # column index of uuid/index; -1: numbered by position in the tick
    labels: tuple[tuple[int, str], ...]
    sensors: tuple[_Column, ...]


class NvsmiCsvReader:
    """Reads one nvidia-smi CSV file's lines; ``report`` counts what it found."""

    def __init__(self, source: str, tz: tzinfo, gpus: int | None = None) -> None:
        if gpus is not None and gpus < 1:
            raise ValueError(f"gpus must be >= 1, got {gpus}")
        self.source = source
        self.tz = tz
        self.gpus = gpus  # GPUs per loop iteration of an index-less file, as the caller states it
        self.report = ParseReport()
        self._header: _Header | None = None
        self._seen_unknown: set[str] = set()
        self._epoch_s: dict[str, int] = {}  # "YYYY/MM/DD HH:MM:SS" -> UTC seconds: one zone lookup per second
        # An index-less file: rows since its header, the cycle (None: not known yet), rows read ahead to find it.
        self._pos = 0
        self._cycle: int | None = None
        self._ahead: list[tuple[int, list[str]]] = []
        self._header_line = 0
        self._last_ts = -(2**63)

    def read(self, lines: Iterable[str], first_line: int = 1) -> Iterator[GpuRow | Problem]:
        """Rows and problems in file order; raises ``CsvFormatError`` if there is no usable header."""
        for no, raw in enumerate(lines, first_line):
            self.report.lines += 1
            line = raw.rstrip("\r\n")
            if no == first_line:
                line = line.removeprefix("\ufeff")
            if not line.strip():
                continue
            cells = [c.strip() for c in line.split(",")]
            if self._header is None or self._looks_like_header(cells):
                yield from self._read_ahead_rows()
                problem = self._take_header(no, cells)
                if problem is not None:
                    yield problem
                continue
            if self._header.gpu_id < 0 and self._cycle is None:
                self._ahead.append((no, cells))
                if len(self._ahead) >= CYCLE_WINDOW:
                    yield from self._read_ahead_rows()
                continue
            yield self._counted(no, cells, self._header)
        yield from self._read_ahead_rows()

    def _counted(self, no: int, cells: list[str], h: _Header) -> GpuRow | Problem:
        out = self._row(no, cells, h)
        if isinstance(out, Problem):
            self.report.malformed_lines += 1
        return out

    def _read_ahead_rows(self) -> Iterator[GpuRow | Problem]:
        """Find the cycle from the rows read ahead, then give them."""
        if not self._ahead:
            return
        h = self._header
        assert h is not None
        # Every line keeps its place (a malformed one was some GPU's row too): None where it cannot say.
        full = [len(cells) == len(h.cells) for _, cells in self._ahead]
        stamps = [self._ts_ns(cells[h.ts]) if ok else None for ok, (_, cells) in zip(full, self._ahead, strict=True)]
        readings = [tuple(_reading(cells[c.index], c) if ok else None for c in h.sensors)
                    for ok, (_, cells) in zip(full, self._ahead, strict=True)]
        cycle = infer_cycle(stamps, readings if h.sensors else None) or Cycle(1, 1, None, "one row")
        yield self._cycle_note(cycle)
        self._cycle = self.gpus or cycle.gpus
        ahead, self._ahead = self._ahead, []
        for no, cells in ahead:
            yield self._counted(no, cells, h)

    def _cycle_note(self, cycle: Cycle) -> Problem:
        what = "no index or uuid column: GPUs told apart by their position in each loop iteration, "
        if self.gpus is not None:
            found = "" if cycle.gpus == self.gpus or cycle.ambiguous else f" (the file suggests {cycle.gpus})"
            return Problem(self.source, self._header_line, what + f"{self.gpus} as stated{found}")
        if cycle.ambiguous:
            raise CsvFormatError(
                f"{self.source}:{self._header_line}: no index or uuid column, and the file does not tell how "
                f"many GPUs write each loop iteration ({cycle.evidence}): state it with --gpus N, or record "
                "with --query-gpu=timestamp,index,...")
        return Problem(self.source, self._header_line,
                       what + f"{cycle.gpus}: {cycle.evidence} (--gpus N states it)")

    def _looks_like_header(self, cells: list[str]) -> bool:
        assert self._header is not None
        return cells[0] == self._header.cells[0] or cells[0].split(" [")[0] in _KNOWN

    def _take_header(self, no: int, cells: list[str]) -> Problem | None:
        names = tuple(c.split(" [")[0].strip() for c in cells)
        # A header starts nvidia-smi's loop again (a restart, a reboot): GPU 0 comes next, and an index-less
        # file's GPU count may have changed.
        self._pos, self._cycle, self._header_line = 0, None, no
        if self._header is not None and names == self._header.cells:
            self.report.repeated_headers += 1
            return None
        if "timestamp" not in names:
            raise CsvFormatError(f"{self.source}:{no}: expected nvidia-smi's CSV header with a 'timestamp' "
                                 f"column (--query-gpu=timestamp,... --format=csv), got {','.join(cells)[:80]!r}")
        changed = self._header is not None
        gpu_id = next((names.index(f) for f in _ID_FIELDS if f in names), -1)
        labels = tuple((i, _LABEL_FIELDS[n]) for i, n in enumerate(names) if n in _LABEL_FIELDS)
        sensors = []
        for i, (name, cell) in enumerate(zip(names, cells, strict=True)):
            if name in NVSMI_FIELDS:
                sensor, unit = NVSMI_FIELDS[name]
                head_unit = cell[len(name):].strip().strip("[]").strip()
                scale = _UNITS[unit].get(head_unit, 1.0) if head_unit else 1.0
                sensors.append(_Column(i, sensor, scale, unit))
            elif name not in _KNOWN and name not in self._seen_unknown:
                self._seen_unknown.add(name)
                self.report.unknown_columns.append(name)
        self._header = _Header(names, names.index("timestamp"), gpu_id, tuple(labels), tuple(sensors))
        if changed:
            return Problem(self.source, no, "a different header: read the following lines with it")
        return None

    def _row(self, no: int, cells: list[str], h: _Header) -> GpuRow | Problem:
        # Every data line holds a place in the cycle, a malformed one too: it was some GPU's row.
        self._pos += 1
        if len(cells) != len(h.cells):
            return Problem(self.source, no, f"malformed line: {len(cells)} cells, the header has {len(h.cells)}")
        text = cells[h.ts]
        ts = self._ts_ns(text)
        if ts is None:
            return Problem(self.source, no, f"malformed line: timestamp {text!r} is not YYYY/MM/DD HH:MM:SS[.fff]")
        if h.gpu_id >= 0:
            gpu = cells[h.gpu_id]
            if not gpu or gpu.startswith("["):
                return Problem(self.source, no, f"malformed line: no GPU id in column {h.cells[h.gpu_id]!r}")
        else:
            gpu = str((self._pos - 1) % (self._cycle or 1))
        if ts < self._last_ts:
            self.report.time_went_back += 1
        self._last_ts = ts
        values: dict[str, float] = {}
        skipped = self.report.skipped_cells
        for col in h.sensors:
            v = _value(cells[col.index], col)
            if isinstance(v, str):
                skipped[v] += 1
                continue
            spec = BY_NAME[col.sensor]
            if not spec.lo <= v <= spec.hi:  # one such value would get the whole batch message rejected
                skipped["out_of_range"] += 1
                continue
            values[col.sensor] = values.get(col.sensor, 0.0) + v  # ECC: corrected + uncorrected
        labels: Labels = {key: cells[i] for i, key in h.labels if cells[i] and not cells[i].startswith("[")}
        self.report.rows += 1
        self.report.samples += len(values)
        return GpuRow(no, ts, gpu, tuple(values.items()), labels)

    def _ts_ns(self, text: str) -> int | None:
        whole, _, frac = text.partition(".")
        secs = self._epoch_s.get(whole)
        if secs is None:
            try:
                naive = datetime.strptime(whole, "%Y/%m/%d %H:%M:%S")  # noqa: DTZ007 (the zone is attached next)
            except ValueError:
                return None
            secs = int(naive.replace(tzinfo=self.tz).timestamp())
            self._epoch_s[whole] = secs
        if frac and not (frac.isdigit() and len(frac) <= 9):
            return None
        return secs * _NS + (int(frac.ljust(9, "0")) if frac else 0)


def _reading(cell: str, col: _Column) -> float | None:
    v = _value(cell, col)
    return None if isinstance(v, str) else v


def _value(cell: str, col: _Column) -> float | str:
    """The cell in the catalog's unit, or why it was skipped (the reason counted in the summary)."""
    if cell.startswith("["):
        return cell.strip("[]") or "empty"
    if not cell:
        return "empty"
    number, _, unit = cell.partition(" ")
    try:
        v = float(number)
    except ValueError:
        return "unparsable"
    if unit:
        scale = _UNITS[col.unit].get(unit.strip())
        if scale is None:
            return "unknown_unit"
    else:
        scale = col.scale
    v *= scale
    return v if math.isfinite(v) else "unparsable"


def tick_spacing_ns(prev_ts_ns: int | None, ts_ns: int) -> int:
    """How long a replay at recorded speed waits before a row: the gap to the previous one, never negative.

    >>> tick_spacing_ns(None, 5), tick_spacing_ns(100, 250), tick_spacing_ns(300, 250)
    (0, 150, 0)
    """
    return 0 if prev_ts_ns is None else max(0, ts_ns - prev_ts_ns)
