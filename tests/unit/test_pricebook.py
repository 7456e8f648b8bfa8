"""Price book: parsing, lookups with region fallback, custom GPUs, and errors that name file and line."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

import pytest

from agents.ingest.pricebook_file import load_price_book
from schemas.gpus import SPECS, peak_tflops
from schemas.pricebook import PriceBook, PriceBookError, _toml_error, find_line, parse_price_book

BOOK = """\
# test prices
version = 1
currency = "USD"

[default]
H100-SXM = 3.90
A100 = 2.0                        # short name: A100-SXM-80GB
"NVIDIA L4" = 0.80                # NVML's name
T4 = 0

[regions.us-east]
H100 = 3.50

[regions."EU-West"]
"NVIDIA H100 80GB HBM3" = 4.20
L40S = 1.75

[gpus."My-Custom"]
peak_tflops = { bf16 = 400.0, fp8 = 800 }
tdp_w = 350
memory_gib = 48
pcie_gb_s = 32
source = "my lab, 2025"

[gpus.A10G]                       # my own figures for a shipped model
peak_tflops.bf16 = 72.0
tdp_w = 150
memory_gib = 24
pcie_gb_s = 32
"""


@pytest.fixture
def book() -> PriceBook:
    return parse_price_book(BOOK, "prices.toml")


def test_default_prices_under_any_name_of_the_model(book: PriceBook) -> None:
    assert book.source == "prices.toml"
    assert book.hourly_usd("H100-SXM", None) == 3.90
    assert book.hourly_usd("A100-SXM-80GB", None) == book.hourly_usd("NVIDIA A100-SXM4-80GB", None) == 2.0
    assert book.hourly_usd("L4", None) == 0.80
    assert book.hourly_usd("T4", None) == 0.0  # a free GPU (owned, written off) is a price, not a missing one
    assert dict(book.default) == {"H100-SXM": 3.90, "A100-SXM-80GB": 2.0, "L4": 0.80, "T4": 0.0}


def test_region_entry_else_default_else_none(book: PriceBook) -> None:
    assert book.hourly_usd("NVIDIA H100 80GB HBM3", "us-east") == 3.50
    assert book.hourly_usd("H100", "eu-west") == 4.20  # region names ignore case
    assert book.hourly_usd("H100-SXM", "ap-south") == 3.90  # unknown region: default
    assert book.hourly_usd("A100", "us-east") == 2.0  # region without the model: default
    assert book.hourly_usd("L40S", "eu-west") == 1.75
    assert book.hourly_usd("L40S", "us-east") is None  # neither region nor default
    assert book.hourly_usd("H100-SXM", "") == book.hourly_usd("H100-SXM") == 3.90
    assert set(book.regions) == {"us-east", "eu-west"}


def test_unknown_model_has_no_price_nor_spec(book: PriceBook) -> None:
    assert book.hourly_usd("NVIDIA B200", None) is None
    assert book.spec("NVIDIA B200") is None and book.model("NVIDIA B200") is None


def test_custom_gpu_spec_and_price(book: PriceBook) -> None:
    spec = book.spec("my-custom")
    assert spec is not None and spec.model == "My-Custom"
    assert dict(spec.peak_tflops) == {"bf16": 400.0, "fp8": 800.0}
    assert (spec.tdp_w, spec.memory_gib, spec.pcie_gb_s, spec.source) == (350, 48, 32, "my lab, 2025")
    assert peak_tflops(spec, "fp16") == 400.0 and peak_tflops(spec, "int8") is None
    assert book.hourly_usd("My-Custom", None) is None  # specified but not priced
    priced = parse_price_book(BOOK + '\n[regions.lab]\nMY-CUSTOM = 0.5\n', "p.toml")
    assert priced.hourly_usd("My-Custom", "lab") == 0.5


def test_a_custom_table_corrects_a_shipped_spec_under_every_name(book: PriceBook) -> None:
    for name in ("A10G", "NVIDIA A10G", "a10g"):
        spec = book.spec(name)
        assert spec is not None and spec.model == "A10G" and spec.tdp_w == 150
        assert dict(spec.peak_tflops) == {"bf16": 72.0}
        assert spec.source == "price book prices.toml"
    assert book.spec("H100") is SPECS["H100-SXM"]  # the rest come from SPECS


def test_minimal_book_and_an_empty_one() -> None:
    assert parse_price_book("version = 1\n", "p").hourly_usd("H100") is None
    book = parse_price_book("version = 1\n[regions.x]\nT4 = 0.3\n", "p")
    assert book.hourly_usd("T4", "x") == 0.3 and book.hourly_usd("T4", None) is None


def test_values_are_read_only(book: PriceBook) -> None:
    with pytest.raises(TypeError):
        book.default["H100-SXM"] = 1.0  # type: ignore[index]
    with pytest.raises(TypeError):
        book.regions["new"] = {}  # type: ignore[index]


# --- errors: each names the file and the line of the offending key ------------------------------------------------

BAD_CUSTOM_HEAD = "version = 1\n[gpus.X]\n"
GOOD_CUSTOM_REST = "tdp_w = 300\nmemory_gib = 48\npcie_gb_s = 32\n"


@pytest.mark.parametrize(("text", "line", "match"), [
    # syntax
    ("version = 1\n[default]\nH100 = = 3\n", 3, r"invalid TOML: .*\(column 8\)"),
    ("version = 1\n[default]\nNVIDIA L4 = 0.8\n", 3, r'quote names with spaces: "NVIDIA L4" = \.\.\.'),
    ("version = 1\n[default]\n[default]\n", 3, "invalid TOML"),
    # the header
    ("[default]\nH100 = 3\n", 1, r"missing 'version = 1'"),
    ("# v2\nversion = 2\n", 2, r"version = 2: this flopwatch reads price book version 1"),
    ('version = "1"\n', 1, r"version = '1'"),
    ("version = 1\ncurrency = 'EUR'\n", 2, r"currency = 'EUR': prices must be in USD"),
    ("version = 1\n\n[us-east]\nH100 = 3\n", 3, r"unknown top-level key 'us-east' \(a region's prices go under "
                                                 r"\[regions.us-east\]\)"),
    ("version = 1\nprice = 3\n", 2, r"unknown top-level key 'price'; expected version, currency, default"),
    # tables of the wrong kind
    ("version = 1\ndefault = 3\n", 2, r"default must be a table of prices, not a number"),
    ("version = 1\nregions = 'us'\n", 2, r"regions must be a table, not a string"),
    ("version = 1\n[regions]\nus-east = 3\n", 3, r"regions.us-east must be a table, not a number"),
    ("version = 1\n[regions.a]\nT4 = 1\n[regions.A]\nT4 = 2\n", 4, r"region 'A': same as 'a'"),
    # prices
    ("version = 1\n[default]\nT4 = 1\nH100-SXN = 3.9\n", 4, r"unknown GPU model 'H100-SXN' in \[default\]"),
    ("version = 1\n[regions.eu]\nT4 = 1\n\n'NVIDIA T5' = 2\n", 5, r"unknown GPU model 'NVIDIA T5' in \[regions.eu\]"),
    ("version = 1\n[default]\nH100-SXM = -3.5\n", 3, r"price of H100-SXM = -3.5: must be a finite number, 0 or more"),
    ("version = 1\n[default]\nT4 = nan\n", 3, r"price of T4 = nan: must be a finite number"),
    ("version = 1\n[default]\nT4 = inf\n", 3, r"price of T4 = inf"),
    ("version = 1\n[default]\nT4 = '0.5'\n", 3, r"price of T4 must be a number, not a string"),
    ("version = 1\n[default]\nT4 = true\n", 3, r"price of T4 must be a number, not a boolean"),
    ("version = 1\n[default]\nH100-SXM = 3\nH100 = 3.1\n", 4, r"'H100' and 'H100-SXM' in \[default\] both name H100-SXM"),
    ("version = 1\n[regions]\nus = { T4 = 0.5, L4 = -1 }\n", 3, r"price of L4 = -1"),
    ('version = 1\n[regions."a.b"]\n"T4" = [1]\n', 3, r"price of T4 must be a number, not an array"),
    # custom GPUs
    (BAD_CUSTOM_HEAD + "peak_tflops = { bf16 = 1 }\ntdp_w = 300\n", 2, r"\[gpus.X\] lacks memory_gib, pcie_gb_s"),
    (BAD_CUSTOM_HEAD + "peak_tflops = { bf16 = 1 }\n" + GOOD_CUSTOM_REST + "colour = 'red'\n", 7,
     r"unknown key 'colour' in \[gpus.X\]"),
    (BAD_CUSTOM_HEAD + "peak_tflops = { bf16 = 1, fp4 = 2 }\n" + GOOD_CUSTOM_REST, 3,
     r"unknown precision 'fp4' for X; expected fp64, tf32"),
    (BAD_CUSTOM_HEAD + GOOD_CUSTOM_REST + "[gpus.X.peak_tflops]\nbf16 = 0\n", 7,
     r"peak bf16 of X = 0: must be a finite number, more than 0"),
    (BAD_CUSTOM_HEAD + "peak_tflops = 400\n" + GOOD_CUSTOM_REST, 3, r"peak_tflops of X must be a table"),
    (BAD_CUSTOM_HEAD + "peak_tflops = {}\n" + GOOD_CUSTOM_REST, 3, r"peak_tflops of X must be a table"),
    (BAD_CUSTOM_HEAD + "peak_tflops = { bf16 = 1 }\ntdp_w = -300\nmemory_gib = 48\npcie_gb_s = 32\n", 4,
     r"tdp_w of X = -300"),
    (BAD_CUSTOM_HEAD + "peak_tflops = { bf16 = 1 }\n" + GOOD_CUSTOM_REST + "source = 2025\n", 7,
     r"source of X must be a string"),
    ("version = 1\ngpus = 1\n", 2, r"gpus must be a table"),
    ("version = 1\n[gpus.H100]\npeak_tflops = { bf16 = 1 }\n" + GOOD_CUSTOM_REST
     + "[gpus.H100-SXM]\npeak_tflops = { bf16 = 1 }\n" + GOOD_CUSTOM_REST, 7, r"defines H100-SXM a second time"),
])
def test_errors_name_the_line(text: str, line: int, match: str) -> None:
    with pytest.raises(PriceBookError, match=match) as err:
        parse_price_book(text, "conf/prices.toml")
    assert err.value.line == line
    assert err.value.path == "conf/prices.toml"
    assert str(err.value) == f"conf/prices.toml:{line}: {err.value.what}"


def test_error_is_a_value_error_and_reads_without_a_line() -> None:
    err = PriceBookError("p.toml", None, "cannot read")
    assert isinstance(err, ValueError) and str(err) == "p.toml: cannot read" and err.line is None


def test_load_price_book_reads_a_file_and_reports_a_missing_one(tmp_path: Path) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(BOOK, encoding="utf-8")
    assert load_price_book(path).hourly_usd("H100", "us-east") == 3.50
    assert load_price_book(str(path)).source == str(path)
    with pytest.raises(PriceBookError, match="cannot read the price book") as err:
        load_price_book(tmp_path / "missing.toml")
    assert err.value.line is None and err.value.path == str(tmp_path / "missing.toml")
    path.write_bytes(b"version = 1\n# \xff\n")
    with pytest.raises(PriceBookError, match="cannot read the price book"):
        load_price_book(path)


# --- TOML error positions -------------------------------------------------------------------------------------------

def test_toml_error_line_comes_from_the_message_or_the_attribute() -> None:
    assert _toml_error(tomllib.TOMLDecodeError("Invalid value (at line 7, column 3)")) == (7, "Invalid value (column 3)")
    assert _toml_error(tomllib.TOMLDecodeError("Unclosed array (at end of document)")) == (
        None, "Unclosed array (at end of document)")
    newer = tomllib.TOMLDecodeError("Invalid value")
    newer.lineno = 4  # type: ignore[attr-defined]  # Python 3.14 keeps the position as attributes
    assert _toml_error(newer) == (4, "Invalid value")


def test_an_error_at_the_end_of_the_document_has_no_line_but_says_where() -> None:
    with pytest.raises(PriceBookError, match=r"^p.toml: invalid TOML: .*\(at end of document\)$") as err:
        parse_price_book("version = 1\nx = [1,\n", "p.toml")
    assert err.value.line is None


# --- find_line ---------------------------------------------------------------------------------------------------------

TEXT = """\
version = 1   # first
[default]     # comment after a header
'H100' = 1
[ regions . "us-east" ]
  "NVIDIA H100 80GB HBM3" = 2
