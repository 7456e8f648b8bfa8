r"""The price book: USD per GPU-hour by model and region, and specs of GPUs SPECS lacks.

A TOML file the user edits (``schemas/prices.example.toml`` is the shipped example)::

    version = 1
    currency = "USD"
    [default]                 # used where a region has no entry
    H100-SXM = 3.90
    [regions.us-east]
    H100 = 3.50               # any name spec_for knows: canonical, short or NVML's
    "NVIDIA L4" = 0.85        # (a name with spaces needs quotes)
    [gpus."My-Custom"]        # a GPU not in SPECS (or corrected figures for one that is)
    peak_tflops = { bf16 = 400.0, fp8 = 800.0 }
    tdp_w = 350
    memory_gib = 48
    pcie_gb_s = 32

Every mistake is a ``PriceBookError`` naming the file and line: a price key no model
resolves to is one (a typo must not silently price nothing).

>>> book = parse_price_book(
...     'version = 1\n[default]\nH100 = 3.9\n[regions.eu]\n"NVIDIA H100 80GB HBM3" = 4.2\n', "prices.toml")
>>> book.hourly_usd("H100-SXM", "eu"), book.hourly_usd("h100", "us-west"), book.hourly_usd("L4", None)
(4.2, 3.9, None)
>>> def check(text):
...     try:
...         parse_price_book(text, "prices.toml")
...     except PriceBookError as err:
...         print(err)
>>> check('version = 1\n[default]\nH100-SXN = 3.9\n')
prices.toml:3: unknown GPU model 'H100-SXN' in [default]: no spec in schemas.gpus nor a [gpus] table
>>> check('version = 1\n[default]\nNVIDIA L4 = 0.8\n')  # doctest: +NORMALIZE_WHITESPACE
prices.toml:3: invalid TOML: Expected '=' after a key in a key/value pair (column 8);
quote names with spaces: "NVIDIA L4" = ...
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from schemas.gpus import PRECISIONS, GpuSpec, model_key, spec_for

VERSION: Final = 1
CURRENCY: Final = "USD"
_TOP_KEYS: Final = ("version", "currency", "default", "regions", "gpus")
_SPEC_NUMBERS: Final = ("tdp_w", "memory_gib", "pcie_gb_s")
_SPEC_KEYS: Final = ("peak_tflops", *_SPEC_NUMBERS, "source")
Key = tuple[str, ...]  # a key's path from the document root, e.g. ("regions", "us-east", "H100")


class PriceBookError(ValueError):
    """A price book that cannot be used: ``path:line: what is wrong`` (no line when unknown)."""

    def __init__(self, path: str, line: int | None, what: str) -> None:
        super().__init__(f"{path}:{line}: {what}" if line is not None else f"{path}: {what}")
        self.path, self.line, self.what = path, line, what


@dataclass(frozen=True, slots=True)
class PriceBook:
    """Hourly prices (USD per GPU-hour) by canonical model; ``custom`` specs shadow SPECS."""

    source: str
    default: Mapping[str, float]
    regions: Mapping[str, Mapping[str, float]]  # region name (lower case) -> model -> USD per hour
    custom: Mapping[str, GpuSpec]  # model_key -> spec

    def model(self, gpu_model: str) -> str | None:
        """The canonical name prices are kept under: a custom GPU's as written, else SPECS's."""
        spec = self.spec(gpu_model)
        return None if spec is None else spec.model

    def spec(self, gpu_model: str) -> GpuSpec | None:
        custom = self.custom.get(model_key(gpu_model))
        if custom is not None:
            return custom
        shipped = spec_for(gpu_model)
        if shipped is None:
            return None
        return self.custom.get(model_key(shipped.model), shipped)  # a [gpus] table may correct a shipped spec

    def hourly_usd(self, gpu_model: str, region: str | None = None) -> float | None:
        """The region's price, else the default table's, else None (unknown model or no price)."""
        model = self.model(gpu_model)
        if model is None:
            return None
        in_region = self.regions.get(region.strip().lower(), {}) if region else {}
        return in_region.get(model, self.default.get(model))


def parse_price_book(text: str, source: str) -> PriceBook:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line, what = _toml_error(exc)
        raise PriceBookError(source, line, f"invalid TOML: {what}{_quote_hint(text, line)}") from None
    return _Parser(text, source).book(data)


_AT: Final = re.compile(r"\s*\(at line (\d+), column (\d+)\)$|\s*\(at end of document\)$")


def _toml_error(exc: tomllib.TOMLDecodeError) -> tuple[int | None, str]:
    """Line and message of a TOML syntax error: Python 3.14 has ``lineno``; older ones only say it."""
    msg = str(exc.args[0]) if exc.args else str(exc)
    lineno = getattr(exc, "lineno", None)
    m = _AT.search(msg)
    if m is None:
        return (lineno if isinstance(lineno, int) else None), msg
    what = msg[:m.start()]
    if m.group(1) is None:
        return None, f"{what} (at end of document)"
    return int(m.group(1)), f"{what} (column {m.group(2)})"


_UNQUOTED_SPACED: Final = re.compile(r"^\s*([A-Za-z0-9_-]+(?:[ \t]+[A-Za-z0-9_-]+)+)\s*=")


def _quote_hint(text: str, line: int | None) -> str:
    """NVML's names have spaces, which a bare TOML key cannot: say how to write them."""
    lines = text.splitlines()
    if line is None or not 0 < line <= len(lines):
        return ""
    m = _UNQUOTED_SPACED.match(lines[line - 1])
    return "" if m is None else f'; quote names with spaces: "{m.group(1)}" = ...'


