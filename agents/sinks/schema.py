"""flopwatch's ClickHouse schema, versioned: what a database lacks, and bringing it up to date.

``plan`` reads what the database has (``system.tables``, ``system.columns``, the
``schema_version`` table) and lists the statements that make it current: tables and views it
lacks, columns an older flopwatch did not write, retention changes, a new rollup's one-time fill.
Every statement is idempotent, so applying a plan twice, or two workers applying it at once, is
harmless. ``ensure_schema`` (every worker at start, ``flopwatch schema migrate``) applies it and
records the version; a database whose recorded version is newer than this flopwatch knows is
refused, with a message that says so, before anything is written.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from agents.settings import Settings
from agents.sinks.clickhouse import Backend, ClickHouseError, existing_tables
from schemas import cluster as cluster_ddl
from schemas import ddl, rollups, tiers, views
from schemas.alerts import LEAK_RULES
from schemas.tiers import Tiering

log = logging.getLogger(__name__)

# What each version added; a database records the versions applied to it in ``schema_version``.
HISTORY: Final = {
    1: "gpu_frames, k8s_events, ingest_progress, node_progress, detections, scale_decisions",
    2: "detections.causes, the leak_episodes view",
    3: "gpu_rollup_1m and gpu_rollup_1h with their materialized views, schema_version, the views of schemas.views",
    4: "frame values stored at their resolution (schemas.resolution), derived columns with Gorilla+ZSTD",
}
SCHEMA_VERSION: Final = max(HISTORY)


class SchemaTooNewError(ClickHouseError):
    """The database was migrated by a newer flopwatch: this one would write what that one does not expect."""


@dataclass(slots=True)
class Plan:
    database: str
    found: int | None  # the version the database records; 0: tables without a record; None: no tables
    statements: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what changes, for people (retention, views dropped)

    @property
    def current(self) -> bool:
        return self.found == SCHEMA_VERSION and not self.statements


def plan(backend: Backend, retention_days: int = 400, rollup_days: tuple[int, int] | None = rollups.RETENTION_DAYS,
         grid_ms: int = 1000, cluster: str | None = None, tiering: Tiering | None = None) -> Plan:
    """What ``backend``'s database needs to be at ``SCHEMA_VERSION`` with these retentions (and views that state
    GPU-time at this grid). ``cluster``: the tables of ``schemas.cluster`` on that cluster, made ON CLUSTER;
    ``tiering``: the frames and rollups on that storage policy, old parts moved to its cold volume."""
    db, layout = backend.database, backend.layout
    have = existing_tables(backend)
    out = Plan(db, _recorded(backend) if "schema_version" in have else (0 if have else None))
    if out.found is not None and out.found > SCHEMA_VERSION:
        return out
    stmts = out.statements

    def alter(stmts_: list[str]) -> list[str]:
        return [a for stmt in stmts_ for a in cluster_ddl.clustered_alter(stmt, cluster)] if cluster else stmts_

    def base(name: str) -> str:  # the table holding the rows (and the TTL): the replicated one on a cluster
        return cluster_ddl.local_name(name) if cluster else name

    if not have:
        stmts.append(f"CREATE DATABASE IF NOT EXISTS {db}" + (f" ON CLUSTER {ddl.check_identifier(cluster)}"
                                                                if cluster else ""))
    for name, sql in ddl.tables(db, layout, retention_days, tiering).items():
        if name not in have or base(name) not in have:
            stmts += cluster_ddl.clustered(sql, cluster) if cluster else [sql]
    if layout == "current" and base("gpu_frames") in have:  # the legacy layout has no TTL
        q = have[base("gpu_frames")]
        had = ddl.ttl_days_of(q)
        if had != retention_days:
            out.notes.append(f"gpu_frames keeps frames for {retention_days} days from now on (it kept them for "
                             + ("ever" if had is None else f"{had} days") + ")")
        stmts += alter(_tier_changes(out, "gpu_frames", q, tiering, had != retention_days,
                                     lambda: ddl.frames_ttl(db, retention_days, tiering)))
    # A table made by an older flopwatch lacks the newer columns (CREATE ... IF NOT EXISTS leaves it as it is).
    if base("gpu_frames") in have:
        stmts += alter(ddl.gpu_frames_migrations(db, _columns(backend, base("gpu_frames")), layout))
        if layout == "current":
            stmts += alter(ddl.frames_codec_migrations(db, have[base("gpu_frames")]))
    if base("detections") in have:
        stmts += alter(ddl.detections_migrations(db, _columns(backend, base("detections"))))
    if layout == "current" and cluster:
        out.notes.append(f"cluster {cluster}: the rollups and the SQL views are made on one server only, not yet "
                         "on a cluster (docs/storage.md)")
    elif layout == "current":  # the legacy server reads the ledger through `flopwatch leaks` only, and has no rollups
        if "leak_episodes" not in have or (out.found or 0) < SCHEMA_VERSION:
            stmts.append(ddl.leak_episodes_view(db, LEAK_RULES))
        _plan_rollups(out, have, rollup_days, tiering)
        rolled = rollup_days is not None or rollups.ROLLUPS[1].table in have
        for name in views.VIEWS:
            if name in views.ON_ROLLUPS and not rolled:
                continue
            if name not in have or not views.view_is_current(have[name], grid_ms):
                stmts.append(views.create_view(db, name, grid_ms))
    return out


def _tier_changes(out: Plan, table: str, create_query: str, tiering: Tiering | None, ttl_changed: bool,
                  ttl: Callable[[], str]) -> list[str]:
    """The ALTERs that put an existing table on the tiering's policy and rules (and its new retention)."""
    stmts = []
    policy = tiers.policy_of(create_query)
    if tiering is not None and policy != tiering.policy:
        out.notes.append(f"{table} moves to storage policy {tiering.policy!r}")
        stmts.append(ddl.storage_policy(out.database, table, tiering))
    elif tiering is None and policy is not None:
        out.notes.append(f"{table} stays on storage policy {policy!r} (a policy cannot be taken off a table)")
    want, had = None if tiering is None else (tiering.hot_days, tiering.cold_volume), tiers.tier_of(create_query)
    if ttl_changed or had != want:
        if had != want:
            out.notes.append(f"{table}: " + ("no parts move to a cold volume" if want is None else
                                            f"parts older than {want[0]} days move to volume {want[1]!r}"))
        stmts.append(ttl())
    return stmts


