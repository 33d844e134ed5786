"""Migrations are append-only: applying every one of them to an empty database must give exactly
the schema a fresh database gets from the current schema file."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from corral.core.ports import Admission
from corral.domain.agents import PolicyEvaluation
from corral.domain.errors import Backpressure
from corral.domain.states import JobState
from corral.store.chain import CHAINS, link
from corral.store.chain_sql import append_only_triggers
from corral.store.driver import Driver, Tx
from corral.store.migrate import migrate, migrations, statements
from corral.store.postgres import PostgresDriver, PostgresStore
from corral.store.rows import JOB_COLUMNS, job_params
from corral.store.sql import SqlStore
from corral.store.sqlite import SqliteDriver, SqliteStore
from corral.workers.sealing import KeyFile
from tests.contract.conftest import waiting_as_kept
from tests.contract.test_store_contract import AGING, NOW, make_job

if TYPE_CHECKING:
    from conftest import PgSchemas  # tests/contract/conftest.py

Catalog = list[tuple[Any, ...]]


def _sql(text: str | None) -> str | None:
    return None if text is None else re.sub(r"\s+", " ", text).strip()


async def _sqlite_catalog(driver: Driver) -> Catalog:
    async with driver.read() as tx:
        objects = await tx.fetchall(
            "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
        )
        out: Catalog = [
            ("object", r["type"], r["name"], r["tbl_name"], _sql(r["sql"])) for r in objects
        ]
        for table in [r["name"] for r in objects if r["type"] == "table"]:
            for c in await tx.fetchall(f'PRAGMA table_info("{table}")'):
                out.append(
                    (
                        "column",
                        table,
                        c["cid"],
                        c["name"],
                        c["type"],
                        c["notnull"],
                        c["dflt_value"],
                        c["pk"],
                    )
                )
    return out


async def _postgres_catalog(driver: Driver) -> Catalog:
    async with driver.read() as tx:
        schema_row = await tx.fetchone("SELECT current_schema() AS s")
        assert schema_row is not None
        schema = str(schema_row["s"])
        columns = await tx.fetchall(
            "SELECT table_name, column_name, ordinal_position, data_type, is_nullable,"
            " column_default FROM information_schema.columns WHERE table_schema = ?"
            " ORDER BY table_name, ordinal_position",
            (schema,),
        )
        indexes = await tx.fetchall(
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = ?"
            " ORDER BY tablename, indexname",
            (schema,),
        )
        constraints = await tx.fetchall(
            "SELECT table_name, constraint_name, constraint_type"
            " FROM information_schema.table_constraints WHERE constraint_schema = ?"
            " AND constraint_type <> 'CHECK' ORDER BY table_name, constraint_name",
            (schema,),
        )
        # what the append-only rule and the read model are made of (migration 0006, 0005)
        triggers = await tx.fetchall(
            "SELECT t.tgname, c.relname, pg_get_triggerdef(t.oid) AS def FROM pg_trigger t"
            " JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = ? AND NOT t.tgisinternal ORDER BY c.relname, t.tgname",
            (schema,),
        )
        functions = await tx.fetchall(
            "SELECT p.proname, pg_get_functiondef(p.oid) AS def FROM pg_proc p"
            " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ?"
            " ORDER BY p.proname",
            (schema,),
        )
        views = await tx.fetchall(
            "SELECT viewname, definition FROM pg_views WHERE schemaname = ? ORDER BY viewname",
            (schema,),
        )

    def strip(text: str | None) -> str | None:
        # the schemas differ by name only: drop it from sequence defaults and index definitions
        return None if text is None else text.replace(f'"{schema}".', "").replace(f"{schema}.", "")

    out: Catalog = [
        (
            "column",
            c["table_name"],
            c["column_name"],
            c["ordinal_position"],
            c["data_type"],
            c["is_nullable"],
            strip(c["column_default"]),
        )
        for c in columns
    ]
    out += [("index", i["tablename"], i["indexname"], strip(i["indexdef"])) for i in indexes]
    out += [
        ("constraint", c["table_name"], c["constraint_name"], c["constraint_type"])
        for c in constraints
    ]
    out += [("trigger", t["relname"], t["tgname"], strip(t["def"])) for t in triggers]
    out += [("function", f["proname"], strip(f["def"])) for f in functions]
    out += [("view", v["viewname"], strip(v["definition"])) for v in views]
    return out


async def _catalog(driver: Driver) -> Catalog:
    if driver.dialect == "sqlite":
        return await _sqlite_catalog(driver)
    return await _postgres_catalog(driver)


async def _build(driver: Driver, *, fresh_from_schema: bool) -> tuple[Catalog, int]:
    """Migrate an empty database one way; its catalog, after checking a re-run changes nothing."""
    await driver.open()
    try:
        version = await migrate(driver, fresh_from_schema=fresh_from_schema)
        catalog = await _catalog(driver)
        async with driver.read() as tx:
            applied = [
                int(r["version"])
                for r in await tx.fetchall("SELECT version FROM schema_migrations ORDER BY version")
            ]
        assert applied == [v for v, _, _ in migrations(driver.dialect)]
        assert await migrate(driver, fresh_from_schema=fresh_from_schema) == version
        assert await migrate(driver, fresh_from_schema=not fresh_from_schema) == version
        assert await _catalog(driver) == catalog, "a second migrate changed the schema"
        async with driver.read() as tx:
            row = await tx.fetchone("SELECT COUNT(*) AS n FROM schema_migrations")
        assert row is not None and int(row["n"]) == len(applied)
        return catalog, version
    finally:
        await driver.close()


OTHER_TRIGGERS = {
    "sqlite": {
        # migration 0032: the waiting jobs per environment, kept for the queue bounds
        "queue_depth_insert",
        "queue_depth_leave",
        "queue_depth_enter",
        "queue_depth_delete",
        "learnings_fts_insert",
        "learnings_text_fixed",
        "learning_events_no_update",
        "learning_events_no_delete",
    },
    "postgres": {"learning_events_append_only", "learning_events_no_truncate"},
}


def _assert_same(migrated: Catalog, fresh: Catalog, dialect: str) -> None:
    assert migrations(dialect), f"no migrations found for {dialect}"
    names = {entry[1] for entry in fresh} | {entry[2] for entry in fresh}
    assert {
        "jobs",
        "attempts",
        "job_events",
        "idem_keys",
        "job_deps",
        "engines",
        "workspace_locks",
        "workspace_waits",
        "schema_migrations",
        "v_run_unified",
        *CHAINS,
    } <= names
    triggers = {e[2] for e in fresh if e[0] == "trigger"} | {
        e[2] for e in fresh if e[:2] == ("object", "trigger")
    }
    # every chained table refuses UPDATE and DELETE; beside them, only the knowledge tables'
    # own (migration 0023: the learnings' history is append-only, SQLite's FTS5 index follows)
    # and, on SQLite, the queue depth's (migration 0032)
    assert triggers == set(append_only_triggers(dialect)) | OTHER_TRIGGERS[dialect]
    only_migrated = [e for e in migrated if e not in fresh]
    only_fresh = [e for e in fresh if e not in migrated]
    assert (only_migrated, only_fresh) == ([], []), (
        "migrations and the current schema file disagree"
    )
    assert migrated == fresh


def test_sqlite_migrations_equal_the_schema_file(tmp_path: Path) -> None:
    async def main() -> None:
        migrated, v1 = await _build(SqliteDriver(tmp_path / "migrated.db"), fresh_from_schema=False)
        fresh, v2 = await _build(SqliteDriver(tmp_path / "fresh.db"), fresh_from_schema=True)
        assert v1 == v2 == migrations("sqlite")[-1][0]
        _assert_same(migrated, fresh, "sqlite")

    asyncio.run(main())


@pytest.mark.postgres
def test_postgres_migrations_equal_the_schema_file(pg_schemas: PgSchemas) -> None:
    migrated_dsn, fresh_dsn = pg_schemas.new(), pg_schemas.new()

    async def main() -> None:
        migrated, v1 = await _build(PostgresDriver(migrated_dsn), fresh_from_schema=False)
        fresh, v2 = await _build(PostgresDriver(fresh_dsn), fresh_from_schema=True)
        assert v1 == v2 == migrations("postgres")[-1][0]
        _assert_same(migrated, fresh, "postgres")

    asyncio.run(main())


async def _migrated_below(tx: Tx, dialect: str, version: int) -> None:
    """Apply every migration before `version`, as a database that old holds them."""
    await tx.execute(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY,"
        " name TEXT NOT NULL, applied_at REAL NOT NULL)"
    )
    for v, name, sql in migrations(dialect):
        if v >= version:
            break
        for stmt in statements(sql):
            await tx.execute(stmt)
        await tx.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", (v, name, 0.0))


async def _upgrade_from_v1(driver: Driver) -> list[tuple[str, str]]:
    """A v1 database with a job running on a workspace, migrated to the latest version."""
    await driver.open()
    try:
        running = make_job(workspace="/repos/a").with_(state=JobState.RUNNING)
        queued = make_job(workspace="/repos/a")
        async with driver.write() as tx:
            await _migrated_below(tx, driver.dialect, 2)
            v1_columns = JOB_COLUMNS[:-3]  # the runtime budgets came with migration 0004
            for job in (running, queued):
                await tx.execute(
                    f"INSERT INTO jobs ({', '.join(v1_columns)})"
                    f" VALUES ({', '.join('?' * len(v1_columns))})",
                    job_params(job)[: len(v1_columns)],
                )
        await migrate(driver)
        async with driver.read() as tx:
            rows = await tx.fetchall("SELECT workspace, job_id FROM workspace_locks")
        assert [r["job_id"] for r in rows] == [running.id]
        return [(r["workspace"], r["job_id"]) for r in rows]
    finally:
        await driver.close()


def test_sqlite_upgrade_gives_running_jobs_their_workspace(tmp_path: Path) -> None:
    assert asyncio.run(_upgrade_from_v1(SqliteDriver(tmp_path / "old.db")))


@pytest.mark.postgres
def test_postgres_upgrade_gives_running_jobs_their_workspace(pg_schemas: PgSchemas) -> None:
    assert asyncio.run(_upgrade_from_v1(PostgresDriver(pg_schemas.new())))


async def _upgrade_from_v4(driver: Driver, reopen: Callable[[], SqlStore]) -> None:
    """Policy evaluations written before the audit chain join it when the database migrates."""
    await driver.open()
    try:
        async with driver.write() as tx:
            await _migrated_below(tx, driver.dialect, 5)
            for n in range(3):
                await tx.execute(
                    "INSERT INTO policy_evaluations (at, job_id, attempt, stage, subject,"
                    " verdict, reason, message, inputs) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (100 + n, "j1", 1, "tool_call", "Bash", "allow", "allowed", "", f'{{"n":{n}}}'),
                )
    finally:
        await driver.close()
    store = reopen()
    await store.open()  # migrates 0005 (+ sealing) and 0006
    try:
        before = await store.verify_audit()
        assert (before.ok, before.checked) == (True, 3), before.problems
        await store.append_policy_evaluations(
            [
                PolicyEvaluation(
                    at=200.0,
                    job_id="j1",
                    attempt=2,
                    stage="tool_call",
                    subject="Bash",
                    verdict="deny",
                    reason="out_of_scope",
                )
            ]
        )
        assert [e.inputs for e in await store.policy_evaluations("j1")] == [
            {"n": 0},
            {"n": 1},
            {"n": 2},
            {},
        ]
        after = await store.verify_audit()
        assert (after.ok, after.checked) == (True, 4), after.problems
    finally:
        await store.close()


def test_sqlite_upgrade_puts_old_policy_evaluations_on_the_chain(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    asyncio.run(_upgrade_from_v4(SqliteDriver(path), lambda: SqliteStore(path)))


@pytest.mark.postgres
def test_postgres_upgrade_puts_old_policy_evaluations_on_the_chain(pg_schemas: PgSchemas) -> None:
    dsn = pg_schemas.new()
    asyncio.run(_upgrade_from_v4(PostgresDriver(dsn), lambda: PostgresStore(dsn)))


async def _upgrade_to_keyed(driver: Driver, reopen: Callable[[], SqlStore], key: Path) -> None:
    """A database from before migration 0012: its plain chain stays verifiable, its job events
    stay outside the timeline's chain, and what is written after is keyed."""
    await driver.open()
    try:
        async with driver.write() as tx:
            await _migrated_below(tx, driver.dialect, 12)
            for n in range(2):
                await tx.execute(
                    "INSERT INTO job_events (job_id, at, kind, message, data)"
                    " VALUES (?, ?, ?, ?, ?)",
                    ("j1", 100.0 + n, "submitted", "", "{}"),
                )
            plain = link(
                "policy_evaluations",
                {
                    "at": 100.0,
                    "job_id": "j1",
                    "attempt": 1,
                    "stage": "tool_call",
                    "subject": "Bash",
                    "verdict": "allow",
                    "reason": "allowed",
                    "message": "",
                    "inputs": "{}",
                },
                1,
                "",
            )
            cols = CHAINS["policy_evaluations"] + ("hash",)
            await tx.execute(
                f"INSERT INTO policy_evaluations ({', '.join(cols)}) VALUES"
                f" ({', '.join('?' * len(cols))})",
                [plain[c] for c in cols],
            )
            await tx.execute(
                "INSERT INTO audit_heads (chain, seq, hash) VALUES (?, 1, ?)",
                ("policy_evaluations", plain["hash"]),
            )
    finally:
        await driver.close()
    store = reopen()
    store.use_audit_key(KeyFile(key))
    await store.open()  # migrates 0012
    try:
        before = await store.verify_audit()
        assert (before.ok, before.checked, before.prechain) == (True, 3, 2), before.problems
        await store.append_policy_evaluations(
            [
                PolicyEvaluation(
                    at=200.0,
                    job_id="j1",
                    attempt=2,
                    stage="tool_call",
                    subject="Bash",
                    verdict="deny",
                    reason="out_of_scope",
                )
            ]
        )
        await store.submit(make_job(), now=300.0, aging_s=60.0)
        heads = await store.audit_heads()
        assert (heads["policy_evaluations"].seq, heads["policy_evaluations"].keyed_from) == (2, 2)
        assert (heads["job_events"].seq, heads["job_events"].keyed_from) == (1, 1)
        after = await store.verify_audit()
        assert (after.ok, after.checked, after.prechain) == (True, 5, 2), after.problems
    finally:
        await store.close()


