"""flopwatch's tables on a ClickHouse cluster: each table of ``schemas.ddl`` becomes a replicated local table
``<name>_local`` on every node plus a ``Distributed`` table ``<name>`` over it, both made ``ON CLUSTER``.

Readers and writers keep using ``<name>``: a write through the Distributed table goes (synchronously, with
``insert_distributed_sync``) to one replica of the shard its key picks, and replication copies it; a read asks
one replica of each shard. The key keeps one GPU's frames (and one id's rows) on one shard, so the
ReplacingMergeTree identity and ``FINAL`` work per shard as on one server. A replicated table also drops a
block it has already stored (``insert_deduplicate``, by the block's hash, in ZooKeeper): a retried insert
after a lost reply stores nothing twice, on every server version.

>>> sql = ("CREATE TABLE IF NOT EXISTS fw.detections (\\n  id String, state String\\n)\\n"
...        "ENGINE = ReplacingMergeTree\\nORDER BY (id, state)")
>>> for s in clustered(sql, "c1"):  # doctest: +ELLIPSIS
...     print(s)
CREATE TABLE IF NOT EXISTS fw.detections_local ON CLUSTER c1 (
  id String, state String
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/fw/detections', '{replica}')
ORDER BY (id, state)
CREATE TABLE IF NOT EXISTS fw.detections ON CLUSTER c1 AS fw.detections_local ENGINE = Distributed(c1, fw, ...)
"""

from __future__ import annotations

import re
from typing import Final

from schemas.ddl import check_identifier

__all__ = ["LOCAL_SUFFIX", "SHARD_KEYS", "alt_hosts", "check_cluster", "clustered", "clustered_alter", "local_name"]

LOCAL_SUFFIX: Final = "_local"
# What keeps a row's duplicates on one shard: its identity's leading columns.
SHARD_KEYS: Final = {
    "gpu_frames": "cityHash64(node, gpu)", "k8s_events": "cityHash64(kafka_topic, kafka_partition)",
    "ingest_progress": "cityHash64(topic, partition)", "node_progress": "cityHash64(node)",
    "detections": "cityHash64(id)", "scale_decisions": "cityHash64(id)", "schema_version": "version",
}
_CREATE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+)\.(\w+) \(")
_ENGINE = re.compile(r"ENGINE = (\w*)MergeTree\b(\(\))?")
_ALTER = re.compile(r"ALTER TABLE (\w+)\.(\w+) ")
_HOST_PORT = re.compile(r"[A-Za-z0-9.\-]+:[0-9]{1,5}|\[[0-9A-Fa-f:.]+\]:[0-9]{1,5}")


def check_cluster(name: str, backend: str) -> None:
    """ValueError unless ``name`` (empty: no cluster) can name a cluster that ``backend`` writes to."""
    if name and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"{name!r}: not a cluster name (letters, digits and _, as in the server's remote_servers)")
    if name and backend != "native":
        raise ValueError("needs FLOPWATCH_CLICKHOUSE_BACKEND=native (the embedded chDB is one process, not a cluster)")


def alt_hosts(text: str) -> str:
    """``host:port,...`` as the driver takes it (blanks dropped); ValueError naming an entry that is not one.

    >>> alt_hosts(" 127.0.0.1:9102 , [::1]:9103,")
    '127.0.0.1:9102,[::1]:9103'
    """
    hosts = [a.strip() for a in text.split(",") if a.strip()]
    for h in hosts:
        if not _HOST_PORT.fullmatch(h):
            raise ValueError(f"{h!r} is not host:port")
    return ",".join(hosts)


def local_name(table: str) -> str:
    return f"{check_identifier(table)}{LOCAL_SUFFIX}"


def clustered(create_table: str, cluster: str) -> list[str]:
    """The replicated local table and the Distributed table for one ``CREATE TABLE IF NOT EXISTS db.name (...)
    ENGINE = <kind>MergeTree ...`` statement of ``schemas.ddl``."""
    m = _CREATE.match(create_table)
    if m is None or _ENGINE.search(create_table) is None:
        raise ValueError(f"not a CREATE TABLE of a MergeTree table: {create_table[:80]!r}")
    db, name = m.group(1), m.group(2)
    c, local = check_identifier(cluster), local_name(name)
    body = _CREATE.sub(f"CREATE TABLE IF NOT EXISTS {db}.{local} ON CLUSTER {c} (", create_table, count=1)
    # The ZooKeeper path names the table, not the node: every replica of a shard shares it.
    body = _ENGINE.sub(lambda e: f"ENGINE = Replicated{e.group(1)}MergeTree("
                                 f"'/clickhouse/tables/{{shard}}/{db}/{name}', '{{replica}}')", body, count=1)
    dist = (f"CREATE TABLE IF NOT EXISTS {db}.{name} ON CLUSTER {c} AS {db}.{local} "
            f"ENGINE = Distributed({c}, {db}, {local}, {SHARD_KEYS.get(name, 'rand()')})")
    return [body, dist]


def clustered_alter(alter: str, cluster: str) -> list[str]:
    """An ``ALTER TABLE db.name ...`` for both tables: the replicated one (its replicas follow through ZooKeeper),
    then the Distributed one, which must know a new column too.

    >>> clustered_alter("ALTER TABLE fw.gpu_frames ADD COLUMN IF NOT EXISTS idle Nullable(Float64)", "c1")[0]
    'ALTER TABLE fw.gpu_frames_local ON CLUSTER c1 ADD COLUMN IF NOT EXISTS idle Nullable(Float64)'
    """
    m = _ALTER.match(alter)
    if m is None:
        raise ValueError(f"not an ALTER TABLE: {alter[:80]!r}")
    db, name, c = m.group(1), m.group(2), check_identifier(cluster)
    rest = alter[m.end():]
    out = [f"ALTER TABLE {db}.{local_name(name)} ON CLUSTER {c} {rest}"]
    if "ADD COLUMN" in rest or "DROP COLUMN" in rest or "MODIFY COLUMN" in rest:
        out.append(f"ALTER TABLE {db}.{name} ON CLUSTER {c} {rest}")
    return out
