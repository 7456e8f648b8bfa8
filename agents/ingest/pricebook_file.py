"""The price book file, re-read when it changes, so an edit takes effect without a restart.

A bad edit must not stop a running worker nor blank its prices: the last good book stays in
use, the error is logged once (with file and line) and shown on ``error`` until a good edit.
At start there is no last good book, so a missing or invalid file raises instead.
"""

from __future__ import annotations

import logging
import os
from importlib import resources
from pathlib import Path

from agents.runtime.timebase import Clock
from schemas.pricebook import PriceBook, PriceBookError, parse_price_book

log = logging.getLogger("agents.ingest.pricebook_file")
EXAMPLE_SOURCE = "schemas/prices.example.toml (shipped EXAMPLE prices)"
Stamp = tuple[int, int, int]  # (mtime_ns, size, inode): an editor that renames a new file in changes the inode


class PriceBookFile:
    """``current()`` is the price book at ``path`` (None: the shipped example), checked for changes
    at most every ``check_every_ns`` of the clock's monotonic time."""

    def __init__(self, path: Path | None, clock: Clock, check_every_ns: int = 1_000_000_000) -> None:
        self.path = path
        self._clock = clock
        self._every_ns = check_every_ns
        self._book: PriceBook | None = None
        self._stamp: Stamp | None = None
        self._checked_ns = 0
        self.error: str | None = None

    def current(self) -> PriceBook:
        if self._book is None:
            self._book = self._first_load()
            return self._book
        if self.path is not None:
            now = self._clock.mono_ns()
            if now - self._checked_ns >= self._every_ns:
                self._checked_ns = now
                self._check(self.path)
        return self._book

    def _first_load(self) -> PriceBook:
        if self.path is None:
            text = resources.files("schemas").joinpath("prices.example.toml").read_text(encoding="utf-8")
            book = parse_price_book(text, EXAMPLE_SOURCE)
            log.info("price book: %s", EXAMPLE_SOURCE)
            return book
        self._checked_ns = self._clock.mono_ns()
        try:
            self._stamp = _stamp(self.path)
        except OSError as exc:
            raise PriceBookError(str(self.path), None, f"cannot read the price book: {exc}") from None
        book = load_price_book(self.path)
        log.info("price book: %s", self.path)
        return book

    def _check(self, path: Path) -> None:
        try:
            stamp = _stamp(path)
        except OSError as exc:
            if self._stamp is not None:  # reported once, when it went away
                self._stamp = None
                self._failed(PriceBookError(str(path), None, f"cannot read the price book: {exc}"))
            return
        if stamp == self._stamp:
            return
        self._stamp = stamp  # stat before reading: a write racing the read shows up as a later change
        try:
            book = load_price_book(path)
        except PriceBookError as exc:
            self._failed(exc)
            return
        self._book = book
        log.info("price book %s %s", path, "fixed: using it again" if self.error else "reloaded")
        self.error = None

    def _failed(self, exc: PriceBookError) -> None:
        self.error = str(exc)
        log.error("price book: %s; keeping the prices loaded before", exc)


def load_price_book(path: str | Path) -> PriceBook:
    """Read and parse a price book file; an unreadable file is a PriceBookError without a line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PriceBookError(str(path), None, f"cannot read the price book: {exc}") from None
    return parse_price_book(text, str(path))


def _stamp(path: Path) -> Stamp:
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size, st.st_ino
