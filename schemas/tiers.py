"""Hot and cold storage for the frames and the rollups: a server's storage policy with a volume for old parts,
and TTL rules that move a day's part there after ``hot_days`` and delete it after the table's retention.

The policy itself is the server's (its ``storage_configuration``: e.g. the default disk as the hot volume and a
large or remote disk as the cold one); flopwatch names it and writes the rules.

>>> t = Tiering("tiered", hot_days=7)
>>> ttl_clause("toDateTime(ts)", 400, t)
"toDateTime(ts) + INTERVAL 7 DAY TO VOLUME 'cold', toDateTime(ts) + INTERVAL 400 DAY"
>>> ttl_clause("ts", 30, None)
'ts + INTERVAL 30 DAY'
>>> tier_of("TTL toDateTime(ts) + toIntervalDay(7) TO VOLUME 'cold', toDateTime(ts) + toIntervalDay(400) SETTINGS "
...         "storage_policy = 'tiered', index_granularity = 8192")
(7, 'cold')
>>> policy_of("SETTINGS storage_policy = 'tiered', index_granularity = 8192"), policy_of("SETTINGS x = 1")
('tiered', None)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Tiering", "policy_of", "tier_of", "ttl_clause"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MOVE = re.compile(r"\+\s*(?:toIntervalDay\((\d+)\)|INTERVAL\s+(\d+)\s+DAY)\s+TO\s+VOLUME\s+'(\w+)'")
_POLICY = re.compile(r"storage_policy\s*=\s*'(\w+)'")


@dataclass(frozen=True, slots=True)
class Tiering:
    """Move parts older than ``hot_days`` to ``cold_volume`` of the server's storage policy ``policy``."""

    policy: str
    hot_days: int = 7
    cold_volume: str = "cold"

    def __post_init__(self) -> None:
        for what, name in (("storage policy", self.policy), ("cold volume", self.cold_volume)):
            if not _NAME.fullmatch(name):
                raise ValueError(f"{what} {name!r}: letters, digits and _ only (as in the server's configuration)")
        if int(self.hot_days) < 1:
            raise ValueError(f"hot days must be at least 1, got {self.hot_days}")

    def check(self, layout: str, retentions: dict[str, int]) -> None:
        """ValueError for a layout without TTL moves, or a table (name: retention in days) that keeps rows no
        longer than the hot days."""
        if layout == "legacy":
            raise ValueError("the legacy layout (ClickHouse 18.16) has no TTL moves")
        for table, days in retentions.items():
            if days <= self.hot_days:
                raise ValueError(f"{table} keeps rows for {days} days, not longer than the {self.hot_days} hot days: "
                                 "nothing would ever reach the cold volume")


def ttl_clause(ts: str, retention_days: int, tiering: Tiering | None) -> str:
    """The TTL expression (without ``TTL``) of a table that keeps rows ``retention_days`` days."""
    delete = f"{ts} + INTERVAL {int(retention_days)} DAY"
    if tiering is None:
        return delete
    return f"{ts} + INTERVAL {int(tiering.hot_days)} DAY TO VOLUME '{tiering.cold_volume}', {delete}"


def tier_of(create_table_query: str) -> tuple[int, str] | None:
    """The hot days and cold volume a table's TTL moves parts by, or None."""
    m = _MOVE.search(create_table_query)
    return None if m is None else (int(m.group(1) or m.group(2)), m.group(3))


def policy_of(create_table_query: str) -> str | None:
    m = _POLICY.search(create_table_query)
    return None if m is None else m.group(1)
