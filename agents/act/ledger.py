"""The durable ledger of ``flopwatch act``: which idempotency keys it has acted on, and with what result.

One SQLite file (stdlib ``sqlite3``, WAL, ``synchronous=FULL``): a row is written in one
transaction together with the action's result, after the action and before the Kafka
offset commit, so a restarted consumer that reads a trigger again finds its key and skips
it. Rows are scoped by mode: what a ``--dry-run`` printed is not what a ``--webhook`` or
``--exec`` run did to the cluster, so a preview never hides a key from the real thing.

The ledger is bounded: ``purge`` drops keys whose trigger is older than the retention
(by the trigger's ``ts_ns``). The consumer refuses triggers older than the same horizon,
so a purged key can never be acted on again.

One process at a time may use a file: a second one is refused (an advisory lock on
``<path>.lock``), since two consumers checking one ledger could both act before either
records.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "act.sqlite"
>>> with ActLedger(path, "live") as ledger:
...     ledger.record(Entry("ns/wl/scale_up/5", 5, "t1", "d1", "scale_up", "posted", "HTTP 200", 10, "tr", 0, 3))
...     ledger.lookup("ns/wl/scale_up/5").outcome, ledger.lookup("other"), len(ledger)
('posted', None, 1)
>>> with ActLedger(path, "dry-run") as preview:
...     preview.lookup("ns/wl/scale_up/5") is None
True
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from types import TracebackType
from typing import Final, Literal

Mode = Literal["dry-run", "live"]
SCHEMA_VERSION: Final = 1

_DDL: Final = """
CREATE TABLE IF NOT EXISTS done (
    mode            TEXT    NOT NULL,
    key             TEXT    NOT NULL,
    ts_ns           INTEGER NOT NULL,   -- the trigger's event time: what retention is measured by
    trigger_id      TEXT    NOT NULL,
    digest          TEXT    NOT NULL,   -- SHA-256 of the trigger's canonical bytes: tells a repeat from a clash
    action          TEXT    NOT NULL,
    outcome         TEXT    NOT NULL,   -- printed, posted, executed, refused, failed
    detail          TEXT    NOT NULL,
    acted_at_ns     INTEGER NOT NULL,   -- wall clock when the result was recorded
    topic           TEXT    NOT NULL,
    kafka_partition INTEGER NOT NULL,
    kafka_offset    INTEGER NOT NULL,
    PRIMARY KEY (mode, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS done_ts ON done (ts_ns);
"""


class LedgerError(RuntimeError):
    """The ledger cannot be opened or written; the consumer stops rather than act without it."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One acted-on key and the result of the action."""

    key: str
    ts_ns: int
    trigger_id: str
    digest: str
    action: str
    outcome: str
    detail: str
    acted_at_ns: int
    topic: str
    partition: int
    offset: int


_COLUMNS: Final = ("key", "ts_ns", "trigger_id", "digest", "action", "outcome", "detail", "acted_at_ns", "topic",
                   "kafka_partition", "kafka_offset")
assert len(_COLUMNS) == len(fields(Entry))


class ActLedger:
    """The done keys of one mode in one SQLite file; ``lookup`` before acting, ``record`` after."""

    def __init__(self, path: str | Path, mode: Mode) -> None:
        self.path = Path(path)
        self.mode: Mode = mode
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise LedgerError(f"cannot open the ledger {self.path}: {exc}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise LedgerError(f"the ledger {self.path} is in use by another process (another `flopwatch act`?); "
                              "give each consumer its own --state") from None
        try:
            # Autocommit mode: every transaction below is explicit, so none is left open by accident.
            self._db = sqlite3.connect(self.path, isolation_level=None)
            mode_row = self._db.execute("PRAGMA journal_mode=WAL").fetchone()
            if mode_row is None or str(mode_row[0]).lower() != "wal":
                raise LedgerError(f"the ledger {self.path} cannot use write-ahead logging (got {mode_row!r})")
            # FULL: a recorded key survives a power cut too, not only a crash of this process.
            self._db.execute("PRAGMA synchronous=FULL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise LedgerError(f"the ledger {self.path} has layout {version}; this flopwatch knows "
                                  f"{SCHEMA_VERSION}")
            self._db.executescript(f"BEGIN; {_DDL} PRAGMA user_version={SCHEMA_VERSION}; COMMIT;")
        except sqlite3.Error as exc:
            self.close()
            raise LedgerError(f"cannot open the ledger {self.path}: {exc}") from None
        except LedgerError:
            self.close()
            raise

    def lookup(self, key: str) -> Entry | None:
        """The recorded result for ``key`` in this mode, or None if it was never acted on (or was purged)."""
        row = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM done WHERE mode = ? AND key = ?",
                               (self.mode, key)).fetchone()
        return None if row is None else Entry(*row)

    def record(self, entry: Entry) -> None:
        """Store ``entry`` durably, in one transaction; raises ``LedgerError`` if it could not be stored."""
        marks = ", ".join("?" * (len(_COLUMNS) + 1))
        try:
            with self._transaction():
                self._db.execute(f"INSERT OR REPLACE INTO done (mode, {', '.join(_COLUMNS)}) VALUES ({marks})",
                                 (self.mode, *astuple(entry)))
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot record key {entry.key!r} in {self.path}: {exc}") from None

    def purge(self, before_ts_ns: int) -> int:
        """Forget keys (of every mode) whose trigger is older than ``before_ts_ns``; how many went."""
        try:
            with self._transaction():
                cur = self._db.execute("DELETE FROM done WHERE ts_ns < ?", (before_ts_ns,))
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot purge {self.path}: {exc}") from None
        return cur.rowcount

    def __len__(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM done WHERE mode = ?", (self.mode,)).fetchone()[0])

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        db = getattr(self, "_db", None)
        if db is not None:
            db.close()
            self._db = None  # type: ignore[assignment]
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = -1

    def __enter__(self) -> ActLedger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
