"""Fixtures for the store contract suite: one suite, three stores (memory, SQLite, PostgreSQL).

Tests are plain functions that hand an async body to `use_store`, which opens a fresh store,
awaits the body on a new event loop (`asyncio.run`) and closes the store. PostgreSQL is required:
when the server does not answer, its tests fail with a message saying so (never skip).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from corral.core.ports import Store
from corral.store.memory import MemoryStore
from corral.store.postgres import PostgresStore
from corral.store.sqlite import SqliteStore
from tests.pg import PgSchemas

Body = Callable[[Store], Awaitable[None]]
UseStore = Callable[[Body], None]




def _factory(kind: str, tmp_path: Path, pg_schemas: PgSchemas) -> Callable[[], Store]:
    if kind == "memory":
        shared = MemoryStore()  # "one database": every instance is the same store
        return lambda: shared
    if kind == "sqlite":
        path = tmp_path / "corral.db"
        return lambda: SqliteStore(path)
    dsn = pg_schemas.new()
    return lambda: PostgresStore(dsn)


@pytest.fixture(
    params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def new_store(store_kind: str, tmp_path: Path, pg_schemas: PgSchemas) -> Callable[[], Store]:
    """Builds (unopened) store instances that all share one fresh database."""
    return _factory(store_kind, tmp_path, pg_schemas)


@pytest.fixture
def use_store(new_store: Callable[[], Store]) -> UseStore:
    """`use_store(body)`: run `await body(store)` on an opened store, then close it."""

    def run(body: Body) -> None:
        async def main() -> None:
            store = new_store()
            await store.open()
            try:
                await body(store)
            finally:
                await store.close()

        asyncio.run(main())

    return run
