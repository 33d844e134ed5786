"""Fixtures for the store contract suite: one suite, three stores (memory, SQLite, PostgreSQL).

Tests are plain functions that hand an async body to `use_store`, which opens a fresh store,
awaits the body on a new event loop (`asyncio.run`) and closes the store. PostgreSQL is required:
when the server does not answer, its tests fail with a message saying so (never skip).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from corral.core.ports import Store
from corral.store.memory import MemoryStore
from corral.store.postgres import PostgresStore
from corral.store.sqlite import SqliteStore
from corral.workers.sealing import KeyFile
from tests.pg import PgSchemas

Body = Callable[[Store], Awaitable[None]]
UseStore = Callable[[Body], None]


def _factory(kind: str, tmp_path: Path, pg_schemas: PgSchemas) -> Callable[[], Store]:
    """Stores that chain with the audit key of `tmp_path` (as every engine's store does)."""
    key = KeyFile(tmp_path / "audit.key")
    if kind == "memory":
        shared = MemoryStore()  # "one database": every instance is the same store
        shared.use_audit_key(key)
        return lambda: shared
    if kind == "sqlite":
        path = tmp_path / "corral.db"
        return lambda: keyed(SqliteStore(path), key)
    dsn = pg_schemas.new()
    return lambda: keyed(PostgresStore(dsn), key)


S = TypeVar("S", bound=Store)


def keyed(store: S, key: KeyFile) -> S:
    store.use_audit_key(key)
    return store


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def new_store(store_kind: str, tmp_path: Path, pg_schemas: PgSchemas) -> Callable[[], Store]:
    """Builds (unopened) store instances that all share one fresh database."""
    return _factory(store_kind, tmp_path, pg_schemas)


def waiting_as_kept(db: Path) -> tuple[dict[str, int], dict[str, int]]:
    """A SQLite store's waiting jobs per environment: as its triggers keep them (`queue_depth`,
    migration 0032; environments with none left out) and as counted."""
    with sqlite3.connect(db) as conn:
        kept = dict(conn.execute("SELECT env_name, waiting FROM queue_depth WHERE waiting <> 0"))
        counted = dict(
            conn.execute(
                "SELECT env_name, COUNT(*) FROM jobs"
                " WHERE state IN ('QUEUED', 'RETRY_WAIT') GROUP BY env_name"
            )
        )
    conn.close()
    return kept, counted


@pytest.fixture
def use_store(new_store: Callable[[], Store], store_kind: str, tmp_path: Path) -> UseStore:
    """`use_store(body)`: run `await body(store)` on an opened store, then close it. On SQLite
    every test then also proves the kept queue depth equal to the count of waiting jobs, after
    whatever lifecycle paths the test took."""

    def run(body: Body) -> None:
        async def main() -> None:
            store = new_store()
            await store.open()
            try:
                await body(store)
            finally:
                await store.close()

        asyncio.run(main())
        if store_kind == "sqlite":
            kept, counted = waiting_as_kept(tmp_path / "corral.db")
            assert kept == counted, "queue_depth drifted from the waiting jobs"

    return run
