"""The world watch's reads, and the engine's other reads of the jobs in a few live states, stay
index reads when SQLite's statistics say one state holds every job (taken while 100,000 jobs are
queued, as `PRAGMA optimize` or ANALYZE may): each read is run, its SQL captured, and its plan
checked for a scan of the jobs table (store/world_sql.py; bench/scenarios.py Q100K measured
them)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio

from corral.domain.settings import RoleSpec, Settings
from corral.runtime.worldwatch import Scope, snapshot
from corral.store.sqlite import SqliteStore
from tests.contract.test_store_contract import AGING, NOW, make_job

SETTINGS = Settings(roles={"r": RoleSpec(name="r")}, environments={}, default_role="r")


def _plans(db: Path) -> list[tuple[str, str]]:
    captured: list[str] = []

    async def body() -> None:
        store = SqliteStore(db)
        await store.open()
        try:
            for _ in range(300):
                await store.submit(make_job(), now=NOW, aging_s=AGING)
            conn = store.driver._conn
            assert conn is not None
            # every job QUEUED: one state "matches every row"; then as if there were 100,000
            conn.execute("ANALYZE")
            conn.execute("UPDATE sqlite_stat1 SET stat = replace(stat, '300', '100000')")
            conn.execute("ANALYZE sqlite_schema")  # the statistics read again
            conn.set_trace_callback(captured.append)
            await snapshot(store, SETTINGS, Scope(finished=20))
            await store.world_inflight()
            # and the engine's other reads of the jobs in a few live states: the dispatcher's
            # look at what runs, the tenant run cap's count, the dashboard's lanes
            await store.inflight()
            await store.active_runs("default")
            await store.lane_counts()
            conn.set_trace_callback(None)
        finally:
            await store.close()

    anyio.run(body)
    db_conn = sqlite3.connect(db)
    try:
        return [
            (sql, detail)
            for sql in captured
            if sql.lstrip().upper().startswith("SELECT") and " jobs" in sql
            for *_, detail in db_conn.execute("EXPLAIN QUERY PLAN " + sql).fetchall()
        ]
    finally:
        db_conn.close()


def test_the_world_reads_go_down_an_index_whatever_the_statistics(tmp_path: Path) -> None:
    plans = _plans(tmp_path / "corral.db")
    assert plans, "no world read was captured"
    # a whole-table scan (a partial index's own scan, the waiting jobs' count, is what it counts)
    scans = [(sql, d) for sql, d in plans if d in ("SCAN jobs", "SCAN j")]
    assert scans == []
