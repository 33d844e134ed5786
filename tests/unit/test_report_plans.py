"""The reporter's look for terminal jobs without a run report reads only the jobs still waiting
(the jobs_unreported partial index, migration 0031), never the whole history: it joined every
terminal job to its report, 34 ms a look at 100,000 jobs (store/governance_sql.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

from corral.store.sqlite import SqliteStore
from tests.contract.test_governance_contract import ended, report_for


@pytest.mark.parametrize("statistics", [False, True])
def test_the_unreported_jobs_are_read_down_their_own_index(
    tmp_path: Path, statistics: bool
) -> None:
    """With SQLite's statistics (ANALYZE) and without them: without, SQLite chose the (state,
    id) index, every terminal job again."""
    db = tmp_path / "corral.db"
    captured: list[str] = []

    async def body() -> None:
        store = SqliteStore(db)
        await store.open()
        try:
            jobs = [await ended(store) for _ in range(40)]
            assert await store.record_reports([(report_for(j), []) for j in jobs[:-1]])
            conn = store.driver._conn
            assert conn is not None
            if statistics:
                conn.execute("ANALYZE")
            conn.set_trace_callback(captured.append)
            assert await store.unreported() == [jobs[-1].id]
            conn.set_trace_callback(None)
            await store.record_report(report_for(jobs[-1]))
            assert await store.unreported() == []
        finally:
            await store.close()

    anyio.run(body)
    [sql] = [s for s in captured if s.lstrip().upper().startswith("SELECT")]
    conn = sqlite3.connect(db)
    try:
        plan = [row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + sql)]
    finally:
        conn.close()
    assert "SCAN j USING INDEX jobs_unreported" in plan, plan
    assert not [p for p in plan if p.startswith("SCAN") and "jobs_unreported" not in p], plan


def test_a_report_written_without_the_flag_is_flagged_where_it_is_met(tmp_path: Path) -> None:
    """A version before migration 0031 may still report during a rolling upgrade: its reports
    do not set `reported`. Such a job is never drafted again, and the look that meets it flags
    it (a sweep of every unreported job in each batch would cost the whole backlog each time)."""
    db = tmp_path / "corral.db"

    async def body() -> None:
        store = SqliteStore(db)
        await store.open()
        try:
            old, new = await ended(store), await ended(store)
            await store.record_report(report_for(old))
            conn = store.driver._conn
            assert conn is not None
            conn.execute("UPDATE jobs SET reported = 0 WHERE id = ?", (old.id,))
            assert await store.unreported() == [new.id]
            await store.record_reports([(report_for(new), [])])
            flags = dict(conn.execute("SELECT id, reported FROM jobs").fetchall())
            assert flags == {old.id: 1, new.id: 1}
        finally:
            await store.close()

    anyio.run(body)
