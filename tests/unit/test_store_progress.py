"""The store's record of closed ticks (``node_progress``): bounded by the nodes present, exact for recovery."""

from __future__ import annotations

from pathlib import Path

from agents.sinks.clickhouse import ChdbBackend
from agents.sinks.schema import ensure_schema
from agents.sinks.store import FrameStore

S = 1_000_000_000
T0 = 1_796_200_000 * S


def test_closed_ticks_of_nodes_no_longer_held_are_dropped_and_recorded_again_when_they_return(tmp_path: Path) -> None:
    backend = ChdbBackend(tmp_path / "db", "fwprogress")
    try:
        _check(backend)
    finally:
        backend.close()


def _check(backend: ChdbBackend) -> None:
    ensure_schema(backend)
    store = FrameStore(backend)
    store.write(store.detach(), {}, T0 // 10**6 + 1, closed={"a": T0, "b": T0})
    store.write(store.detach(), {}, T0 // 10**6 + 2, closed={"b": T0 + 5 * S})  # the aligners forgot node a
    assert set(store._closed_written) == {"b"}
    assert store.recover().recovered.boundaries == {"a": T0, "b": T0 + 5 * S}
    store.write(store.detach(), {}, T0 // 10**6 + 3, closed={"a": T0 + 9 * S, "b": T0 + 5 * S})  # a is back and moved on
    assert store.recover().recovered.boundaries == {"a": T0 + 9 * S, "b": T0 + 5 * S}
    _, rows = backend.rows("SELECT node, count() FROM fwprogress.node_progress GROUP BY node ORDER BY node")
    assert rows == [("a", 2), ("b", 2)]  # b's unchanged tick was not written again
