"""The keyed audit chain on the memory, SQLite and PostgreSQL stores: rows hashed with
HMAC-SHA256 under the audit key, checked against signed checkpoints of the heads; the job
timeline chained and append-only; missing append-only triggers reported.

Tampering is done the way someone who can write the database would: around the append-only
triggers, rewriting rows, hashes and the head as they please — only the key is out of reach."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest

from corral.core.ports import AuditKey, ChainHead, ChainMark, Store
from corral.domain.errors import Conflict, StoreError
from corral.store.chain import CHAINS, KEYED, link
from corral.store.memory import MemoryStore
from corral.store.postgres import PostgresStore
from corral.store.sqlite import SqliteStore
from corral.workers.sealing import KeyFile
from tests.contract.test_governance_contract import evaluation, fill_every_chain
from tests.contract.test_store_contract import NOW, UseStore, make_job, submit

ATTACKER_KEY = b"\x01" * 32


class NoKey:
    """A key source with no key: the store hashes with plain SHA-256 (rows from before 0012)."""

    def get(self, *, create: bool) -> bytes | None:
        return None


def key_of(store: Store) -> AuditKey:
    assert isinstance(store, SqliteStore | PostgresStore | MemoryStore)
    assert store.audit_key is not None
    return store.audit_key


def marks_of(heads: Mapping[str, ChainHead], at: float = NOW) -> list[ChainMark]:
    """Checkpoints of these heads (as the engine signs and writes them)."""
    return [
        ChainMark(chain=c, seq=h.seq, hash=h.hash, at=at, keyed_from=h.keyed_from)
        for c, h in heads.items()
    ]


# ---- changing the database behind the store's back ------------------------------------------


def _id_col(table: str) -> str:
    return (
        "id" if table in ("policy_evaluations", "job_events", "run_reports", "incidents") else "seq"
    )


async def chain_rows(store: Store, table: str) -> list[dict[str, Any]]:
    """The chain's rows in seq order, every column."""
    if isinstance(store, MemoryStore):
        return [dict(r) for r in sorted(store._chains[table], key=lambda r: r["seq"])]
    assert isinstance(store, SqliteStore | PostgresStore)
    async with store.driver.read() as tx:
        return [
            dict(r)
            for r in await tx.fetchall(f"SELECT * FROM {table} WHERE seq IS NOT NULL ORDER BY seq")
        ]


async def rewrite(store: Store, table: str, rows: list[dict[str, Any]], head: ChainHead) -> None:
    """Replace the chain's rows with `rows` (by id) and its head with `head`, around the
    triggers: rows missing from `rows` are deleted."""
    if isinstance(store, MemoryStore):
        store._chains[table][:] = [dict(r) for r in rows]
        store._heads[table] = head
        return
    assert isinstance(store, SqliteStore | PostgresStore)
    key = _id_col(table)
    cols = (*CHAINS[table], "hash")
    async with store.driver.write() as tx:
        if isinstance(store, SqliteStore):
            guards = await tx.fetchall(
                "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?",
                (table,),
            )
            for g in guards:
                await tx.execute(f"DROP TRIGGER {g['name']}")
        else:
            await tx.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        keep = [r[key] for r in rows]
        existing = await tx.fetchall(f"SELECT {key} FROM {table} WHERE seq IS NOT NULL")
        for r in existing:
            if r[key] not in keep:
                await tx.execute(f"DELETE FROM {table} WHERE {key} = ?", (r[key],))
        for r in rows:
            sets = ", ".join(f"{c} = ?" for c in cols if c != key)
            await tx.execute(
                f"UPDATE {table} SET {sets} WHERE {key} = ?",
                [*(r[c] for c in cols if c != key), r[key]],
            )
        await tx.execute(
            "UPDATE audit_heads SET seq = ?, hash = ?, keyed_from = ? WHERE chain = ?",
            (head.seq, head.hash, head.keyed_from, table),
        )
        if isinstance(store, SqliteStore):
            for g in guards:
                await tx.execute(g["sql"])
        else:
            await tx.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")


def relinked(
    table: str, rows: list[dict[str, Any]], start: int, key: bytes | None
) -> list[dict[str, Any]]:
    """The rows with every hash from position `start` on recomputed (with `key`, or plain)."""
    out = [dict(r) for r in rows[:start]]
    for r in rows[start:]:
        prev = out[-1]["hash"] if out else ""
        out.append({**r, **link(table, r, int(r["seq"]), prev, key)})
    return out


