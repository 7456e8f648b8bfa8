"""ClickHouse tables, generated from the catalog.

``current`` is the real schema (DateTime64, LowCardinality, codecs, TTL) for chDB and
current servers. ``legacy`` is a simplified layout that ClickHouse 18.16 (the only
server packaged for this machine) accepts: epoch milliseconds instead of DateTime64,
plain String instead of LowCardinality, no codecs or TTL. Both hold the same columns
and the same values, so the same rows can be compared across backends.
"""

from __future__ import annotations

import re
from typing import Final, Literal

from schemas import frames
from schemas.frames import LABEL_COLS
from schemas.tiers import Tiering, ttl_clause

Layout = Literal["current", "legacy"]
_IDENT: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def check_identifier(name: str) -> str:
    """Return ``name`` if it is a safe unquoted ClickHouse identifier, else raise ValueError."""
    if not _IDENT.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid identifier (letters, digits, underscore; not leading digit)")
    return name


_TOKEN: Final = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def check_token(token: str) -> str:
    """Return ``token`` if it is safe inside a quoted SETTINGS literal, else raise ValueError."""
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"{token!r} is not a valid deduplication token")
    return token


INT_LABEL_COLS: Final = frozenset({"rank", "pid"})
# The frame's columns come from its contract (schemas.frames); the short names are the DDL's.
VALUE_COLS: Final = frames.VALUE_COLUMNS
COUNT_COLS: Final = frames.COUNT_COLUMNS
FRAME_COLUMNS: Final = frames.INSERT_COLUMNS
DERIVED_COLS: Final = frames.DERIVED_COLUMNS
DETECTION_COLUMNS: Final = ("ts", "onset_ts", "id", "state", "rule", "severity", "node", "gpu", "workload",
                             "namespace", "value", "threshold", "baseline", "evidence")
EVENT_COLUMNS: Final = ("ts", "node", "type", "reason", "kind", "namespace", "pod", "workload", "gpus", "message",
                        "kafka_topic", "kafka_partition", "kafka_offset")
PROGRESS_COLUMNS: Final = ("topic", "partition", "offset", "written_at")
# Each table's row identity, its ReplacingMergeTree sort key: a row written twice has the same one. A writer
# that does not know whether an insert went through (agents.sinks.clickhouse) asks for these.
ROW_KEYS: Final[dict[str, tuple[str, ...]]] = {
    "gpu_frames": ("node", "gpu", "ts"), "detections": ("id", "state"), "scale_decisions": ("id", "outcome"),
    "k8s_events": ("kafka_topic", "kafka_partition", "kafka_offset"),
    "ingest_progress": ("topic", "partition", "offset"), "node_progress": ("node", "closed_tick_ms")}


def _order(table: str) -> str:
    return f"ORDER BY ({', '.join(ROW_KEYS[table])})"


def _label_type(col: str, layout: Layout) -> str:
    if col in INT_LABEL_COLS:
        return "Nullable(Int64)"
    return "LowCardinality(String)" if layout == "current" and col != "pod" else "String"


def gpu_frames(db: str, layout: Layout = "current", ttl_days: int = 400, tiering: Tiering | None = None) -> str:
    check_identifier(db)
    cur = layout == "current"
    lc = "LowCardinality(String)" if cur else "String"
    cols = ["ts DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1))" if cur else "ts UInt64",
            f"node {lc}", f"gpu {lc}"]
    cols += [f"{c} {_label_type(c, layout)}" for c in LABEL_COLS]
    fcodec = " CODEC(Gorilla, ZSTD(1))" if cur else ""
    cols += [f"{c} Nullable(Float64){fcodec}" for c in VALUE_COLS]
    cols += [f"{c} UInt32" + (" CODEC(T64, ZSTD(1))" if cur else "") for c in COUNT_COLS]
    # How far a frame's sample times may be off after clock correction (0: all in UTC).
    cols += ["clock_uncertainty_us Float64"]
    cols += derived_columns(layout)
    body = ",\n  ".join(cols)
    if cur:
        tail = (f"ENGINE = ReplacingMergeTree\nPARTITION BY toYYYYMMDD(ts)\n{_order('gpu_frames')}\n"
                f"TTL {ttl_clause('toDateTime(ts)', ttl_days, tiering)}\n"
                # Lets a retried insert with the same token be dropped by the server.
                "SETTINGS non_replicated_deduplication_window = 1000" + _policy(tiering))
    else:
        tail = f"ENGINE = ReplacingMergeTree\nPARTITION BY intDiv(ts, 86400000)\n{_order('gpu_frames')}"
    return f"CREATE TABLE IF NOT EXISTS {db}.gpu_frames (\n  {body}\n)\n{tail}"