class _Parser:
    """Checks a decoded document; every error carries the line of the key it is about."""

    def __init__(self, text: str, source: str) -> None:
        self.text, self.source = text, source
        self.custom: dict[str, GpuSpec] = {}

    def fail(self, key: Key, what: str) -> PriceBookError:
        return PriceBookError(self.source, find_line(self.text, key), what)

    def book(self, data: Mapping[str, object]) -> PriceBook:
        self.header(data)
        gpus = data.get("gpus", {})
        for name, table in self.table(("gpus",), gpus).items():
            self.add_custom(name, table)
        default = self.prices(("default",), data.get("default", {}))
        regions: dict[str, Mapping[str, float]] = {}
        seen: dict[str, str] = {}
        for name, table in self.table(("regions",), data.get("regions", {})).items():
            region = name.strip().lower()
            if not region or region in seen:
                raise self.fail(("regions", name), f"region {name!r}: " + (
                    f"same as {seen[region]!r} (region names ignore case)" if region else "empty name"))
            seen[region] = name
            regions[region] = self.prices(("regions", name), table)
        return PriceBook(self.source, default, MappingProxyType(regions), MappingProxyType(self.custom))

    def header(self, data: Mapping[str, object]) -> None:
        for key in data:
            if key not in _TOP_KEYS:
                # The usual slip behind an unknown table: [us-east] for [regions.us-east].
                hint = f" (a region's prices go under [regions.{key}])" if isinstance(data[key], dict) else ""
                raise self.fail((key,), f"unknown top-level key {key!r}{hint}; expected {', '.join(_TOP_KEYS)}")
        version = data.get("version")
        if version is None:
            raise PriceBookError(self.source, 1, f"missing 'version = {VERSION}' (the format this file is in)")
        if type(version) is not int or version != VERSION:
            raise self.fail(("version",), f"version = {version!r}: this flopwatch reads price book version {VERSION}")
        currency = data.get("currency", CURRENCY)
        if currency != CURRENCY:
            raise self.fail(("currency",), f"currency = {currency!r}: prices must be in {CURRENCY}")

    def table(self, key: Key, value: object) -> dict[str, dict[str, object]]:
        """A table of tables (``[regions.*]``, ``[gpus.*]``)."""
        if not isinstance(value, dict):
            raise self.fail(key, f"{'.'.join(key)} must be a table, not {_kind(value)}")
        for name, sub in value.items():
            if not isinstance(sub, dict):
                raise self.fail((*key, name), f"{_dotted((*key, name))} must be a table, not {_kind(sub)}")
        return value

    def prices(self, key: Key, value: object) -> Mapping[str, float]:
        if not isinstance(value, dict):
            raise self.fail(key, f"{_dotted(key)} must be a table of prices, not {_kind(value)}")
        out: dict[str, float] = {}
        named: dict[str, str] = {}
        for name, raw in value.items():
            where = (*key, name)
            model = self.resolve(name)
            if model is None:
                raise self.fail(where, f"unknown GPU model {name!r} in [{_dotted(key)}]: "
                                       "no spec in schemas.gpus nor a [gpus] table")
            if model in named:
                raise self.fail(where, f"{name!r} and {named[model]!r} in [{_dotted(key)}] both name {model}")
            named[model] = name
            out[model] = self.number(where, raw, f"price of {name}", allow_zero=True)
        return MappingProxyType(out)

    def resolve(self, name: str) -> str | None:
        custom = self.custom.get(model_key(name))
        if custom is not None:
            return custom.model
        shipped = spec_for(name)
        return None if shipped is None else shipped.model

    def number(self, key: Key, raw: object, what: str, allow_zero: bool = False) -> float:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise self.fail(key, f"{what} must be a number, not {_kind(raw)}")
        val = float(raw)
        if not math.isfinite(val) or val < 0 or (val == 0 and not allow_zero):
            bound = "0 or more" if allow_zero else "more than 0"
            raise self.fail(key, f"{what} = {raw!r}: must be a finite number, {bound}")
        return val

    def add_custom(self, name: str, table: dict[str, object]) -> None:
        key: Key = ("gpus", name)
        for field in table:
            if field not in _SPEC_KEYS:
                raise self.fail((*key, field), f"unknown key {field!r} in [gpus.{name}]; "
                                               f"expected {', '.join(_SPEC_KEYS)}")
        missing = [f for f in ("peak_tflops", *_SPEC_NUMBERS) if f not in table]
        if missing:
            raise self.fail(key, f"[gpus.{name}] lacks {', '.join(missing)}")
        peaks = table["peak_tflops"]
        if not isinstance(peaks, dict) or not peaks:
            raise self.fail((*key, "peak_tflops"), f"peak_tflops of {name} must be a table of precision = TFLOP/s")
        for precision in peaks:
            if precision not in PRECISIONS:
                raise self.fail((*key, "peak_tflops", precision),
                                f"unknown precision {precision!r} for {name}; expected {', '.join(PRECISIONS)}")
        peak = {p: self.number((*key, "peak_tflops", p), v, f"peak {p} of {name}") for p, v in peaks.items()}
        nums = [self.number((*key, f), table[f], f"{f} of {name}") for f in _SPEC_NUMBERS]
        source = table.get("source", f"price book {self.source}")
        if not isinstance(source, str):
            raise self.fail((*key, "source"), f"source of {name} must be a string, not {_kind(source)}")
        shipped = spec_for(name)  # a shipped model's own table corrects its figures under its name
        model = name if shipped is None else shipped.model
        if model_key(model) in self.custom:
            raise self.fail(key, f"[gpus.{name}] defines {model} a second time")
        self.custom[model_key(model)] = GpuSpec(model, peak, nums[0], nums[1], nums[2], source)


