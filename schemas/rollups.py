"""Rollups of ``gpu_frames`` at 1 minute and 1 hour: AggregatingMergeTree tables fed by materialized views.

A month of 1,000 GPUs at a 1 s grid is 2.6 billion raw rows; its 1 h rollup is 720,000. Each
rollup row holds one GPU's bucket for one workload (the labels are part of the key, so a GPU
that changed hands within a bucket has a row per holder):

- ``frames``: the raw rows it sums (``frames * grid`` is GPU-time); ``energy_j_sum``, ``cost_usd_sum``;
  ``idle_frames`` and ``idle_cost_usd``: frames a pod held the GPU while it idled (derive's
  ``idle``), and what they cost; ``tflops_sum`` and ``requests_sum``, which times the grid are the
  TFLOP/s-seconds delivered and the requests served (cost per TFLOP/s-hour and per request are ratios
  of sums, not averages of per-frame ratios);
- per measure ``<m>_avg`` (``avgMerge``), ``<m>_max`` (``max``), and for the ones people look at as
  distributions ``<m>_q`` (``quantilesTDigestMerge(0.5, 0.9, 0.99)``: a t-digest keeps a bucket's
  state small, a few hundred bytes, at about 1% of rank error).

The minute rollup's view reads each block inserted into ``gpu_frames``; the hourly one's reads each
block the minute rollup receives (a 60th of the rows: the views' work per insert is what the worker
pays). Sums, counts, averages and maxima read from either equal the raw table's; the quantiles are
estimates. Written rows are never double counted: a retried block carries the same
``insert_deduplication_token`` and ``deduplicate_blocks_in_dependent_materialized_views`` drops it
from the rollups as from ``gpu_frames`` (``INSERT_SETTINGS``).

Only the current layout has rollups (the legacy server keeps the raw table alone).

>>> [r.table for r in ROLLUPS]
['gpu_rollup_1m', 'gpu_rollup_1h']
>>> print(rollup_table("fw", ROLLUPS[1], 1825).splitlines()[-3])
ORDER BY (node, gpu, ts, namespace, workload, workload_class, gpu_model, region, precision)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from schemas.ddl import check_identifier
from schemas.tiers import Tiering, ttl_clause

# The labels a rollup row is kept per: what people group cost and efficiency by (pod is left out: its
# cardinality would make the rollups as large as the raw table for short-lived pods).
KEY_LABELS: Final = ("namespace", "workload", "workload_class", "gpu_model", "region", "precision")
MEASURES: Final = ("gpu_util", "sm_active", "tensor_active", "power", "temperature", "fb_used", "tflops",
                   "flops_per_watt", "cost_per_tflops")
DISTRIBUTIONS: Final = ("gpu_util", "power", "flops_per_watt", "cost_per_tflops")
LEVELS: Final = (0.5, 0.9, 0.99)
# Settings every insert into gpu_frames carries: a retried block is dropped by the rollups' views too.
INSERT_SETTINGS: Final = {"deduplicate_blocks_in_dependent_materialized_views": 1}
RETENTION_DAYS: Final = (400, 1825)  # the 1 min and 1 h rollups' defaults (FLOPWATCH_ROLLUP_1M/1H_RETENTION_DAYS)


@dataclass(frozen=True, slots=True)
class Rollup:
    table: str
    bucket: str  # the ClickHouse function that starts a row's bucket
    seconds: int


ROLLUPS: Final = (Rollup("gpu_rollup_1m", "toStartOfMinute", 60), Rollup("gpu_rollup_1h", "toStartOfHour", 3600))


def _levels() -> str:
    return ", ".join(str(q) for q in LEVELS)


def _days(days: int) -> int:
    if int(days) < 1:
        raise ValueError(f"a rollup's retention must be at least 1 day, got {days}")
    return int(days)


def rollup_table(db: str, r: Rollup, retention_days: int, tiering: Tiering | None = None) -> str:
    check_identifier(db)
    lc = "LowCardinality(String)"
    cols = ["ts DateTime('UTC') CODEC(DoubleDelta, ZSTD(1))", f"node {lc}", f"gpu {lc}"]
    cols += [f"{k} {lc}" for k in KEY_LABELS]
    cols += ["frames SimpleAggregateFunction(sum, UInt64)", "energy_j_sum SimpleAggregateFunction(sum, Float64)",
             "cost_usd_sum SimpleAggregateFunction(sum, Float64)", "idle_frames SimpleAggregateFunction(sum, UInt64)",
             "idle_cost_usd SimpleAggregateFunction(sum, Float64)", "tflops_sum SimpleAggregateFunction(sum, Float64)",
             "requests_sum SimpleAggregateFunction(sum, Float64)"]
    for m in MEASURES:
        cols += [f"{m}_avg AggregateFunction(avg, Nullable(Float64))",
                 f"{m}_max SimpleAggregateFunction(max, Nullable(Float64))"]
        if m in DISTRIBUTIONS:
            cols.append(f"{m}_q AggregateFunction(quantilesTDigest({_levels()}), Nullable(Float64))")
    body = ",\n  ".join(cols)
    return (f"CREATE TABLE IF NOT EXISTS {db}.{r.table} (\n  {body}\n)\nENGINE = AggregatingMergeTree\n"
            f"PARTITION BY toYYYYMM(ts)\nORDER BY (node, gpu, ts, {', '.join(KEY_LABELS)})\n"
            f"TTL {ttl_clause('ts', _days(retention_days), tiering)}\n"
            "SETTINGS non_replicated_deduplication_window = 1000"
            + ("" if tiering is None else f", storage_policy = '{tiering.policy}'"))


def rollup_view(db: str, r: Rollup) -> str:
    """The materialized view that aggregates each block inserted into ``gpu_frames`` into ``r``."""
    return f"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.{r.table}_mv TO {db}.{r.table} AS\n{_select(db, r)}"


def rollup_backfill(db: str, r: Rollup) -> str:
    """What fills a new rollup from the frames written before it existed (its view only sees new blocks)."""
    return f"INSERT INTO {db}.{r.table}\n{_select(db, r)}"


def _select(db: str, r: Rollup, where: str = "") -> str:
    """``where`` (a condition on the source's rows) is for a rebuild, which reads ``gpu_frames`` FINAL: a block
    replayed under another token is there twice until a merge."""
    check_identifier(db)
    if r is not ROLLUPS[0]:
        return _from_minutes(db, r, where)
    idle = "idle = 1 AND pod != ''"  # a GPU nobody holds is free capacity, not a waste
    sel = [f"{r.bucket}(ts) AS ts", "node", "gpu", *KEY_LABELS, "count() AS frames",
           "sum(ifNull(energy_j, 0)) AS energy_j_sum", "sum(ifNull(cost_usd, 0)) AS cost_usd_sum",
           f"countIf({idle}) AS idle_frames", f"sumIf(ifNull(cost_usd, 0), {idle}) AS idle_cost_usd",
           "sum(ifNull(tflops, 0)) AS tflops_sum", "sum(ifNull(request_rate, 0)) AS requests_sum"]
    for m in MEASURES:
        sel += [f"avgState({m}) AS {m}_avg", f"max({m}) AS {m}_max"]
        if m in DISTRIBUTIONS:
            sel.append(f"quantilesTDigestState({_levels()})({m}) AS {m}_q")
    cols = ",\n  ".join(sel)
    source = f"{db}.gpu_frames FINAL WHERE {where}" if where else f"{db}.gpu_frames"
    return f"SELECT\n  {cols}\nFROM {source}\nGROUP BY ts, node, gpu, {', '.join(KEY_LABELS)}"


def _from_minutes(db: str, r: Rollup, where: str = "") -> str:
    """A coarser rollup from the minute one (a 60th of the rows to aggregate per insert): sums of sums, maxima of
    maxima, merged states; exact as from the frames, but for the t-digests, which merge approximately."""
    keys = ", ".join(KEY_LABELS)
    sums = ("frames", "energy_j_sum", "cost_usd_sum", "idle_frames", "idle_cost_usd", "tflops_sum", "requests_sum")
    inner = ["ts AS t", "node", "gpu", *KEY_LABELS, *(f"{c} AS s_{c}" for c in sums)]
    outer = [f"{r.bucket}(t) AS ts", "node", "gpu", *KEY_LABELS, *(f"sum(s_{c}) AS {c}" for c in sums)]
    for m in MEASURES:
        inner += [f"{m}_avg AS a_{m}", f"{m}_max AS x_{m}"]
        outer += [f"avgMergeState(a_{m}) AS {m}_avg", f"max(x_{m}) AS {m}_max"]
        if m in DISTRIBUTIONS:
            inner.append(f"{m}_q AS q_{m}")
            outer.append(f"quantilesTDigestMergeState({_levels()})(q_{m}) AS {m}_q")
    # The source's columns renamed in a subquery: an alias equal to the column it aggregates would be circular.
    source = f"{db}.{ROLLUPS[0].table}" + (f" WHERE {where}" if where else "")
    return (f"SELECT\n  {', '.join(outer)}\nFROM (SELECT {', '.join(inner)} FROM {source})\n"
            f"GROUP BY ts, node, gpu, {keys}")


def rollup_disagreements(db: str, since_s: int) -> list[str]:
    """Queries of the (node, hour) pairs, from the hour of ``since_s`` (epoch seconds) on, where the minute
    rollup's frames differ from ``gpu_frames`` FINAL in some minute, or the hourly rollup's from the minute one's.

    An insert commits the table's part before its views' parts: a worker killed between the two leaves frames
    that no rollup counts (and a replay skips them: they are behind the recovered boundary).
    """
    check_identifier(db)
    m, h = ROLLUPS
    t = int(since_s)
    hour = f"toStartOfHour(toDateTime({t}, 'UTC'))"
    minutes = (f"SELECT node, toStartOfMinute(toDateTime(ts, 'UTC')) AS b, count() AS n FROM {db}.gpu_frames FINAL "
               f"WHERE ts >= {hour} GROUP BY node, b")
    rolled = f"SELECT node, ts AS b, sum(frames) AS n FROM {db}.{m.table} WHERE ts >= {hour} GROUP BY node, b"
    hours = (f"SELECT node, toStartOfHour(ts) AS b, sum(frames) AS n FROM {db}.{m.table} WHERE ts >= {hour} "
             "GROUP BY node, b")
    rolled_h = f"SELECT node, ts AS b, sum(frames) AS n FROM {db}.{h.table} WHERE ts >= {hour} GROUP BY node, b"
    # A missing side joins as 0 frames (join_use_nulls is off): a bucket only one side has differs.
    return [f"SELECT DISTINCT node, toUInt32(toStartOfHour(b)) FROM ({a}) AS x FULL OUTER JOIN ({b}) AS y "
            "USING (node, b) WHERE x.n != y.n" for a, b in ((minutes, rolled), (hours, rolled_h))]


def rollup_rebuild(db: str, node: str, hour: str) -> list[str]:
    """Statements that rebuild one node's hour in both rollups from ``gpu_frames`` FINAL; ``node`` and ``hour``
    are the placeholders of a String and a UInt32 (epoch seconds) parameter.

    In this order, each step safe to crash after (the next check finds what is still off): the minutes go and
    come back from the frames (the hourly view adds them to the hour a second time), then the hour goes and
    comes back from the minutes. ``insert_deduplicate = 0``: a rebuild's block may equal an earlier one's, and
    the tables would drop it as a duplicate.
    """
    m, h = ROLLUPS
    span = f"node = {node} AND ts >= toDateTime({hour}, 'UTC') AND ts < toDateTime({hour} + 3600, 'UTC')"
    once = "SETTINGS insert_deduplicate = 0"
    drop = "SETTINGS mutations_sync = 2"
    return [f"ALTER TABLE {db}.{m.table} DELETE WHERE {span} {drop}",
            f"INSERT INTO {db}.{m.table} {once}\n{_select(db, m, span)}",
            f"ALTER TABLE {db}.{h.table} DELETE WHERE {span} {drop}",
            f"INSERT INTO {db}.{h.table} {once}\n{_select(db, h, span)}"]


def rollup_ttl(db: str, r: Rollup, days: int, tiering: Tiering | None = None) -> str:
    """What changes an existing rollup's retention (and its move to a cold volume)."""
    return f"ALTER TABLE {check_identifier(db)}.{r.table} MODIFY TTL {ttl_clause('ts', _days(days), tiering)}"
