"""``flopwatch sql``: a ClickHouse query against flopwatch's database, printed as a table, JSON or CSV."""

from __future__ import annotations

import csv
import io
from typing import Any

import click
import orjson

from agents.runtime.entry import settings_of


@click.command()
@click.argument("query")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@click.pass_context
def sql(ctx: click.Context, query: str, fmt: str) -> None:
    """Run a ClickHouse SQL QUERY against flopwatch's database and print the result."""
    from agents.sinks.clickhouse import ClickHouseError, database_exists, open_backend

    settings = settings_of(ctx)
    exists = True
    try:
        backend = open_backend(settings)
        try:
            # Unqualified table names mean flopwatch's tables, once a worker has made them.
            exists = database_exists(backend)
            if exists:
                backend.use_database()
            names, rows = backend.rows(query)
        finally:
            backend.close()
    except ClickHouseError as exc:
        hint = "" if exists else (f"\n(database {settings.clickhouse_database!r} does not exist yet: "
                                  "run `flopwatch worker` or `flopwatch demo` first)")
        raise click.ClickException(f"{exc}{hint}") from None
    click.echo(render(names, rows, fmt), nl=False)


def render(names: list[str], rows: list[tuple[Any, ...]], fmt: str) -> str:
    if fmt == "json":
        return orjson.dumps([dict(zip(names, r, strict=True)) for r in rows], default=str).decode() + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(names)
        w.writerows(rows)
        return buf.getvalue()
    from rich.console import Console
    from rich.table import Table

    table = Table(*names)
    for r in rows:
        table.add_row(*("NULL" if v is None else str(v) for v in r))
    buf = io.StringIO()
    Console(file=buf, width=200).print(table)
    return buf.getvalue()
