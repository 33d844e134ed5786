"""The PostgreSQL test server (127.0.0.1:5432, trust auth, database `test`): required, never
skipped. Each test gets fresh schemas, dropped afterwards."""

from __future__ import annotations

import os
import uuid
from urllib.parse import quote

import psycopg
import pytest

PG_DSN = os.environ.get("CORRAL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


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