def derived_columns(layout: Layout = "current") -> list[str]:
    """The derived columns' definitions, also what ``gpu_frames_migrations`` adds to an older table.

    >>> derived_columns("legacy")[-2:]
    ['sm_active_p99 Nullable(Float64)', 'derive_note String']
    """
    fcodec = " CODEC(Gorilla, ZSTD(1))" if layout == "current" else ""
    cols = [f"{c} {'Nullable(UInt8)' if c == 'idle' else 'Nullable(Float64)' + fcodec}" for c in DERIVED_COLS]
    return [*cols, f"{frames.NOTE_COLUMN} {'LowCardinality(String)' if layout == 'current' else 'String'}"]


def gpu_frames_migrations(db: str, existing: set[str], layout: Layout = "current") -> list[str]:
    """ALTERs that bring a ``gpu_frames`` made by an older flopwatch up to date (new columns only;
    rows written before read NULL, or "" for the note).

    >>> for stmt in gpu_frames_migrations("fw", set(FRAME_COLUMNS) - {"precision", "idle"}, "legacy"):
    ...     print(stmt)
    ALTER TABLE fw.gpu_frames ADD COLUMN precision String
    ALTER TABLE fw.gpu_frames ADD COLUMN idle Nullable(UInt8)
    """
    check_identifier(db)
    wanted = [f"{c} {_label_type(c, layout)}" for c in LABEL_COLS] + derived_columns(layout)
    return [f"ALTER TABLE {db}.gpu_frames ADD COLUMN {d}" for d in wanted if d.split(" ", 1)[0] not in existing]


def frames_codec_migrations(db: str, create_query: str) -> list[str]:
    """ALTERs that give an older ``gpu_frames``' derived columns the codec of the current layout (their
    values are stored at a resolution since schema version 4, which Gorilla + ZSTD compresses; new parts
    get it, old parts keep theirs until merged).

    >>> frames_codec_migrations("fw", "CREATE TABLE fw.gpu_frames (tflops Nullable(Float64), idle Nullable(UInt8))")[0]
    'ALTER TABLE fw.gpu_frames MODIFY COLUMN tflops Nullable(Float64) CODEC(Gorilla, ZSTD(1))'
    >>> frames_codec_migrations("fw", gpu_frames("fw"))
    []
    """
    check_identifier(db)
    return [f"ALTER TABLE {db}.gpu_frames MODIFY COLUMN {d}" for d in derived_columns("current")
            if "CODEC" in d and re.search(rf"\b{d.split(' ', 1)[0]}`? Nullable\(Float64\) CODEC", create_query) is None]


def leak_episodes_query(db: str, rules: tuple[str, ...], layout: Layout = "current") -> str:
    """One row per leak episode from ``detections``: start, end (now while it lasts), who, which rule, the
    USD per hour it burns (its evidence's ``cost_usd_per_h``) and the USD burnt so far, and its likeliest
    cause. Exact without FINAL: an episode's rows are grouped by its id.

    >>> print(leak_episodes_query("fw", ("idle_allocated",)).splitlines()[-2])
    FROM (SELECT * FROM fw.detections WHERE rule IN ('idle_allocated'))
    """
    check_identifier(db)
    for r in rules:
        check_identifier(r)
    cur = layout == "current"
    now = "toDateTime64(now64(3), 3, 'UTC')" if cur else "toUInt64(now()) * 1000"
    ms = "toUnixTimestamp64Milli({})" if cur else "{}"
    names = ", ".join(f"'{r}'" for r in rules)
    return (
        "SELECT id, any(rule) AS rule, any(node) AS node, any(gpu) AS gpu, anyLast(workload) AS workload,\n"
        "  anyLast(namespace) AS namespace, min(onset_ts) AS start_ts, countIf(state = 'resolved') > 0 AS resolved,\n"
        f"  if(resolved, maxIf(ts, state = 'resolved'), {now}) AS end_ts,\n"
        "  max(visitParamExtractFloat(evidence, 'cost_usd_per_h')) AS usd_per_h,\n"
        f"  round(usd_per_h * ({ms.format('end_ts')} - {ms.format('start_ts')}) / 3600000, 4) AS usd,\n"
        "  visitParamExtractString(argMax(causes, length(causes)), 'cause') AS cause\n"
        f"FROM (SELECT * FROM {db}.detections WHERE rule IN ({names}))\n"  # the aliases above shadow the columns
        "GROUP BY id")


