"""A tenant's jobs straight from the store (JobQuery.tenant and .before, core/ports.py), on the
memory, SQLite and PostgreSQL stores: only that tenant's, newest first, a page at a time from a
cursor, with the other filters — so the HTTP API's list reads one page, not a scan. The same for
a tenant's incidents and unified runs: the store filters, and the limit counts the tenant's."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from corral.core.ports import JobQuery, Store
from corral.domain.states import JobState
from corral.services import tenancy
from corral.store.migrate import migrations
from corral.store.rows import JOB_TEXT
from corral.store.sqlite import SqliteStore
from tests.contract.test_governance_contract import evaluation, incident
from tests.contract.test_store_contract import NOW, UseStore, submit


def test_the_store_lists_one_tenants_jobs_page_by_page(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        acme = [(await submit(store, tenant="acme", role=r)).id for r in ("a", "b", "a", "b")]
        for _ in range(3):
            await submit(store, tenant="globex")
        newest_first = acme[::-1]

        mine = await store.list_jobs(JobQuery(tenant="acme"))
        assert [j.id for j in mine] == newest_first
        older = await store.list_jobs(JobQuery(tenant="acme", before=newest_first[1]))
        assert [j.id for j in older] == newest_first[2:]
        role_a = await store.list_jobs(JobQuery(tenant="acme", role="a", limit=1))
        assert [j.id for j in role_a] == [acme[2]]
        assert await store.list_jobs(JobQuery(tenant="nobody")) == []
        # `ref`: the jobs a whole id, a prefix or a suffix (4+ characters) names
        by_suffix = await store.list_jobs(JobQuery(tenant="acme", ref=acme[1][-6:]))
        assert [j.id for j in by_suffix] == [acme[1]]
        assert [j.id for j in await store.list_jobs(JobQuery(ref=acme[2]))] == [acme[2]]
        shared = await store.list_jobs(JobQuery(tenant="acme", ref=acme[0][:4]))
        assert {j.id for j in shared} >= {acme[0]} and all(j.tenant == "acme" for j in shared)
        assert await store.list_jobs(JobQuery(tenant="globex", ref=acme[1][-6:])) == []
        assert await store.list_jobs(JobQuery(ref=acme[1][-3:])) == []  # too short: whole ids

        pages, cursor = [], None
        while True:  # the API's cursor pages: every job once, none of another tenant
            page = await tenancy.jobs_of(store, "acme", limit=3, cursor=cursor)
            pages.append([j.id for j in page.jobs])
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert pages == [newest_first[:3], newest_first[3:]]

        await store.request_cancel(acme[0], reason="no", kind="cancel", now=NOW)
        cancelled = await tenancy.jobs_of(store, "acme", state=JobState.CANCELLED)
        assert [j.id for j in cancelled.jobs] == [acme[0]] and cancelled.next_cursor is None

    use_store(body)


def test_the_store_reads_one_tenants_incidents_and_runs_never_anothers(
    use_store: UseStore,
) -> None:
    async def body(store: Store) -> None:
        acme = [await submit(store, tenant="acme") for _ in range(2)]
        globex = [await submit(store, tenant="globex") for _ in range(3)]
        # the other tenant's records are the newest: a limit applied before the filter would
        # leave acme with nothing
        await store.append_incidents([incident(j) for j in acme])
        others = await store.append_incidents([incident(j) for j in globex for _ in range(2)])
        mine = await store.incidents(tenant="acme", limit=2)
        assert sorted(i.job_id for i in mine) == sorted(j.id for j in acme)
        assert {i.job_id for i in await store.incidents(tenant="globex")} == {j.id for j in globex}
        assert await store.incidents(tenant="nobody") == []
        assert await store.incidents(acme[0].id, tenant="globex") == []
        await store.append_incidents([incident(globex[0], resolves=others[0].id)])
        open_acme = await store.incidents(tenant="acme", open_only=True)
        assert len(open_acme) == 2 and all(i.job_id in {j.id for j in acme} for i in open_acme)
        assert len(await store.incidents()) == 9  # no tenant: every one

        runs = await store.run_unified(2, tenant="acme")
        assert [r.job_id for r in runs] == sorted((j.id for j in acme), reverse=True)
        assert all(r.tenant == "acme" for r in runs)
        assert [r.job_id for r in await store.run_unified(1, tenant="acme")] == [runs[0].job_id]
        assert await store.run_unified(tenant="acme", state="SUCCEEDED") == []
        assert {r.tenant for r in await store.run_unified(10)} == {"acme", "globex"}
        assert await store.run_unified(tenant="nobody") == []

    use_store(body)


def test_a_tenants_text_search_on_sqlite_reads_the_index_not_the_rows(tmp_path: Path) -> None:
    """The search's expression is the one the index jobs_text holds (migration 0028): SQLite
    answers it from the index, newest first, without a sort and without opening a job's row."""

    async def migrated() -> None:
        store = SqliteStore(tmp_path / "corral.db")
        await store.open()
        await store.close()

    asyncio.run(migrated())
    migration = next(sql for v, _, sql in migrations("sqlite") if v == 28)
    assert JOB_TEXT in migration
    with sqlite3.connect(tmp_path / "corral.db") as conn:
        plan = " ".join(
            str(row[3])
            for row in conn.execute(
                f"EXPLAIN QUERY PLAN SELECT id, state FROM jobs WHERE tenant = ? AND {JOB_TEXT}"
                " LIKE ? ESCAPE '!' ORDER BY id DESC LIMIT 51",
                ("acme", "%x%"),
            )
        )
    assert "USING INDEX jobs_text (tenant=?)" in plan and "TEMP B-TREE" not in plan, plan


def test_the_store_reads_one_tenants_policy_log_the_limit_counting_theirs(
    use_store: UseStore,
) -> None:
    async def body(store: Store) -> None:
        mine = await submit(store, tenant="acme")
        theirs = await submit(store, tenant="globex")
        await store.append_policy_evaluations([evaluation(mine, at=NOW)])
        # another tenant's busy fleet after it: the newest rows are all theirs
        await store.append_policy_evaluations(
            [evaluation(theirs, "deny", "out_of_scope", at=NOW + 1 + i) for i in range(5)]
        )
        found = await store.recent_policy_evaluations(limit=2, tenant="acme")
        assert [(e.job_id, e.verdict) for e in found] == [(mine.id, "allow")]
        assert len(await store.recent_policy_evaluations(limit=2, tenant="globex")) == 2
        assert await store.recent_policy_evaluations(tenant="acme", verdict="deny") == []
        assert await store.recent_policy_evaluations(tenant="nobody") == []
        assert len(await store.recent_policy_evaluations(limit=100)) == 6  # no tenant: all

    use_store(body)
