"""ClickHouse backends behind one small interface: embedded chDB and a server over the native protocol.

Both take columnar batches; ``ts`` columns arrive as epoch milliseconds (``ts_ns`` for
events) and each backend converts them to what its layout stores.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson

from agents.settings import Settings
from schemas import ddl, rollups
from schemas.cluster import alt_hosts

log = logging.getLogger(__name__)
Columns = dict[str, Any]  # column name -> list or numpy array


class ClickHouseError(RuntimeError):
    """A ClickHouse statement failed; the message says which and why (never credentials)."""


class ClickHouseUnreachable(ClickHouseError):
    """The server could not be reached (down, restarting, a network cut): worth waiting for."""


class Backend(Protocol):
    layout: ddl.Layout
    database: str

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> None: ...
    def param(self, name: str, typ: str) -> str: ...
    def use_database(self) -> None: ...
    def rows(self, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple[Any, ...]]]: ...
    def insert(self, table: str, columns: Columns, token: str | None = None) -> None: ...
    def close(self) -> None: ...


# Epoch-millisecond columns besides ``ts`` (whose unit depends on the table).
_MS_COLUMNS = ("written_at", "onset_ts", "applied_at")


def _plain(col: Any) -> list[Any]:
    """Python values for clickhouse-driver: NaN (no sample) becomes None."""
    if isinstance(col, np.ndarray):
        vals: list[Any] = col.tolist()
        if col.dtype.kind == "f":
            return [None if v != v else v for v in vals]
        return vals
    return list(col)


def arrow_stream(columns: Columns, ts_unit: str = "ms") -> bytes:
    """``columns`` as one Arrow IPC stream, the form chDB reads fastest: a frames insert took 4-5x as long as
    JSON text (chDB's parse was most of the worker's final write). ``ts`` is epoch ``ts_unit``, the other
    time columns epoch ms; NaN and None are null (what a Nullable column wants; a plain one takes its default).

    >>> import pyarrow as pa
    >>> cols = {"ts": np.array([1_500]), "v": np.array([np.nan]), "w": [None], "gpus": [["0", "1"]]}
    >>> t = pa.ipc.open_stream(arrow_stream(cols)).read_all()
    >>> [str(x) for x in t.schema.types], t.to_pylist()[0]["v"], t.to_pylist()[0]["ts"].isoformat()
    (['timestamp[ms]', 'double', 'null', 'list<item: string>'], None, '1970-01-01T00:00:01.500000')
    """
    import pyarrow as pa  # with chDB: a worker on the native server does not load it

    arrays = {}
    for name, col in columns.items():
        unit = ts_unit if name == "ts" else "ms" if name in _MS_COLUMNS else None
        if unit is not None:
            arrays[name] = pa.array(np.asarray(col, np.int64), pa.timestamp(unit))
        else:  # from_pandas: NaN is null, as it was in the JSON this replaced
            arrays[name] = pa.array(col, from_pandas=True)
    table = pa.table(arrays)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


class ChdbBackend:
    """Embedded ClickHouse (chDB): data in a local directory, no server. One per process."""

    def __init__(self, path: str | Path, database: str, config: str | Path | None = None) -> None:
        from chdb import session  # imported here: loading the engine costs ~1 s

        Path(path).mkdir(parents=True, exist_ok=True)
        self.layout: ddl.Layout = "current"
        self.database = ddl.check_identifier(database)
        where = str(path)
        if config:  # its disks and storage policies (a path with '?' or '&' would split chDB's connection string)
            if not Path(config).is_file() or set("?&") & set(str(config) + where):
                raise ClickHouseError(f"chDB configuration {config}: not a readable file with a plain path")
            where = f"file:{Path(path).resolve()}?config-file={Path(config).resolve()}"
        self._session = session.Session(where)  # type: ignore[no-untyped-call]

    def use_database(self) -> None:
        """Make flopwatch's database the default one of later queries (it must exist)."""
        self._query(f"USE {self.database}")  # the session keeps it

    def _query(self, sql: str, fmt: str = "CSV", params: dict[str, Any] | None = None) -> Any:
        try:
            return self._session.query(sql, fmt, params=params) if params else self._session.query(sql, fmt)  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise ClickHouseError(f"chDB: {exc}") from exc

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> None:
        self._query(sql, params=params)

    def param(self, name: str, typ: str) -> str:
        """A query parameter's placeholder: the server substitutes it (never spliced into the text)."""
        return f"{{{name}:{typ}}}"

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        res = self._query(sql, "JSONCompact", params)
        raw = res.bytes()
        if not raw:
            return [], []
        doc = orjson.loads(raw)
        names = [m["name"] for m in doc["meta"]]
        return names, [tuple(r) for r in doc["data"]]

    def insert(self, table: str, columns: Columns, token: str | None = None) -> None:
        # The token is ours (hex); with it, a retried block is dropped from the rollups' views too.
        settings = (f" SETTINGS insert_deduplication_token = '{ddl.check_token(token)}', "
                    + ", ".join(f"{k} = {v}" for k, v in rollups.INSERT_SETTINGS.items())) if token else ""
        names = ", ".join(ddl.check_identifier(c) for c in columns)
        sql = f"INSERT INTO {self.database}.{ddl.check_identifier(table)} ({names}){settings}"
        data = arrow_stream(columns, ts_unit="ns" if table == "k8s_events" else "ms")
        try:
            with self._session.send_insert(sql, "ArrowStream") as ins:
                ins.append(data)
                ins.finish()
        except Exception as exc:
            raise ClickHouseError(f"chDB: {exc}") from exc

    def close(self) -> None:
        self._session.close()  # type: ignore[no-untyped-call]


