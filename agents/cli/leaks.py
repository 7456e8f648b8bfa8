"""``flopwatch leaks``: the top leaks by money, one line each with its likeliest cause (the leak ledger).

Reads ``detections`` (the ``leak_episodes`` view's query, so it works on the legacy layout too):
episodes that were open at some point within ``--since``, the dearest first.
"""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime
from typing import Any

import click

from agents.runtime.entry import settings_of

_SINCE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str) -> float:
    """``24h``, ``30m``, ``7d``, ``90s`` as seconds.

    >>> parse_since("24h"), parse_since("1.5d")
    (86400.0, 129600.0)
    """
    m = _SINCE.fullmatch(text.strip())
    if m is None:
        raise click.BadParameter(f"{text!r}: write a number and a unit, e.g. 24h, 30m, 7d")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def ledger_query(db: str, layout: str, since_s: float, namespace: str | None, limit: int,
                 native: bool = False) -> tuple[str, dict[str, Any]]:
    """The ledger's SQL and its parameters (the namespace is a parameter, never spliced in); ``native``: the
    clickhouse-driver's placeholders, else chDB's."""
    from schemas import ddl
    from schemas.alerts import LEAK_RULES

    def param(name: str, typ: str) -> str:
        return f"%({name})s" if native else f"{{{name}:{typ}}}"

    end = "toUnixTimestamp64Milli(end_ts)" if layout == "current" else "end_ts"
    where = [f"({end} >= toUInt64(now()) * 1000 - {param('since_ms', 'UInt64')} OR NOT resolved)"]
    params: dict[str, Any] = {"since_ms": int(since_s * 1000)}
    if namespace is not None:
        where.append(f"namespace = {param('namespace', 'String')}")
        params["namespace"] = namespace
    sql = (f"SELECT rule, namespace, workload, node, gpu, start_ts, end_ts, resolved, usd_per_h, usd, cause\n"
           f"FROM ({ddl.leak_episodes_query(db, LEAK_RULES, layout)})\n"  # type: ignore[arg-type]
           f"WHERE {' AND '.join(where)}\nORDER BY usd DESC\nLIMIT {int(limit)}")
    return sql, params


@click.command()
@click.option("--since", default="24h", show_default=True,
              help="Episodes open at some point within this (30m, 24h, 7d).")
@click.option("--namespace", default=None, help="Only this namespace's workloads.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=20, show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_context
def leaks(ctx: click.Context, since: str, namespace: str | None, limit: int, fmt: str) -> None:
    """The top leaks by money (idle GPUs, stalls, storms, fragmentation ...), one line each with its cause."""
    from agents.sinks.clickhouse import ClickHouseError, database_exists, open_backend

    settings = settings_of(ctx)
    since_s = parse_since(since)
    try:
        backend = open_backend(settings)
        try:
            if not database_exists(backend):
                raise click.ClickException(f"database {settings.clickhouse_database!r} does not exist yet: run "
                                           "`flopwatch worker` or `flopwatch demo` first")
            sql, params = ledger_query(settings.clickhouse_database, backend.layout, since_s, namespace, limit,
                                       native=settings.clickhouse_backend != "chdb")
            names, rows = backend.rows(sql, params)
        finally:
            backend.close()
    except ClickHouseError as exc:
        raise click.ClickException(str(exc)) from None
    records = [dict(zip(names, r, strict=True)) for r in rows]
    if fmt == "json":
        import orjson

        click.echo(orjson.dumps(records, default=str).decode())
        return
    click.echo(render(records, since), nl=False)


def _when(v: Any) -> datetime:
    if isinstance(v, datetime):
        return v if v.tzinfo else v.replace(tzinfo=UTC)
    if isinstance(v, str) and not v.isdigit():  # chDB's JSON: "2026-12-04 22:34:59.254", UTC
        return datetime.fromisoformat(v).replace(tzinfo=UTC)
    return datetime.fromtimestamp(int(v) / 1000, UTC)  # the legacy layout: epoch milliseconds


def render(records: list[dict[str, Any]], since: str) -> str:
    from rich.console import Console
    from rich.table import Table

    total = sum(float(r["usd"]) for r in records)
    table = Table(title=f"leaks within {since}: {len(records)} episode(s), {total:,.2f} USD burnt",
                  title_justify="left")
    for col, just in (("rule", "left"), ("workload", "left"), ("where", "left"), ("since", "left"),
                      ("lasted", "right"), ("USD/h", "right"), ("USD", "right"), ("cause", "left")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in records:
        start, end = _when(r["start_ts"]), _when(r["end_ts"])
        minutes = max(0.0, (end - start).total_seconds() / 60.0)
        lasted = f"{minutes:.0f} min" + ("" if r["resolved"] else " (open)")
        table.add_row(r["rule"], f"{r['namespace'] or '-'}/{r['workload'] or '-'}", f"{r['node']}/{r['gpu']}",
                      start.strftime("%Y-%m-%d %H:%M"), lasted, f"{float(r['usd_per_h']):.2f}",
                      f"{float(r['usd']):.2f}", r["cause"] or "-")
    buf = io.StringIO()
    Console(file=buf, width=160).print(table)
    return buf.getvalue()
