"""Finds the rollup buckets a crash left short of ``gpu_frames`` and rebuilds them, node by node.

An insert into ``gpu_frames`` commits the table's part before its materialized views' parts: a worker killed
between the two leaves frames the rollups never count, and the replay does not write them again (they are behind
the boundary the next worker recovers). ``scan`` looks for such buckets when partitions are assigned; ``repair``
rebuilds a node's buckets before the first write of that node's frames, so only the owner of a node's partition
touches its rollups: another worker's insert in flight looks like a hole for a moment, and rebuilding under it
would count its block twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from agents.sinks.clickhouse import Backend, ClickHouseError, ClickHouseUnreachable, existing_tables
from schemas import rollups

log = logging.getLogger(__name__)

# How far back a scan looks from the newest frame: a killed worker's last insert covers its last flush, and a
# backlog written after an outage covers the outage (its hour and the one before are checked as a whole).
WINDOW_S = 3_600


class RollupRepair:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.suspect: dict[str, set[int]] = {}  # node -> hours (epoch s) whose rollups disagree with the frames
        self.rebuilt = 0

    def fed(self) -> bool:
        """Whether both rollups are fed here (the current layout, rollups on)."""
        if self.backend.layout != "current":
            return False
        return {f"{r.table}_mv" for r in rollups.ROLLUPS} <= existing_tables(self.backend).keys()

    def scan(self, newest_s: int) -> None:
        """Note every (node, hour) within ``WINDOW_S`` of ``newest_s`` whose rollups disagree with the frames."""
        self.suspect = {}
        if not newest_s or not self.fed():
            return
        try:
            for sql in rollups.rollup_disagreements(self.backend.database, newest_s - WINDOW_S):
                for node, hour in self.backend.rows(sql)[1]:
                    self.suspect.setdefault(str(node), set()).add(int(hour))
        except ClickHouseUnreachable:
            raise  # the assignment waits for the server, as its other reads do
        except ClickHouseError as exc:  # a server that refuses the check: the frames matter more than the rollups
            self.suspect = {}
            log.error("could not compare the rollups with gpu_frames; they are not checked this time: %s", exc)
            return
        if self.suspect:
            log.info("the rollups of %d node(s) disagree with gpu_frames (a worker killed mid-insert, or another "
                     "worker's insert in flight): those this worker writes are rebuilt before their next frames",
                     len(self.suspect))

    def repair(self, nodes: Iterable[str]) -> None:
        """Rebuild the suspect hours of ``nodes``, whose partitions this worker owns."""
        db = self.backend.database
        for node in sorted(set(nodes) & self.suspect.keys()):
            for hour in sorted(self.suspect[node]):
                try:
                    for sql in rollups.rollup_rebuild(db, self.backend.param("node", "String"),
                                                      self.backend.param("hour", "UInt32")):
                        self.backend.execute(sql, {"node": node, "hour": hour})
                except ClickHouseUnreachable:
                    raise  # the write is retried, and this rebuild with it
                except ClickHouseError as exc:  # refused (a read-only user, say): the write goes on without it
                    log.error("could not rebuild the rollups of node %s for the hour from %d; the next assignment "
                              "checks them again: %s", node, hour, exc)
                    continue
                self.rebuilt += 1
                log.warning("rebuilt the rollups of node %s for the hour from %d: they disagreed with gpu_frames",
                            node, hour)
            del self.suspect[node]
