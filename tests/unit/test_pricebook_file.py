"""The price book file: loaded at start, re-read when edited, a bad edit keeps the last good prices."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from agents.ingest.pricebook_file import PriceBookFile
from agents.runtime.timebase import ManualClock
from schemas.gpus import SPECS
from schemas.pricebook import PriceBookError

SECOND = 1_000_000_000


def prices(h100: str) -> str:
    return f"version = 1\n[default]\nH100-SXM = {h100}\nT4 = 0.5\n"


def write(path: Path, text: str, mtime_s: int) -> None:
    """Write and set the mtime: edits within one test happen faster than the file system's clock ticks."""
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(mtime_s * SECOND, mtime_s * SECOND))


@pytest.fixture
def path(tmp_path: Path) -> Path:
    p = tmp_path / "prices.toml"
    write(p, prices("3.90"), 1000)
    return p


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "agents.ingest.pricebook_file" and r.levelno == logging.ERROR]


def test_first_call_loads_the_file(path: Path) -> None:
    book = PriceBookFile(path, ManualClock())
    assert book.current().hourly_usd("H100", None) == 3.90
    assert book.error is None and book.path == path


def test_missing_or_invalid_file_at_start_raises(tmp_path: Path) -> None:
    with pytest.raises(PriceBookError, match="cannot read the price book") as err:
        PriceBookFile(tmp_path / "missing.toml", ManualClock()).current()
    assert err.value.line is None
    bad = tmp_path / "bad.toml"
    write(bad, "version = 1\n[default]\nH100-SXN = 3\n", 1000)
    with pytest.raises(PriceBookError, match=r"bad.toml:3: unknown GPU model 'H100-SXN'") as err:
        PriceBookFile(bad, ManualClock()).current()
    assert err.value.line == 3


def test_an_edit_takes_effect_at_the_next_check(path: Path) -> None:
    clock = ManualClock()
    book = PriceBookFile(path, clock, check_every_ns=SECOND)
    first = book.current()
    write(path, prices("3.10"), 1001)
    clock.advance(SECOND - 1)
    assert book.current() is first  # not checked before the interval is over
    clock.advance(1)
    assert book.current().hourly_usd("H100-SXM", None) == 3.10
    assert book.error is None


def test_an_unchanged_file_is_not_parsed_again(path: Path) -> None:
    clock = ManualClock()
    book = PriceBookFile(path, clock)
    first = book.current()
    for _ in range(3):
        clock.advance(5 * SECOND)
        assert book.current() is first


def test_a_replaced_file_with_the_same_size_and_mtime_is_seen(path: Path) -> None:
    # Editors that save by writing a new file and renaming it over the old one change the inode.
    clock = ManualClock()
    book = PriceBookFile(path, clock)
    book.current()
    new = path.with_name("prices.toml.new")
    write(new, prices("3.80"), 1000)
    os.replace(new, path)
    clock.advance(SECOND)
    assert book.current().hourly_usd("H100-SXM", None) == 3.80


def test_a_bad_edit_keeps_the_last_good_book_and_logs_once(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    book = PriceBookFile(path, clock)
    good = book.current()
    write(path, "version = 1\n[default]\nH100-SXM = -3.90\n", 1001)
    clock.advance(SECOND)
    with caplog.at_level(logging.INFO, logger="agents.ingest.pricebook_file"):
        assert book.current() is good
        for _ in range(3):  # the same bad file, checked again: no new message
            clock.advance(SECOND)
            assert book.current() is good
    assert book.error is not None and book.error.startswith(f"{path}:3: price of H100-SXM = -3.9")
    assert errors(caplog) == [f"price book: {book.error}; keeping the prices loaded before"]


def test_a_good_edit_after_a_bad_one_clears_the_error(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    book = PriceBookFile(path, clock)
    book.current()
    write(path, "version = 1\n[default\n", 1001)
    clock.advance(SECOND)
    book.current()
    assert book.error is not None and f"{path}:2: invalid TOML" in book.error
    write(path, prices("2.95"), 1002)
    clock.advance(SECOND)
    with caplog.at_level(logging.INFO, logger="agents.ingest.pricebook_file"):
        assert book.current().hourly_usd("H100-SXM", None) == 2.95
    assert book.error is None
    assert any("fixed" in r.getMessage() for r in caplog.records)


def test_a_second_different_bad_edit_is_logged_too(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    book = PriceBookFile(path, clock)
    book.current()
    with caplog.at_level(logging.ERROR, logger="agents.ingest.pricebook_file"):
        for n, text in enumerate(("version = 2\n", "version = 1\nfoo = 1\n"), 1):
            write(path, text, 1000 + n)
            clock.advance(SECOND)
            book.current()
    assert len(errors(caplog)) == 2 and "unknown top-level key 'foo'" in (book.error or "")


def test_a_deleted_file_keeps_the_last_good_book_until_it_is_back(path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    book = PriceBookFile(path, clock)
    good = book.current()
    path.unlink()
    with caplog.at_level(logging.ERROR, logger="agents.ingest.pricebook_file"):
        for _ in range(3):
            clock.advance(SECOND)
            assert book.current() is good
    assert len(errors(caplog)) == 1 and book.error is not None and "cannot read the price book" in book.error
    write(path, prices("4.00"), 1005)
    clock.advance(SECOND)
    assert book.current().hourly_usd("H100-SXM", None) == 4.00 and book.error is None


def test_no_path_means_the_shipped_example() -> None:
    clock = ManualClock()
    book = PriceBookFile(None, clock)
    first = book.current()
    assert "EXAMPLE" in first.source
    assert all(first.hourly_usd(model, None) is not None for model in SPECS)
    clock.advance(10 * SECOND)
    assert book.current() is first and book.error is None