def _plan_rollups(out: Plan, have: dict[str, str], days: tuple[int, int] | None,
                  tiering: Tiering | None = None) -> None:
    db = out.database
    for r, keep in zip(rollups.ROLLUPS, days or (None, None), strict=True):
        view = f"{r.table}_mv"
        if keep is None:
            if view in have:
                out.notes.append(f"rollups are off: {r.table} is no longer fed (its rows stay)")
                out.statements.append(f"DROP VIEW IF EXISTS {db}.{view}")
            continue
        if r.table not in have:
            out.statements.append(rollups.rollup_table(db, r, keep, tiering))
            if "gpu_frames" in have:  # the view sees new blocks only: what was written before goes in once
                out.statements.append(rollups.rollup_backfill(db, r))
        else:
            changed = ddl.ttl_days_of(have[r.table]) != keep
            if changed:
                out.notes.append(f"{r.table} keeps rows for {keep} days from now on")
            out.statements += _tier_changes(out, r.table, have[r.table], tiering, changed,
                                            functools.partial(rollups.rollup_ttl, db, r, keep, tiering))
        if view not in have:
            out.statements.append(rollups.rollup_view(db, r))


def refuse_newer(p: Plan) -> None:
    """Raise ``SchemaTooNewError`` for a database a newer flopwatch migrated, with what to do about it."""
    if p.found is not None and p.found > SCHEMA_VERSION:
        raise SchemaTooNewError(
            f"database {p.database!r} is at schema version {p.found}, written by a newer flopwatch; this one knows "
            f"versions up to {SCHEMA_VERSION} ({HISTORY[SCHEMA_VERSION]}). Upgrade flopwatch, or point "
            "FLOPWATCH_CLICKHOUSE_DATABASE at another database")


def apply(backend: Backend, p: Plan, now_ms: int | None = None) -> None:
    """Run ``p``'s statements and record ``SCHEMA_VERSION``; refuses a database newer than this flopwatch."""
    refuse_newer(p)
    for note in p.notes:
        log.warning("%s", note)
    for stmt in p.statements:
        backend.execute(stmt)
    if p.found != SCHEMA_VERSION:
        ms = int(time.time() * 1000) if now_ms is None else now_ms
        backend.insert("schema_version", {"version": [SCHEMA_VERSION], "applied_at": [ms], "by": ["flopwatch"]})
        log.info("database %s: schema version %s -> %d", p.database, p.found, SCHEMA_VERSION)


def ensure_schema(backend: Backend, retention_days: int = 400,
                  rollup_days: tuple[int, int] | None = rollups.RETENTION_DAYS, grid_ms: int = 1000,
                  cluster: str | None = None, tiering: Tiering | None = None) -> Plan:
    """Create or bring up to date flopwatch's tables (``rollup_days``: the 1 min and 1 h rollups' retention, or
    None: no rollups; their views are dropped, so inserts stop feeding them, and their rows stay; ``cluster``:
    replicated and Distributed tables on that cluster)."""
    p = plan(backend, retention_days, rollup_days, grid_ms, cluster, tiering)
    apply(backend, p)
    return p


def plan_for(backend: Backend, s: Settings) -> Plan:
    """``plan`` with the retentions, grid, cluster and tiers the settings give."""
    return plan(backend, s.frames_retention_days, s.rollup_days(), s.grid_ms, s.clickhouse_cluster or None,
                s.tiering())


def ensure_for(backend: Backend, s: Settings) -> Plan:
    """``ensure_schema`` with what the settings give: what a worker runs at start."""
    p = plan_for(backend, s)
    apply(backend, p)
    return p


def _recorded(backend: Backend) -> int:
    _, rows = backend.rows(f"SELECT max(version) FROM {backend.database}.schema_version")
    return int(rows[0][0]) if rows and rows[0][0] is not None else 0


def _columns(backend: Backend, table: str) -> set[str]:
    """The columns a table of flopwatch's database has now."""
    # The names passed check_identifier, so they are safe as literals (the two clients differ in parameter syntax).
    _, rows = backend.rows(f"SELECT name FROM system.columns WHERE database = '{backend.database}' "
                           f"AND table = '{ddl.check_identifier(table)}'")
    return {str(r[0]) for r in rows}