def whys(problems: tuple[tuple[str, str, str], ...]) -> list[str]:
    return [p[2] for p in problems]


# ---- the keyed chain ---------------------------------------------------------------------------


def test_every_chain_is_keyed_and_verifies_against_its_checkpoints(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        await fill_every_chain(store)
        heads = await store.audit_heads()
        assert set(heads) == set(CHAINS)
        assert all(h.hash.startswith(KEYED) and h.keyed_from == 1 for h in heads.values())
        report = await store.verify_audit(marks_of(heads))
        assert report.ok, report.problems

    use_store(body)


def test_removing_the_newest_records_with_the_head_rewound_is_found_by_the_checkpoint(
    use_store: UseStore,
) -> None:
    async def body(store: Store) -> None:
        job = await submit(store)
        await store.append_policy_evaluations([evaluation(job, at=NOW + n) for n in range(5)])
        marks = marks_of(await store.audit_heads(), at=NOW + 60)
        rows = await chain_rows(store, "policy_evaluations")
        await rewrite(
            store, "policy_evaluations", rows[:3], ChainHead(3, rows[2]["hash"], keyed_from=1)
        )
        assert (await store.verify_audit()).ok  # the database alone cannot tell
        report = await store.verify_audit(marks)
        [mark] = [m for m in marks if m.chain == "policy_evaluations"]
        assert report.problems == (
            (
                "policy_evaluations",
                "3",
                "chain policy_evaluations: 2 records after seq 3 missing"
                f" (checkpoint at {mark.when} says head seq 5)",
            ),
        )

    use_store(body)


def test_a_chain_recomputed_after_an_edit_is_found(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await submit(store)
        await store.append_policy_evaluations(
            [evaluation(job, "deny", "x", at=NOW + n) for n in range(4)]
        )
        marks = marks_of(await store.audit_heads())
        rows = await chain_rows(store, "policy_evaluations")
        rows[1]["verdict"] = "allow"
        for key, expect in (
            (ATTACKER_KEY, "record seq 2 changed: its HMAC does not match"),
            (None, "record seq 2 has a plain hash inside the keyed part"),
        ):
            forged = relinked("policy_evaluations", rows, 1, key)
            await rewrite(
                store, "policy_evaluations", forged, ChainHead(4, forged[-1]["hash"], keyed_from=1)
            )
            # Without a checkpoint, the key alone finds it: every recomputed record.
            found = whys((await store.verify_audit()).problems)
            assert len(found) == 3 and found[0].startswith(expect), found
            # With one, the rewritten head is named too.
            found = whys((await store.verify_audit(marks)).problems)
            assert any("record seq 4 differs from the checkpoint" in w for w in found), found

    use_store(body)


def test_rows_hashed_before_the_key_stay_verifiable_and_cannot_be_downgraded(
    use_store: UseStore,
) -> None:
    async def body(store: Store) -> None:
        key = key_of(store)
        job = make_job()
        store.use_audit_key(NoKey())  # as before migration 0012
        await store.append_policy_evaluations([evaluation(job, at=NOW + n) for n in range(2)])
        store.use_audit_key(key)
        await store.append_policy_evaluations([evaluation(job, at=NOW + n) for n in range(2)])
        heads = await store.audit_heads()
        head = heads["policy_evaluations"]
        assert (head.seq, head.keyed_from) == (4, 3)
        rows = await chain_rows(store, "policy_evaluations")
        assert [r["hash"].startswith(KEYED) for r in rows] == [False, False, True, True]
        marks = marks_of(heads)
        assert (await store.verify_audit(marks)).ok
        # Someone without the key recomputes the whole chain plain and clears keyed_from.
        rows[0]["message"] = "edited"
        forged = relinked("policy_evaluations", rows, 0, None)
        await rewrite(store, "policy_evaluations", forged, ChainHead(4, forged[-1]["hash"]))
        found = whys((await store.verify_audit(marks)).problems)
        assert any("record seq 3 has a plain hash inside the keyed part" in w for w in found)
        assert any("the checkpoints say it starts at seq 3" in w for w in found), found

    use_store(body)


def test_keyed_records_without_the_key_are_reported_not_passed(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        await fill_every_chain(store)
        key = key_of(store)
        store.use_audit_key(NoKey())
        report = await store.verify_audit()
        assert not report.ok
        assert all("cannot be checked: no audit key" in w for w in whys(report.problems))
        store.use_audit_key(key)

    use_store(body)


# ---- the job timeline ---------------------------------------------------------------------------


def test_the_job_timeline_is_chained_and_tampering_is_found(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await submit(store)
        await store.request_cancel(job.id, reason="test", kind="cancel", now=NOW)
        events = await store.events(job.id)
        assert [e.kind for _, e in events] == ["submitted", "cancel"]
        rows = await chain_rows(store, "job_events")
        assert [r["seq"] for r in rows] == [1, 2]
        assert (await store.verify_audit(marks_of(await store.audit_heads()))).ok
        rows[0]["message"] = "nothing happened"
        await rewrite(store, "job_events", rows, (await store.audit_heads())["job_events"])
        report = await store.verify_audit()
        assert report.problems == (
            (
                "job_events",
                str(rows[0]["id"]),
                "record seq 1 changed: its HMAC does not match (changed,"
                " or recomputed without the key)",
            ),
        )

    use_store(body)


def test_a_rolled_back_operation_leaves_the_timeline_chain_whole(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await submit(store)
        await store.request_cancel(job.id, reason="test", kind="cancel", now=NOW)
        with pytest.raises(Conflict):  # already ended: nothing of it may stay
            await store.request_cancel(job.id, reason="again", kind="cancel", now=NOW)
        await submit(store)
        assert (await store.verify_audit()).ok

    use_store(body)


@pytest.mark.parametrize(
    "store_kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_the_database_refuses_to_change_the_job_timeline(
    store_kind: str, new_store: Callable[[], Store]
) -> None:
    async def main() -> None:
        store = new_store()
        await store.open()
        try:
            await submit(store)
        finally:
            await store.close()
        for sql in (
            "UPDATE job_events SET message = 'x'",
            "DELETE FROM job_events",
            *(["TRUNCATE job_events"] if isinstance(store, PostgresStore) else []),
        ):
            if isinstance(store, SqliteStore):
                conn = sqlite3.connect(store.sqlite.path, isolation_level=None)
                with pytest.raises(sqlite3.IntegrityError, match="job_events is append-only"):
                    conn.execute(sql)
                conn.close()
            else:
                assert isinstance(store, PostgresStore)
                with (
                    psycopg.connect(store.pg.dsn, autocommit=True) as conn,
                    pytest.raises(psycopg.errors.RaiseException, match="job_events is append-only"),
                ):
                    conn.execute(sql)  # type: ignore[arg-type]

    asyncio.run(main())


# ---- the append-only triggers ----------------------------------------------------------------


@pytest.mark.parametrize(
    "store_kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_a_missing_or_disabled_trigger_is_reported(
    store_kind: str, new_store: Callable[[], Store]
) -> None:
    async def main() -> None:
        store = new_store()
        await store.open()
        try:
            assert await store.missing_triggers() == []
            if isinstance(store, SqliteStore):
                gone = "job_events_no_delete"
                conn = sqlite3.connect(store.sqlite.path, isolation_level=None)
                conn.execute(f"DROP TRIGGER {gone}")
                conn.close()
            else:
                assert isinstance(store, PostgresStore)
                gone = "run_reports_append_only"
                with psycopg.connect(store.pg.dsn, autocommit=True) as conn:
                    conn.execute(f"ALTER TABLE run_reports DISABLE TRIGGER {gone}")
            assert await store.missing_triggers() == [gone]
            report = await store.verify_audit()
            assert report.problems == (
                ("triggers", gone, "append-only trigger missing or disabled"),
            )
            assert await store.restore_triggers() == [gone]
            assert await store.missing_triggers() == []
            assert await store.restore_triggers() == []
            assert (await store.verify_audit()).ok
        finally:
            await store.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    "store_kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_a_lost_key_is_not_silently_replaced(
    store_kind: str, new_store: Callable[[], Store], tmp_path: Path
) -> None:
    async def main() -> None:
        store = new_store()
        await store.open()
        try:
            job = await submit(store)
            lost = KeyFile(tmp_path / "elsewhere" / "audit.key")
            store.use_audit_key(lost)
            with pytest.raises(
                StoreError,
                match=r"the audit key .*elsewhere/audit.key is"
                r" missing, but this store's records were"
                r" hashed with one",
            ):
                await store.append_policy_evaluations([evaluation(job)])
            assert not lost.path.exists()
        finally:
            await store.close()

    asyncio.run(main())