[regions.eu]
H100 = 3
x.y.z = 4
"""


@pytest.mark.parametrize(("key", "line"), [
    (("version",), 1), (("default",), 2), (("default", "H100"), 3), (("regions", "us-east"), 4),
    (("regions", "us-east", "NVIDIA H100 80GB HBM3"), 5), (("regions",), 4), (("regions", "eu", "H100"), 7),
    (("regions", "eu", "x", "y"), 8), (("regions", "eu", "nope"), 6), (("gpus",), None),
])
def test_find_line(key: tuple[str, ...], line: int | None) -> None:
    assert find_line(TEXT, key) == line


# --- the shipped example ------------------------------------------------------------------------------------------------

def shipped_text() -> str:
    return resources.files("schemas").joinpath("prices.example.toml").read_text(encoding="utf-8")


def test_shipped_example_loads_and_prices_every_model_in_specs() -> None:
    book = parse_price_book(shipped_text(), "prices.example.toml")
    for model in SPECS:
        usd = book.hourly_usd(model, None)
        assert usd is not None and 0.1 < usd < 20, model
    assert {"us-east", "eu-west", "ap-southeast"} <= set(book.regions)
    for region, prices in book.regions.items():
        for model, usd in prices.items():
            assert model in SPECS and book.hourly_usd(model, region) == usd
    assert book.hourly_usd("H100-SXM", "us-east") != book.hourly_usd("H100-SXM", None)


def test_shipped_example_says_its_prices_are_examples() -> None:
    head = shipped_text().splitlines()[0]
    assert "EXAMPLE" in head and "NOT QUOTES" in head