class NativeBackend:
    """A ClickHouse server over the native protocol (clickhouse-driver), with retries."""

    def __init__(self, settings: Settings, attempts: int = 5, backoff_s: float = 0.5) -> None:
        from clickhouse_driver import Client

        self.layout: ddl.Layout = settings.clickhouse_layout
        self.database = ddl.check_identifier(settings.clickhouse_database)
        self._attempts = attempts
        self._backoff_s = backoff_s
        kwargs: dict[str, Any] = {"host": settings.clickhouse_host, "port": settings.clickhouse_port,
                                  "user": settings.clickhouse_user, "password": settings.clickhouse_password.get(),
                                  "secure": settings.clickhouse_secure, "connect_timeout": 5,
                                  "send_receive_timeout": 60, "client_name": "flopwatch"}
        if settings.clickhouse_ca_certs:
            kwargs["ca_certs"] = settings.clickhouse_ca_certs
        alt = alt_hosts(settings.clickhouse_alt_hosts)  # checked when the settings were loaded
        if alt:  # the driver tries them in turn when it (re)connects: a lost server is a reconnect away
            kwargs["alt_hosts"] = alt
        if settings.clickhouse_cluster:
            # A write through a Distributed table returns once a replica of each shard has it, not once it is
            # queued on the node we talk to: the offsets are committed only after that.
            kwargs["settings"] = {"insert_distributed_sync": 1}
        self._kwargs = kwargs
        self._client = Client(**kwargs)
        self._unsure: set[str] = set()  # tables whose last insert broke off: it may have been written
        self._where = f"{settings.clickhouse_host}:{settings.clickhouse_port}" + (f" (or {alt})" if alt else "")

    def _run(self, what: str, fn: Any, broke: Callable[[], None] | None = None) -> Any:
        """``fn()``, retried while the server is unreachable; ``broke()`` is called each time the connection
        fails under it (an insert's block may have been written all the same)."""
        from clickhouse_driver.errors import Error, NetworkError, ServerException

        delay = self._backoff_s
        for attempt in range(1, self._attempts + 1):
            try:
                return fn()
            except (NetworkError, EOFError, OSError) as exc:
                if broke is not None:
                    broke()
                if attempt == self._attempts:
                    raise ClickHouseUnreachable(f"ClickHouse at {self._where} unreachable ({what}): {exc}") from exc
                log.warning("ClickHouse %s failed (attempt %d/%d): %s; retrying", what, attempt, self._attempts, exc)
                self._client.disconnect()
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
            except (ServerException, Error) as exc:
                raise ClickHouseError(f"ClickHouse at {self._where} refused {what}: {exc}") from exc
        raise AssertionError("unreachable")

    def use_database(self) -> None:
        """Make flopwatch's database the default one of later queries (it must exist)."""
        from clickhouse_driver import Client

        self._client.disconnect()
        self._client = Client(**self._kwargs, database=self.database)

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> None:
        self._run("a statement", lambda: self._client.execute(sql, params))

    def param(self, name: str, typ: str) -> str:
        """A query parameter's placeholder: clickhouse-driver quotes and escapes the value."""
        return f"%({name})s"

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        data, types = self._run("a query", lambda: self._client.execute(sql, params, with_column_types=True))
        return [name for name, _ in types], [tuple(r) for r in data]

    def insert(self, table: str, columns: Columns, token: str | None = None) -> None:
        cols = {k: _plain(v) for k, v in columns.items()}
        if self.layout == "current":
            if "ts" in cols:
                div = 1e9 if table == "k8s_events" else 1e3
                cols["ts"] = [datetime.fromtimestamp(v / div, UTC) for v in cols["ts"]]
            for name in _MS_COLUMNS:
                if name in cols:
                    cols[name] = [datetime.fromtimestamp(v / 1e3, UTC) for v in cols[name]]
        sql = f"INSERT INTO {self.database}.{ddl.check_identifier(table)} ({', '.join(cols)}) VALUES"
        settings = ({"insert_deduplication_token": token, **rollups.INSERT_SETTINGS}
                    if token and self.layout == "current" else None)
        # Without a token the server cannot drop a block written twice (legacy servers have none): after an
        # insert into the table failed on the way, the next one asks first which of its rows are stored.
        keys = ddl.ROW_KEYS.get(table) if token is None or self.layout == "legacy" else None

        def attempt() -> None:
            data = cols
            if keys and table in self._unsure:
                data = self._not_stored(table, cols, keys)
                if not data[keys[0]]:
                    self._unsure.discard(table)
                    return
            self._client.execute(sql, list(data.values()), columnar=True, settings=settings)
            self._unsure.discard(table)

        # A connection that broke after the block went out may have broken after the server wrote it.
        self._run(f"an insert into {table}", attempt, broke=lambda: self._unsure.add(table))

    def _not_stored(self, table: str, cols: dict[str, list[Any]], keys: tuple[str, ...]) -> dict[str, list[Any]]:
        """``cols`` less the rows whose identity the table holds already."""
        where, params = key_filter(keys, cols)
        stored = {tuple(r) for r in self._client.execute(
            f"SELECT {', '.join(keys)} FROM {self.database}.{table} WHERE {where}", params)}
        keep = [i for i, ident in enumerate(zip(*(cols[k] for k in keys), strict=True)) if ident not in stored]
        n = len(cols[keys[0]])
        if len(keep) < n:
            log.warning("ClickHouse had written %d of %d rows of an insert into %s before its reply was lost; "
                        "writing the other %d", n - len(keep), n, table, len(keep))
        return {c: [v[i] for i in keep] for c, v in cols.items()}

    def close(self) -> None:
        self._client.disconnect()