def leak_episodes_view(db: str, rules: tuple[str, ...]) -> str:
    """``leak_episodes``: the leak ledger for SQL users (the current layout; see ``leak_episodes_query``)."""
    return f"CREATE OR REPLACE VIEW {check_identifier(db)}.leak_episodes AS\n{leak_episodes_query(db, rules)}"


def detections_migrations(db: str, existing: set[str]) -> list[str]:
    """ALTERs that bring a ``detections`` made by an older flopwatch up to date.

    >>> detections_migrations("fw", {"ts", "evidence"})
    ["ALTER TABLE fw.detections ADD COLUMN causes String DEFAULT '[]'"]
    """
    check_identifier(db)
    return [] if "causes" in existing else [f"ALTER TABLE {db}.detections ADD COLUMN causes String DEFAULT '[]'"]


def detections(db: str, layout: Layout = "current") -> str:
    """Every alert message (firing and resolved) the detectors emitted; a replay rewrites the same
    (id, state) row, which the engine collapses, and so does the attribution that follows a firing
    (``causes``: the ranked list as JSON, ``[]`` before it)."""
    check_identifier(db)
    cur = layout == "current"
    lc = "LowCardinality(String)" if cur else "String"
    ts = "DateTime64(3, 'UTC')" if cur else "UInt64"
    return (f"CREATE TABLE IF NOT EXISTS {db}.detections (\n  ts {ts}, onset_ts {ts}, id String, state {lc},"
            f" rule {lc}, severity {lc}, node {lc}, gpu {lc}, workload {lc}, namespace {lc},"
            " value Float64, threshold Float64, baseline Nullable(Float64), evidence String, causes String\n)\n"
            f"ENGINE = ReplacingMergeTree\n{_order('detections')}")


def _types(db: str, layout: Layout, ts_digits: int = 3) -> tuple[str, str]:
    """The database name checked, and the label and time column types of ``layout``."""
    check_identifier(db)
    cur = layout == "current"
    return ("LowCardinality(String)" if cur else "String"), (f"DateTime64({ts_digits}, 'UTC')" if cur else "UInt64")


def scale_decisions(db: str, layout: Layout = "current") -> str:
    """Every decision of the engine: taken (its trigger went to Kafka), withheld (``gate`` held it) and
    rollbacks (``reverses``). A replay rewrites the same (id, outcome) row, which the engine collapses."""
    lc, ts = _types(db, layout)
    return (f"CREATE TABLE IF NOT EXISTS {db}.scale_decisions (\n  ts {ts}, id String, outcome {lc}, action {lc},"
            f" namespace {lc}, workload {lc}, workload_class {lc}, current UInt32, desired UInt32, delta Int32,"
            f" reasons Array(String), gate {lc}, gates Array(String), evidence String, reverses String,"
            f" idempotency_key String, before_replicas UInt32, before_desired UInt32, before_action {lc},"
            " before_action_ts_ns Int64\n)\n"
            f"ENGINE = ReplacingMergeTree\n{_order('scale_decisions')}")


def k8s_events(db: str, layout: Layout = "current") -> str:
    lc, ts = _types(db, layout, 9)
    return (f"CREATE TABLE IF NOT EXISTS {db}.k8s_events (\n  ts {ts}, node {lc}, type {lc}, reason {lc}, kind {lc},"
            f" namespace {lc}, pod String, workload {lc}, gpus Array(String), message String,"
            f" kafka_topic {lc}, kafka_partition UInt32, kafka_offset UInt64\n)\n"
            # Row identity is the Kafka position, so a redelivered event replaces itself.
            f"ENGINE = ReplacingMergeTree\n{_order('k8s_events')}")


def ingest_progress(db: str, layout: Layout = "current") -> str:
    check_identifier(db)
    ts = "DateTime64(3, 'UTC')" if layout == "current" else "UInt64"
    return (f"CREATE TABLE IF NOT EXISTS {db}.ingest_progress (\n  topic String, partition UInt32, offset UInt64,"
            f" written_at {ts}\n)\nENGINE = ReplacingMergeTree\n{_order('ingest_progress')}")


