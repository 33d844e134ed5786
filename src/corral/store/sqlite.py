"""The embedded default: one SQLite file in WAL mode, written with BEGIN IMMEDIATE."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from corral.domain.errors import StoreBroken, StoreError
from corral.store.driver import Row
from corral.store.migrate import migrate
from corral.store.sql import SqlStore


def _explain(path: str, err: sqlite3.Error) -> StoreError:
    text = str(err).lower()
    if "locked" in text or "busy" in text:
        return StoreError(f"SQLite database {path} is locked by another process ({err})")
    if "full" in text:
        return StoreError(f"disk full: cannot write SQLite database {path}")
    if "malformed" in text or "not a database" in text:
        return StoreBroken(f"SQLite database {path} is damaged ({err}): restore it from a backup")
    if "unable to open" in text or "readonly" in text:
        return StoreError(f"cannot open SQLite database {path}: {err}")
    return StoreError(f"SQLite error on {path}: {err}")


class _Tx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.conn.execute(sql, params).rowcount

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        row: Row | None = self.conn.execute(sql, params).fetchone()
        return row

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return list(self.conn.execute(sql, params).fetchall())


class SqliteDriver:
    """One connection used from the event loop; SQLite calls here take microseconds, so they run
    inline instead of paying a thread hop per statement (bench/ measures the difference)."""

    dialect = "sqlite"

    def __init__(
        self, path: str | Path, *, synchronous: str = "NORMAL", busy_timeout_ms: int = 5000
    ) -> None:
        self.path = str(path)
        self.synchronous = synchronous
        self.busy_timeout_ms = busy_timeout_ms
        self._conn: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        except sqlite3.Error as err:
            raise _explain(self.path, err) from err
        self._conn = conn

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError("the SQLite store is not open")
        return self._conn

    async def _begin(self, conn: sqlite3.Connection) -> None:
        """BEGIN IMMEDIATE: inline when the write lock is free (the common case, microseconds),
        else waited for in a thread, so that another process holding the lock up to the busy
        timeout does not freeze the event loop (the engine keeps answering meanwhile)."""
        conn.execute("PRAGMA busy_timeout = 0")
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err).lower() and "busy" not in str(err).lower():
                raise
        finally:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        await anyio.to_thread.run_sync(conn.execute, "BEGIN IMMEDIATE")

    @asynccontextmanager
    async def write(self) -> AsyncIterator[_Tx]:
        async with self._lock:
            conn = self._connection()
            try:
                await self._begin(conn)
            except sqlite3.Error as err:
                raise _explain(self.path, err) from err
            try:
                yield _Tx(conn)
                conn.execute("COMMIT")
            except BaseException as err:
                # SQLite may already have rolled back on its own (e.g. SQLITE_FULL).
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(err, sqlite3.Error):
                    raise _explain(self.path, err) from err
                raise

    @asynccontextmanager
    async def read(self) -> AsyncIterator[_Tx]:
        async with self._lock:
            try:
                yield _Tx(self._connection())
            except sqlite3.Error as err:
                raise _explain(self.path, err) from err


class SqliteStore(SqlStore):
    """The store on a SQLite file (WAL)."""

    def __init__(
        self, path: str | Path, *, synchronous: str = "NORMAL", busy_timeout_ms: int = 5000
    ) -> None:
        self.sqlite = SqliteDriver(path, synchronous=synchronous, busy_timeout_ms=busy_timeout_ms)
        super().__init__(self.sqlite)

    async def open(self) -> None:
        await self.sqlite.open()
        try:
            await migrate(self.sqlite)
        except sqlite3.Error as err:
            await self.sqlite.close()
            raise _explain(self.sqlite.path, err) from err