def key_filter(keys: Sequence[str], cols: Columns) -> tuple[str, dict[str, Any]]:
    """A WHERE clause (with its parameters) that holds every row of ``cols`` and few others: a range for
    each integer key column, the set of values for the others.

    >>> key_filter(("node", "ts"), {"node": ["b", "a", "b"], "ts": [30, 10, 20]})
    ('node IN %(k0)s AND ts BETWEEN %(lo1)s AND %(hi1)s', {'k0': ('a', 'b'), 'lo1': 10, 'hi1': 30})
    """
    parts, params = [], {}
    for i, key in enumerate(keys):
        vals = _plain(cols[key])
        if vals and all(isinstance(v, int) for v in vals):
            parts.append(f"{key} BETWEEN %(lo{i})s AND %(hi{i})s")
            params[f"lo{i}"], params[f"hi{i}"] = min(vals), max(vals)
        else:
            parts.append(f"{key} IN %(k{i})s")
            params[f"k{i}"] = tuple(sorted(set(vals)))
    return " AND ".join(parts), params


def open_backend(settings: Settings) -> Backend:
    if settings.clickhouse_backend == "chdb":
        return ChdbBackend(settings.chdb_path, settings.clickhouse_database, settings.chdb_config or None)
    return NativeBackend(settings)


def database_exists(backend: Backend) -> bool:
    # The name passed check_identifier ([A-Za-z_][A-Za-z0-9_]*), so it is safe as a literal.
    _, rows = backend.rows(f"SELECT count() FROM system.databases WHERE name = '{backend.database}'")
    return bool(rows and int(rows[0][0]))


def existing_tables(backend: Backend) -> dict[str, str]:
    """The tables and views of flopwatch's database, by name, with the statement that made each."""
    # The name passed check_identifier, so it is safe as a literal (the two clients differ in parameter syntax).
    _, rows = backend.rows(f"SELECT name, create_table_query FROM system.tables WHERE database = '{backend.database}'")
    return {str(name): str(q) for name, q in rows}