def test_sqlite_upgrade_keeps_the_plain_chain_and_keys_what_follows(tmp_path: Path) -> None:
    path = tmp_path / "v11.db"
    asyncio.run(
        _upgrade_to_keyed(SqliteDriver(path), lambda: SqliteStore(path), tmp_path / "audit.key")
    )


@pytest.mark.postgres
def test_postgres_upgrade_keeps_the_plain_chain_and_keys_what_follows(
    pg_schemas: PgSchemas, tmp_path: Path
) -> None:
    dsn = pg_schemas.new()
    asyncio.run(
        _upgrade_to_keyed(PostgresDriver(dsn), lambda: PostgresStore(dsn), tmp_path / "audit.key")
    )


def test_sqlite_upgrade_counts_the_jobs_already_waiting(tmp_path: Path) -> None:
    """Migration 0032 starts the kept queue depth from the jobs waiting when it runs; from
    then on the triggers keep it, and a submission past the bound is refused by it."""
    path = tmp_path / "v31.db"

    async def main() -> None:
        driver = SqliteDriver(path)
        await driver.open()
        try:
            async with driver.write() as tx:
                await _migrated_below(tx, "sqlite", 32)
                jobs = [
                    make_job(env_name="gpu"),
                    make_job(env_name="gpu").with_(state=JobState.RETRY_WAIT),
                    make_job(env_name="gpu").with_(state=JobState.RUNNING),
                    make_job(env_name="local"),
                    make_job(env_name="local").with_(state=JobState.SUCCEEDED),
                ]
                for job in jobs:
                    await tx.execute(
                        f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)})"
                        f" VALUES ({', '.join('?' * len(JOB_COLUMNS))})",
                        job_params(job),
                    )
        finally:
            await driver.close()
        store = SqliteStore(path)
        await store.open()  # migrates 0032
        try:
            await store.submit(make_job(env_name="local"), now=NOW, aging_s=AGING)
            # one job waited in local before the migration: with this one, local is at 2
            with pytest.raises(Backpressure, match="2 jobs queued in environment local"):
                await store.submit(
                    make_job(env_name="local"), now=NOW, aging_s=AGING,
                    admission=Admission(max_queued=100, env_max_queued=2),
                )  # fmt: skip
        finally:
            await store.close()

    asyncio.run(main())
    kept, counted = waiting_as_kept(path)
    assert kept == counted == {"gpu": 2, "local": 2}
