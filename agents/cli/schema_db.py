"""``flopwatch schema migrate [--dry-run]`` and ``flopwatch schema show``: flopwatch's ClickHouse schema."""

from __future__ import annotations

import click

from agents.runtime.entry import settings_of


@click.command("migrate")
@click.option("--dry-run", is_flag=True, help="Print the statements that would run; change nothing.")
@click.pass_context
def migrate_command(ctx: click.Context, dry_run: bool) -> None:
    """Bring the database up to this flopwatch's schema version (what every worker does at start).

    Every statement is idempotent: running it again, or beside a starting worker, is harmless.
    """
    from agents.sinks.clickhouse import ClickHouseError, open_backend
    from agents.sinks.schema import SCHEMA_VERSION, apply, plan_for, refuse_newer

    s = settings_of(ctx)
    try:
        backend = open_backend(s)
        try:
            p = plan_for(backend, s)
            if dry_run:
                refuse_newer(p)  # with the message a worker would give
                for note in p.notes:
                    click.echo(f"-- {note}")
                for stmt in p.statements:
                    click.echo(f"{stmt};\n")
                click.echo(f"-- {s.clickhouse_database}: schema version {_said(p.found)} -> {SCHEMA_VERSION}, "
                           f"{len(p.statements)} statement(s) (dry run: nothing changed)")
                return
            apply(backend, p)
        finally:
            backend.close()
    except ClickHouseError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{s.clickhouse_database}: schema version {_said(p.found)} -> {SCHEMA_VERSION}, "
               f"{len(p.statements)} statement(s) run" + "".join(f"\n  {n}" for n in p.notes))


@click.command("show")
@click.pass_context
def show_command(ctx: click.Context) -> None:
    """The database's schema version, this flopwatch's, its tables with rows and retention, what is pending."""
    from rich.console import Console
    from rich.table import Table

    from agents.sinks.clickhouse import ClickHouseError, open_backend
    from agents.sinks.schema import HISTORY, SCHEMA_VERSION, plan_for
    from schemas import ddl

    s = settings_of(ctx)
    try:
        backend = open_backend(s)
        try:
            p = plan_for(backend, s)
            _, rows = backend.rows("SELECT name, engine, create_table_query FROM system.tables "
                                   f"WHERE database = '{backend.database}' ORDER BY name")
            # From the parts, not system.tables.total_rows: servers before 19 have no such column.
            _, counts = backend.rows("SELECT table, sum(rows) FROM system.parts "
                                     f"WHERE database = '{backend.database}' AND active GROUP BY table")
        finally:
            backend.close()
    except ClickHouseError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"database {s.clickhouse_database}: schema version {_said(p.found)}; this flopwatch: "
               f"{SCHEMA_VERSION} ({HISTORY[SCHEMA_VERSION]})")
    table = Table("table", "engine", "rows", "kept (days)")
    held = {str(t): int(n) for t, n in counts}
    for name, engine, query in rows:
        days = ddl.ttl_days_of(str(query))
        total = held.get(str(name), 0) if "View" not in str(engine) else None
        table.add_row(str(name), str(engine), "" if total is None else f"{total:,}", "" if days is None else str(days))
    Console(width=120).print(table)
    if p.found is not None and p.found > SCHEMA_VERSION:
        click.echo("newer than this flopwatch: a worker of this version refuses to start against it")
    elif p.statements:
        click.echo(f"{len(p.statements)} statement(s) pending: `flopwatch schema migrate --dry-run` prints them")
    else:
        click.echo("up to date")


def _said(found: int | None) -> str:
    return "none (no tables)" if found is None else ("0 (unversioned, made before 3)" if found == 0 else str(found))
