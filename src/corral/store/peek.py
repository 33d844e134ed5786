"""Reads of a SQLite store's file with sqlite3 alone, for a short command: no event loop, no
store, no migration code. A read answers only from a database already at the latest migration
and in WAL mode, as the store leaves it; anything else (no file yet, an older or damaged
database, a lock) is None, and the caller opens the store, which migrates or says what is
wrong in its own words (store/sqlite.py)."""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

from corral.store.rows import job_from_row, job_list_sql

if TYPE_CHECKING:
    from corral.core.jobquery import JobQuery
    from corral.domain.models import Job

MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")  # store/migrations/NNNN_name.sql
_MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def latest_version() -> int | None:
    """The latest migration's version (store/migrate.py applies them), from the files' names;
    None when they cannot be listed (an installation not on a file system)."""
    try:
        names = os.listdir(_MIGRATIONS)
    except OSError:
        return None
    found = [int(m.group(1)) for n in names if (m := MIGRATION_NAME.match(n))]
    return max(found) if found else None


def list_jobs(path: Path, query: JobQuery, *, busy_timeout_ms: int) -> list[Job] | None:
    """`list_jobs` of the SQLite store at `path`, or None: open the store instead."""
    latest = latest_version()
    if latest is None or not path.is_file():
        return None
    try:  # mode=rw: never create the file (the store does, with its schema)
        conn = sqlite3.connect(f"{path.as_uri()}?mode=rw", uri=True, isolation_level=None)
    except sqlite3.Error:
        return None
    try:
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
        (version,) = conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
        if str(mode).lower() != "wal" or version != latest:
            return None
        sql, params = job_list_sql(query)
        rows = conn.execute(sql, params).fetchall()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return [job_from_row(r) for r in rows]
