"""The SQL driver port: what `SqlStore` and its helpers (admission, chain, governance, migrate,
operator) need of a database connection. SQLite (store/sqlite.py) and PostgreSQL
(store/postgres.py) implement it; nothing here knows either.

Kept apart from store/sql.py so that the helpers the SQL store is built from do not import the
store they are part of (no import circle).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

Row = Mapping[str, Any]


class Tx(Protocol):
    """One open transaction; SQL uses `?` placeholders whatever the driver."""

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int: ...

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None: ...

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...


class Driver(Protocol):
    dialect: str

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    def write(self) -> AbstractAsyncContextManager[Tx]:
        """A serialised read-write transaction, retried by the caller on a lost race."""

    def read(self) -> AbstractAsyncContextManager[Tx]: ...


def indexed_by(driver: Driver, index: str) -> str:
    """` INDEXED BY index` on SQLite, nothing elsewhere: a read held to the index it was built
    for, whatever SQLite's statistics (or their absence) make its planner prefer; PostgreSQL's
    planner keeps each value's own share and needs no hint."""
    return f" INDEXED BY {index}" if driver.dialect == "sqlite" else ""
