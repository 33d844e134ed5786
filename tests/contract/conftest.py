"""Fixtures for the store contract suite: one suite, three stores (memory, SQLite, PostgreSQL).

Tests are plain functions that hand an async body to `use_store`, which opens a fresh store,
awaits the body on a new event loop (`asyncio.run`) and closes the store. PostgreSQL is required:
when the server does not answer, its tests fail with a message saying so (never skip).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from corral.core.ports import Store
from corral.store.memory import MemoryStore
from corral.store.postgres import PostgresStore
from corral.store.sqlite import SqliteStore

PG_DSN = os.environ.get("CORRAL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

Body = Callable[[Store], Awaitable[None]]
UseStore = Callable[[Body], None]


def pg_dsn_for(schema: str) -> str:
    """The test server's DSN with every connection's search_path set to `schema`."""
    sep = "&" if "?" in PG_DSN else "?"
    return f"{PG_DSN}{sep}options={quote(f'-csearch_path={schema}', safe='')}"


def _pg_admin() -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(PG_DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as err:
        why = str(err).strip()
    pytest.fail(
        f"PostgreSQL is required for the contract suite but {PG_DSN} does not answer: {why}\n"
        "Start the server (trust auth, database 'test') and run again; these tests never skip.",
        pytrace=False,
    )


class PgSchemas:
    """Creates uniquely named schemas on the test server and drops them afterwards."""

    def __init__(self) -> None:
        self._made: list[str] = []

    def new(self) -> str:
        """A fresh empty schema; returns a DSN whose connections use it."""
        name = f"corral_t_{uuid.uuid4().hex[:12]}"
        with _pg_admin() as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        self._made.append(name)
        return pg_dsn_for(name)

    def drop_all(self) -> None:
        if not self._made:
            return
        with _pg_admin() as conn:
            for name in self._made:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        self._made.clear()


@pytest.fixture
def pg_schemas() -> Iterator[PgSchemas]:
    schemas = PgSchemas()
    try:
        yield schemas
    finally:
        schemas.drop_all()


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