def _kind(value: object) -> str:
    return {bool: "a boolean", str: "a string", int: "a number", float: "a number", dict: "a table",
            list: "an array"}.get(type(value), type(value).__name__)


def _dotted(key: Key) -> str:
    return ".".join(k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else f'"{k}"' for k in key)


# --- where a key is ------------------------------------------------------------------------------------------------

_KEY_PART: Final = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_KEY_LINE: Final = re.compile(rf"^\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*=")


def find_line(text: str, key: Key) -> int | None:
    """The 1-based line that defines ``key`` (or, failing that, its nearest enclosing table).

    Decoded values carry no positions, so the text is scanned: each table header and each
    ``key =`` line gets its full path, and the line sharing the longest path with ``key`` wins.

    >>> find_line('version = 1\\n[regions."us-east"]\\nH100 = -1\\n[gpus.X]\\n', ("regions", "us-east", "H100"))
    3
    >>> find_line('[gpus.X]\\npeak_tflops = { bf16 = -1 }\\n', ("gpus", "X", "peak_tflops", "bf16"))
    2
    """
    best, best_line = 0, None
    table: Key = ()
    for n, line in enumerate(text.splitlines(), 1):
        header = _header_path(line)
        if header is not None:
            table = path = header
        else:
            rel = _key_path(line)
            if rel is None:
                continue
            path = (*table, *rel)
        shared = min(len(path), len(key))
        if path[:shared] == key[:shared] and shared > best:
            best, best_line = shared, n
    return best_line


def _header_path(line: str) -> Key | None:
    if not line.lstrip().startswith("["):
        return None
    try:
        doc = tomllib.loads(line)  # a header alone is a document: TOML itself unquotes its keys
    except tomllib.TOMLDecodeError:
        return None
    return _walk(doc)


def _key_path(line: str) -> Key | None:
    m = _KEY_LINE.match(line)
    if m is None:
        return None
    try:
        doc = tomllib.loads(f"{m.group(1)} = 0")
    except tomllib.TOMLDecodeError:
        return None
    return _walk(doc)


def _walk(doc: object) -> Key:
    path: list[str] = []
    while isinstance(doc, dict) and len(doc) == 1:
        name, doc = next(iter(doc.items()))
        path.append(name)
    return tuple(path)
