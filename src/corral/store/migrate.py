"""Schema migrations: append-only SQL files per dialect; a fresh database loads the current schema.

tests/contract/test_migrations.py proves that applying every migration to an empty database gives
exactly the current schema file's result.

What SQL cannot say alike for both databases (triggers) lives beside the portable files: the
current schema is `schema.sql` plus `schema.<dialect>.sql`; a migration `NNNN_name.sql` is replaced
by `NNNN_name.<dialect>.sql` where one exists. A few steps need Python between two migrations
(hashing rows onto the audit chain before the triggers that forbid changing them): `_AFTER`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from importlib import resources

from corral.store.chain_sql import seal_legacy_evaluations
from corral.store.driver import Driver, Tx
from corral.store.peek import MIGRATION_NAME as _NAME

# One SQL source for both databases: PostgreSQL's is SQLite's with these type names. A migration
# that needs more than that ships `NNNN_name.postgres.sql` beside it, which replaces it there.
_POSTGRES_TYPES = (
    (re.compile(r"INTEGER PRIMARY KEY AUTOINCREMENT"), "BIGSERIAL PRIMARY KEY"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
)


def for_dialect(sql: str, dialect: str) -> str:
    """The SQL source as the dialect needs it."""
    if dialect == "postgres":
        for pattern, replacement in _POSTGRES_TYPES:
            sql = pattern.sub(replacement, sql)
    return sql


def migrations(dialect: str) -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration for the dialect, in order."""
    folder = resources.files("corral.store").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        m = _NAME.match(entry.name)
        if not m:
            continue
        override = folder.joinpath(entry.name.removesuffix(".sql") + f".{dialect}.sql")
        sql = (
            override.read_text() if override.is_file() else for_dialect(entry.read_text(), dialect)
        )
        found.append((int(m.group(1)), entry.name, sql))
    return sorted(found)


# Run after the migration of that version, in its transaction (not on a fresh database: the
# schema file has nothing to convert).
_AFTER: dict[int, Callable[[Tx], Awaitable[None]]] = {5: seal_legacy_evaluations}


def current_schema(dialect: str) -> str:
    """The schema a fresh database gets: the portable file, then the dialect's own part."""
    folder = resources.files("corral.store")
    extra = folder.joinpath(f"schema.{dialect}.sql")
    tail = "\n" + extra.read_text() if extra.is_file() else ""
    return for_dialect(folder.joinpath("schema.sql").read_text(), dialect) + tail


def statements(script: str) -> list[str]:
    """Split a migration into statements (our SQL files keep `;` only at line ends)."""
    body = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in re.split(r";\s*\n", body + "\n") if s.strip()]


async def _run(tx: Tx, script: str) -> None:
    for stmt in statements(script):
        await tx.execute(stmt)


async def migrate(driver: Driver, *, fresh_from_schema: bool = True) -> int:
    """Bring the database to the latest version; returns the version reached."""
    steps = migrations(driver.dialect)
    latest = steps[-1][0] if steps else 0
    if await _version(driver) == latest:
        # Up to date: no write, so a command that only reads works while another process holds
        # the store's write lock (an outage the engine rides out).
        return latest
    async with driver.write() as tx:
        if driver.dialect == "postgres":
            # Several engines may start at once on one database: migrate one at a time.
            await tx.execute("SELECT pg_advisory_xact_lock(7263540001)")
        await tx.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations"
            " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        row = await tx.fetchone("SELECT MAX(version) AS v FROM schema_migrations")
        version = int(row["v"]) if row and row["v"] is not None else 0
        now = time.time()
        if version == 0 and fresh_from_schema:
            await _run(tx, current_schema(driver.dialect))
            for v, name, _ in steps:
                await tx.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", (v, name, now))
            return latest
        for v, name, sql in steps:
            if v > version:
                await _run(tx, sql)
                if v in _AFTER:
                    await _AFTER[v](tx)
                await tx.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", (v, name, now))
    return latest


async def _version(driver: Driver) -> int | None:
    """The version the database is at, or None when it has no migrations table yet."""
    try:
        async with driver.read() as tx:
            row = await tx.fetchone("SELECT MAX(version) AS v FROM schema_migrations")
    except Exception:  # no table yet (a fresh database): the write below creates it
        return None
    return int(row["v"]) if row and row["v"] is not None else None
