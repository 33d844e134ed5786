"""PostgreSQL: several engines may share one database (SKIP LOCKED leases, CAS claims)."""

from __future__ import annotations

import functools
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from corral.domain.errors import StoreError
from corral.store.driver import Row
from corral.store.migrate import migrate
from corral.store.sql import SqlStore

_PLACEHOLDER = re.compile(r"\?")
POOL_WAIT_S = 10.0  # how long a transaction waits for a connection before it fails


@functools.lru_cache(maxsize=512)
def _pg(sql: str) -> str:
    """Our `?` placeholders as psycopg's `%s` (each statement text converted once)."""
    return _PLACEHOLDER.sub("%s", sql)


class _Tx:
    def __init__(self, cur: psycopg.AsyncCursor[dict[str, Any]]) -> None:
        self.cur = cur

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        await self.cur.execute(_pg(sql), params)
        return int(self.cur.rowcount)

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        await self.cur.execute(_pg(sql), params)
        return await self.cur.fetchone()

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        await self.cur.execute(_pg(sql), params)
        return list(await self.cur.fetchall())


def _redact(dsn: str) -> str:
    return re.sub(
        r"(password=)\S+|(://[^:/@]+:)[^@]+@",
        lambda m: (m.group(1) or m.group(2)) + "***" + ("@" if m.group(2) else ""),
        dsn,
    )


class PostgresDriver:
    dialect = "postgres"

    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 4) -> None:
        self.dsn = dsn
        # A connection the server terminated fails its transaction once (a StoreError the
        # engine retries: scheduler/outage.py); the pool drops it on return and connects anew.
        self._pool = AsyncConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            open=False,
            kwargs={"autocommit": True},
            timeout=POOL_WAIT_S,
        )

    async def open(self) -> None:
        # One direct connection first: it fails at once with the server's own reason, where the
        # pool would retry quietly until its timeout.
        try:
            probe = await psycopg.AsyncConnection.connect(self.dsn, connect_timeout=5)
            await probe.close()
        except psycopg.Error as err:
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise StoreError(f"cannot reach PostgreSQL at {_redact(self.dsn)}: {reason}") from err
        try:
            await self._pool.open(wait=True, timeout=10.0)
        except Exception as err:  # psycopg_pool.PoolTimeout and friends
            await self._pool.close()
            raise StoreError(f"cannot reach PostgreSQL at {_redact(self.dsn)}: {err}") from err

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[_Tx]:
        try:
            async with (
                self._pool.connection() as conn,
                conn.transaction(),
                conn.cursor(row_factory=dict_row) as cur,
            ):
                yield _Tx(cur)
        except (psycopg.OperationalError, psycopg.InterfaceError) as err:
            # The server went away or ended our connection (pg_terminate_backend, a restart),
            # or no connection could be had in POOL_WAIT_S: an outage, retried by the caller.
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise StoreError(f"PostgreSQL error: {reason}") from err

    def write(self) -> Any:
        return self._tx()

    def read(self) -> Any:
        return self._tx()


class PostgresStore(SqlStore):
    """The store on a PostgreSQL database."""

    def __init__(self, dsn: str) -> None:
        self.pg = PostgresDriver(dsn)
        super().__init__(self.pg)

    async def open(self) -> None:
        await self.pg.open()
        await migrate(self.pg)
