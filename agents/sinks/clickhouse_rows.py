"""Outputs of an agent written as rows of one ClickHouse table, on the worker's ClickHouse thread."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")
Columns = dict[str, list[Any]]


class ClickHouseRows(Generic[T]):
    """A sink of the detection or decision agent: ``columns`` turns a batch into the table's columns, ``run``
    runs the insert on the thread that owns the ClickHouse connection (``Ingestor.on_clickhouse``)."""

    def __init__(self, table: str, columns: Callable[[Sequence[T]], Columns],
                 run: Callable[[Callable[[Any], None]], Awaitable[None]]) -> None:
        self.table = table
        self._columns = columns
        self._run = run

    async def send(self, batch: Sequence[T]) -> None:
        cols = self._columns(batch)
        await self._run(lambda backend: backend.insert(self.table, cols))