def node_progress(db: str, layout: Layout = "current") -> str:
    """Per node, the newest grid tick known final (written, or closed empty): a replay after a
    crash must not reopen an empty tick that a late sample was already refused for."""
    check_identifier(db)
    ts = "DateTime64(3, 'UTC')" if layout == "current" else "UInt64"
    return (f"CREATE TABLE IF NOT EXISTS {db}.node_progress (\n  node String, closed_tick_ms UInt64,"
            f" written_at {ts}\n)\nENGINE = ReplacingMergeTree\n{_order('node_progress')}")


def frames_ttl(db: str, days: int, tiering: Tiering | None = None) -> str:
    """What changes an existing ``gpu_frames`` table's retention to ``days`` (and its move to a cold volume).

    >>> frames_ttl("fw", 30)
    'ALTER TABLE fw.gpu_frames MODIFY TTL toDateTime(ts) + INTERVAL 30 DAY'
    """
    check_identifier(db)
    if int(days) < 1:
        raise ValueError(f"the frames' retention must be at least 1 day, got {days}")
    return f"ALTER TABLE {db}.gpu_frames MODIFY TTL {ttl_clause('toDateTime(ts)', days, tiering)}"


def _policy(tiering: Tiering | None) -> str:
    return "" if tiering is None else f", storage_policy = '{tiering.policy}'"


def storage_policy(db: str, table: str, tiering: Tiering) -> str:
    """What puts an existing table on the tiering's storage policy (the server refuses a policy that lacks a volume
    of the table's present one: keep the default policy's volume, ``default`` on disk ``default``, as the hot one).

    >>> storage_policy("fw", "gpu_frames", Tiering("tiered"))
    "ALTER TABLE fw.gpu_frames MODIFY SETTING storage_policy = 'tiered'"
    """
    return f"ALTER TABLE {check_identifier(db)}.{check_identifier(table)} MODIFY SETTING{_policy(tiering)[1:]}"


def ttl_days_of(create_table_query: str) -> int | None:
    """The retention in days a ``SHOW CREATE TABLE`` of ``gpu_frames`` or a rollup states, or None without a TTL.

    >>> ttl_days_of("... TTL toDateTime(ts) + toIntervalDay(400) SETTINGS ...")
    400
    >>> ttl_days_of("... TTL toDateTime(ts) + INTERVAL 30 DAY") , ttl_days_of("ENGINE = MergeTree")
    (30, None)
    >>> ttl_days_of("... TTL ts + toIntervalDay(1825) SETTINGS ...")  # a rollup's (its ts is a DateTime)
    1825
    >>> ttl_days_of("TTL ts + toIntervalDay(7) TO VOLUME 'cold', ts + toIntervalDay(90) SETTINGS x = 1")
    90
    """
    ttl = re.search(r"\bTTL\s+(.*?)(?:\s+SETTINGS\b|$)", create_table_query, re.S)
    if ttl is None:
        return None
    # The rule that deletes: the one not followed by TO VOLUME / TO DISK.
    for m in re.finditer(r"(?:toDateTime\(ts\)|ts)\s*\+\s*(?:toIntervalDay\((\d+)\)|INTERVAL\s+(\d+)\s+DAY)"
                         r"(\s+TO\s+(?:VOLUME|DISK))?", ttl.group(1)):
        if m.group(3) is None:
            return int(m.group(1) or m.group(2))
    return None


def schema_version(db: str, layout: Layout = "current") -> str:
    """Which versions of flopwatch's schema were applied to the database, and when (``agents.sinks.schema``)."""
    _, ts = _types(db, layout)
    return (f"CREATE TABLE IF NOT EXISTS {db}.schema_version (\n  version UInt32, applied_at {ts}, by String\n)\n"
            "ENGINE = ReplacingMergeTree\nORDER BY version")


def tables(db: str, layout: Layout = "current", retention_days: int = 400,
           tiering: Tiering | None = None) -> dict[str, str]:
    """Each base table's name and what creates it, in the order to create them."""
    return {"gpu_frames": gpu_frames(db, layout, retention_days, tiering), "k8s_events": k8s_events(db, layout),
            "ingest_progress": ingest_progress(db, layout), "node_progress": node_progress(db, layout),
            "detections": detections(db, layout), "scale_decisions": scale_decisions(db, layout),
            "schema_version": schema_version(db, layout)}
