"""The governance contract, on the memory, SQLite and PostgreSQL stores: run
reports, incidents, kill switches, pauses, budgets, dark launches, approvals, the unified read
model; append-only in the database itself and hash-chained (store/chain.py)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from corral.core.ports import Store
from corral.domain.agents import PolicyEvaluation
from corral.domain.errors import Conflict, InvalidRequest, NotFound
from corral.domain.governance import (
    Approval,
    ApprovalState,
    BudgetCeiling,
    DarkLaunch,
    Incident,
    IncidentType,
    KillSwitch,
    Pause,
    Period,
    ReportOutcome,
    RunReport,
    ScopeKind,
    Severity,
)
from corral.domain.ids import new_id
from corral.domain.models import Job
from corral.domain.states import JobState
from corral.domain.tokens import ApiToken, hash_secret
from corral.store.chain import CHAINS
from corral.store.memory import MemoryStore
from corral.store.postgres import PostgresStore
from corral.store.sqlite import SqliteStore
from tests.contract.test_store_contract import NOW, UseStore, opened, submit

CHAINED = tuple(CHAINS)


def report_for(job: Job, **overrides: Any) -> RunReport:
    fields: dict[str, Any] = {
        "id": new_id(),
        "job_id": job.id,
        "role": job.role,
        "tenant": job.tenant,
        "workflow": "wf-1",
        "outcome": ReportOutcome.SUCCESS,
        "attempts": 1,
        "steps": 3,
        "tool_calls": 2,
        "tokens_in": 100,
        "tokens_out": 20,
        "cost_usd": 0.25,
        "started_at": NOW + 1,
        "ended_at": NOW + 2,
        "duration_ms": 1000,
        "summary": "done",
        "created_at": NOW + 3,
        "metrics": {"tool_statuses": {"ok": 2}},
    }
    fields.update(overrides)
    return RunReport(**fields)


def incident(job: Job, **overrides: Any) -> Incident:
    fields: dict[str, Any] = {
        "id": new_id(),
        "report_id": None,
        "job_id": job.id,
        "type": IncidentType.TOOL_ERROR,
        "severity": Severity.MEDIUM,
        "message": "tool failed",
        "created_at": NOW,
        "context": {"tool": "Bash"},
    }
    fields.update(overrides)
    return Incident(**fields)


def evaluation(
    job: Job, verdict: str = "allow", reason: str = "allowed", at: float = NOW
) -> PolicyEvaluation:
    return PolicyEvaluation(
        at=at,
        job_id=job.id,
        attempt=None,
        stage="pre_run",
        subject="run",
        verdict=verdict,  # type: ignore[arg-type]
        reason=reason,
        inputs={"n": 1},
    )


def approval(job: Job, **overrides: Any) -> Approval:
    fields: dict[str, Any] = {
        "id": new_id(),
        "job_id": job.id,
        "subject": "rm -rf build",
        "digest": "d" * 64,
        "reason": "approval_required",
        "requested_at": NOW,
        "expires_at": NOW + 600,
    }
    fields.update(overrides)
    return Approval(**fields)


async def ended(store: Store, state: JobState = JobState.CANCELLED) -> Job:
    """A job in a terminal state (a queued job cancelled at once), ready for its report."""
    job = await submit(store)
    kind = {JobState.CANCELLED: "cancel", JobState.KILLED: "kill"}[state]
    return await store.request_cancel(job.id, reason="test", kind=kind, now=NOW)


async def fill_every_chain(store: Store) -> Job:
    """At least one row in every chained table."""
    job = await ended(store)
    await store.append_policy_evaluations([evaluation(job), evaluation(job, "deny", "x")])
    await store.record_report(report_for(job))
    first = (await store.append_incidents([incident(job)]))[0]
    await store.append_incidents([incident(job, resolves=first.id, message="fixed")])
    await store.activate_kill_switch(
        KillSwitch(
            id="k1",
            scope=ScopeKind.GLOBAL,
            target=None,
            reason="r",
            created_at=NOW,
            created_by="op",
        )
    )
    await store.lift_kill_switch("k1", at=NOW + 1, by="op")
    await store.set_budget(
        BudgetCeiling(scope=ScopeKind.TENANT, target="t", period=Period.DAILY, ceiling_usd=5.0),
        at=NOW,
    )
    assert await store.reserve_budget(ScopeKind.TENANT, "t", NOW, 1.0, job.id, at=NOW)
    await store.commit_budget(job.id, 0.5, at=NOW + 1)
    await store.set_dark_launch(DarkLaunch(workflow="wf", percentage=10), at=NOW)
    await store.request_approval(approval(job, id="a1"))
    await store.decide_approval("a1", ApprovalState.APPROVED, at=NOW + 1, by="op")
    token = ApiToken(
        id="t1",
        name="ci",
        tenant="t",
        scopes=("jobs:read",),
        secret_hash=hash_secret("s"),
        created_at=NOW,
        created_by="op",
    )
    await store.create_token(token)
    await store.revoke_token("t1", at=NOW + 1, by="op")
    return job


# ---- run reports and incidents -----------------------------------------------------------


def test_one_run_report_per_job_written_once(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        queued = await submit(store)
        with pytest.raises(Conflict, match="when it has ended"):
            await store.record_report(report_for(queued))
        with pytest.raises(NotFound):
            await store.record_report(report_for(queued, job_id="nope"))
        job = await ended(store)
        assert await store.report(job.id) is None
        report = report_for(job)
        recorded = await store.record_report(report)
        assert recorded.hash.startswith("k1:") and len(recorded.hash) == 3 + 64
        assert recorded == replace(report, hash=recorded.hash)
        assert await store.report(job.id) == recorded
        with pytest.raises(Conflict, match="already has run report"):
            await store.record_report(report_for(job, outcome=ReportOutcome.FAILED))
        with pytest.raises(Conflict):  # the same report id for another job
            await store.record_report(replace(report, job_id=(await ended(store)).id))
        assert await store.report(job.id) == recorded

    use_store(body)


def test_unreported_lists_terminal_jobs_without_a_report(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        await submit(store)  # queued: not terminal
        first, second = await ended(store), await ended(store, JobState.KILLED)
        assert await store.unreported() == [first.id, second.id]
        await store.record_report(report_for(first))
        assert await store.unreported() == [second.id]
        assert await store.unreported(limit=0) == []

    use_store(body)


def test_incidents_are_appended_and_resolved_by_a_new_record(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job, other = await submit(store), await submit(store)
        a, b = incident(job), incident(job, severity=Severity.HIGH, type=IncidentType.TIMEOUT)
        c = incident(other)
        got = await store.append_incidents([a, b, c])
        assert [i.id for i in got] == [a.id, b.id, c.id] and all(
            i.hash.startswith("k1:") for i in got
        )
        assert await store.incidents(job.id) == got[:2]
        fix = incident(job, resolves=a.id, message="retried by hand", type=IncidentType.ANOMALY)
        [resolution] = await store.append_incidents([fix])
        assert resolution.resolves == a.id
        assert [i.id for i in await store.open_incidents(job.id)] == [b.id]
        assert [i.id for i in await store.open_incidents()] == [b.id, c.id]
        assert [i.id for i in await store.incidents(job.id)] == [a.id, b.id, fix.id]
        assert [i.id for i in await store.incidents(open_only=True)] == [b.id, c.id]
        assert [i.id for i in await store.incidents(limit=1)] == [fix.id]
        with pytest.raises(Conflict, match="resolved already"):
            await store.append_incidents([incident(job, resolves=a.id)])
        with pytest.raises(Conflict, match="is a resolution"):
            await store.append_incidents([incident(job, resolves=fix.id)])
        with pytest.raises(NotFound):
            await store.append_incidents([incident(job, resolves="nope")])
        with pytest.raises(Conflict, match="exists already"):
            await store.append_incidents([a])
        # a batch is all or nothing: the valid first item is not kept
        with pytest.raises(Conflict):
            await store.append_incidents([incident(job), incident(job, resolves=a.id)])
        assert len(await store.incidents()) == 4
        # a batch may resolve its own incident
        d = incident(other)
        await store.append_incidents([d, incident(other, resolves=d.id)])
        assert [i.id for i in await store.open_incidents(other.id)] == [c.id]

    use_store(body)


# ---- kill switches and pauses ------------------------------------------------------------


def test_kill_switches_are_activated_and_lifted_by_new_rows(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        g = KillSwitch(
            id="k-global",
            scope=ScopeKind.GLOBAL,
            target=None,
            reason="incident",
            created_at=NOW,
            created_by="alice",
        )
        t = KillSwitch(
            id="k-tenant",
            scope=ScopeKind.TENANT,
            target="acme",
            reason="spend",
            created_at=NOW + 1,
            created_by="bob",
            expires_at=NOW + 100,
        )
        assert await store.activate_kill_switch(g) == g
        await store.activate_kill_switch(t)
        with pytest.raises(Conflict):
            await store.activate_kill_switch(g)
        assert await store.kill_switches(active_at=NOW + 50) == [g, t]
        assert await store.kill_switches(active_at=NOW + 100) == [g]  # t expired
        lifted = await store.lift_kill_switch("k-global", at=NOW + 60, by="alice")
        assert lifted == replace(g, lifted_at=NOW + 60)
        assert await store.kill_switches(active_at=NOW + 61) == [t]
        assert await store.kill_switches() == [lifted, t]
        with pytest.raises(Conflict, match="lifted already"):
            await store.lift_kill_switch("k-global", at=NOW + 70, by="alice")
        with pytest.raises(NotFound):
            await store.lift_kill_switch("nope", at=NOW, by="x")
        assert await store.pauses(active_only=False) == []  # a kill switch is not a pause

    use_store(body)


def test_pauses_are_activated_and_lifted_by_new_rows(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        p = Pause(
            id="p1",
            scope=ScopeKind.ROLE,
            target="notebook",
            reason="maintenance",
            created_at=NOW,
            created_by="ops",
        )
        assert await store.activate_pause(p) == p
        assert await store.pauses() == [p]
        resumed = await store.lift_pause("p1", at=NOW + 5, by="ops")
        assert resumed == replace(p, resumed_at=NOW + 5)
        assert await store.pauses() == []
        assert await store.pauses(active_only=False) == [resumed]
        with pytest.raises(Conflict):
            await store.lift_pause("p1", at=NOW + 6, by="ops")
        with pytest.raises(NotFound):
            await store.lift_kill_switch("p1", at=NOW, by="ops")  # a pause is not a kill switch
        assert await store.kill_switches() == []

    use_store(body)


# ---- budgets -------------------------------------------------------------------------------


def test_budget_ceilings_latest_wins_and_history_is_kept(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        first = BudgetCeiling(
            scope=ScopeKind.TENANT, target="acme", period=Period.DAILY, ceiling_usd=10.0
        )
        role = BudgetCeiling(
            scope=ScopeKind.ROLE, target="notebook", period=Period.MONTHLY, ceiling_usd=100.0
        )
        await store.set_budget(first, at=NOW, by="alice")
        await store.set_budget(role, at=NOW)
        await store.set_budget(replace(first, ceiling_usd=20.0), at=NOW + 1, by="bob")
        assert await store.budgets() == [role, replace(first, ceiling_usd=20.0)]
        status = await store.budget_status(ScopeKind.TENANT, "acme", NOW)
        assert status.ceiling == replace(first, ceiling_usd=20.0)
        assert (status.spent, status.reserved, status.remaining) == (0.0, 0.0, 20.0)
        with pytest.raises(InvalidRequest):
            await store.set_budget(replace(first, ceiling_usd=-1.0))

    use_store(body)


def test_reservations_never_overshoot_the_ceiling(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        tenant, day = ScopeKind.TENANT, NOW - 3600
        await store.set_budget(
            BudgetCeiling(scope=tenant, target="acme", period=Period.DAILY, ceiling_usd=1.0), at=day
        )
        assert await store.reserve_budget(tenant, "acme", day, 0.4, "j1", at=NOW)
        assert await store.reserve_budget(tenant, "acme", day, 0.4, "j1", at=NOW)  # held once
        assert await store.reserve_budget(tenant, "acme", day, 0.5, "j2", at=NOW)
        assert not await store.reserve_budget(tenant, "acme", day, 0.2, "j3", at=NOW)
        status = await store.budget_status(tenant, "acme", day)
        assert (status.spent, status.reserved) == (0.0, 0.9)
        assert await store.commit_budget("j1", 0.1, at=NOW + 1) == 1  # cheaper than held
        assert await store.commit_budget("j1", 0.3, at=NOW + 2) == 0  # nothing left to settle
        status = await store.budget_status(tenant, "acme", day)
        assert (status.spent, status.reserved) == (pytest.approx(0.1), pytest.approx(0.5))
        assert await store.reserve_budget(tenant, "acme", day, 0.4, "j3", at=NOW + 3)  # fits now
        assert not await store.reserve_budget(tenant, "acme", day, 0.01, "j4", at=NOW + 3)
        assert await store.commit_budget("j2", 0.0, at=NOW + 4) == 1  # a release
        # the next window starts empty; a scope without a ceiling always admits (and records)
        tomorrow = day + 86400
        assert await store.reserve_budget(tenant, "acme", tomorrow, 1.0, "j5", at=tomorrow)
        assert await store.reserve_budget(ScopeKind.ROLE, "free", day, 1e6, "j5", at=NOW)
        free = await store.budget_status(ScopeKind.ROLE, "free", day)
        assert (free.ceiling, free.reserved, free.remaining) == (None, 1e6, None)
        assert await store.commit_budget("j5", 2.0, at=tomorrow + 1) == 2  # both scopes
        assert (await store.budget_status(tenant, "acme", tomorrow)).spent == 2.0
        with pytest.raises(InvalidRequest):
            await store.reserve_budget(tenant, "acme", day, -1.0, "j6")

    use_store(body)


def test_float_sums_fit_an_exact_ceiling(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        await store.set_budget(
            BudgetCeiling(scope=ScopeKind.ROLE, target="r", period=Period.DAILY, ceiling_usd=0.3),
            at=NOW,
        )
        assert await store.reserve_budget(ScopeKind.ROLE, "r", NOW, 0.1, "a", at=NOW)
        assert await store.reserve_budget(ScopeKind.ROLE, "r", NOW, 0.2, "b", at=NOW)
        assert not await store.reserve_budget(ScopeKind.ROLE, "r", NOW, 0.001, "c", at=NOW)
        # an exhausted budget admits nothing, not even a zero estimate (policy/prerun.py)
        assert not await store.reserve_budget(ScopeKind.ROLE, "r", NOW, 0.0, "d", at=NOW)

    use_store(body)


# ---- dark launches and approvals -----------------------------------------------------------


def test_dark_launch_latest_per_workflow_wins(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        assert await store.dark_launch("wf") is None
        await store.set_dark_launch(DarkLaunch(workflow="wf", percentage=10), at=NOW)
        await store.set_dark_launch(DarkLaunch(workflow="other", percentage=50), at=NOW)
        await store.set_dark_launch(
            DarkLaunch(workflow="wf", percentage=60, enabled=False), at=NOW + 1
        )
        assert await store.dark_launch("wf") == DarkLaunch(
            workflow="wf", percentage=60, enabled=False
        )
        assert [d.workflow for d in await store.dark_launches()] == ["other", "wf"]
        with pytest.raises(InvalidRequest):
            await store.set_dark_launch(DarkLaunch(workflow="wf", percentage=101))

    use_store(body)


def test_approvals_are_decided_once_by_a_new_event(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await submit(store)
        a = approval(job, id="a1", note="why")
        assert await store.request_approval(a) == a
        with pytest.raises(Conflict):
            await store.request_approval(a)
        assert await store.approvals(state=ApprovalState.PENDING) == [a]
        decided = await store.decide_approval(
            "a1", ApprovalState.APPROVED, at=NOW + 5, by="alice", note="ok"
        )
        assert decided == replace(
            a, state=ApprovalState.APPROVED, decided_at=NOW + 5, decided_by="alice", note="ok"
        )
        assert await store.approval("a1") == decided
        with pytest.raises(Conflict, match="approved already"):
            await store.decide_approval("a1", ApprovalState.DENIED, at=NOW + 6, by="bob")
        with pytest.raises(InvalidRequest):
            await store.decide_approval("a1", ApprovalState.EXPIRED, at=NOW + 6, by="bob")
        with pytest.raises(NotFound):
            await store.decide_approval("nope", ApprovalState.DENIED, at=NOW, by="bob")
        with pytest.raises(NotFound):
            await store.approval("nope")
        assert await store.approvals(job_id=job.id) == [decided]
        assert await store.approvals(job_id="other") == []

    use_store(body)


def test_pending_approvals_expire_into_a_denial(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await submit(store)
        soon = await store.request_approval(approval(job, id="soon", expires_at=NOW + 10))
        await store.request_approval(approval(job, id="late", expires_at=NOW + 100))
        await store.request_approval(approval(job, id="done", expires_at=NOW + 10))
        await store.decide_approval("done", ApprovalState.DENIED, at=NOW + 1, by="bob")
        with pytest.raises(Conflict, match="expired"):
            await store.decide_approval("soon", ApprovalState.APPROVED, at=NOW + 10, by="x")
        expired = await store.expire_approvals(NOW + 10)
        assert expired == [
            replace(
                soon,
                state=ApprovalState.EXPIRED,
                decided_at=NOW + 10,
                decided_by="corral",
                note="expired undecided",
            )
        ]
        assert await store.expire_approvals(NOW + 10) == []
        assert [a.id for a in await store.approvals(state=ApprovalState.PENDING)] == ["late"]
        states = {a.id: a.state for a in await store.approvals()}
        assert states == {
            "soon": ApprovalState.EXPIRED,
            "late": ApprovalState.PENDING,
            "done": ApprovalState.DENIED,
        }

    use_store(body)


# ---- the unified read model ----------------------------------------------------------------


def test_run_unified_joins_reports_incidents_and_the_latest_verdict(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        bare, governed = await submit(store), await ended(store, JobState.KILLED)
        await store.append_policy_evaluations(
            [
                evaluation(governed, at=NOW),
                evaluation(governed, "deny", "max_tool_calls", at=NOW + 1),
            ]
        )
        await store.record_report(report_for(governed, cost_usd=1.5))
        a, b = incident(governed), incident(governed)
        await store.append_incidents([a, b, incident(governed, resolves=a.id)])
        rows = await store.run_unified()
        assert [r.job_id for r in rows] == [governed.id, bare.id]
        g, z = rows
        assert (g.outcome, g.workflow, g.cost_usd, g.tokens_in, g.duration_ms) == (
            "success",
            "wf-1",
            1.5,
            100,
            1000,
        )
        assert (g.incidents_total, g.incidents_open) == (2, 1)
        assert (g.policy_verdict, g.policy_reason, g.policy_stage) == (
            "deny",
            "max_tool_calls",
            "pre_run",
        )
        assert (g.state, g.role, g.tenant) == ("KILLED", governed.role, governed.tenant)
        assert (z.report_id, z.outcome, z.incidents_total, z.incidents_open, z.policy_verdict) == (
            None,
            None,
            0,
            0,
            None,
        )
        assert len(await store.run_unified(limit=1)) == 1
        assert await store.run_unified(state="RUNNING") == []
        assert [r.job_id for r in await store.run_unified(state=JobState.QUEUED.value)] == [bare.id]
        other = await submit(store, tenant="other-tenant")
        assert [r.job_id for r in await store.run_unified(tenant="other-tenant")] == [other.id]
        mine = await store.run_unified(tenant=governed.tenant)
        assert other.id not in {r.job_id for r in mine} and governed.id in {r.job_id for r in mine}
        assert await store.run_unified(tenant="other-tenant", state="KILLED") == []

    use_store(body)


# ---- the audit chain -----------------------------------------------------------------------


def test_every_chain_verifies(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        empty = await store.verify_audit()
        assert (empty.ok, empty.checked, empty.first_bad) == (True, 0, None)
        await fill_every_chain(store)
        report = await store.verify_audit()
        assert report.ok, report.problems
        assert report.checked == 13 + 2 + 2  # the timeline (submitted, cancelled), two tokens

    use_store(body)


def _sqlite_raw(path: str, statements: list[str]) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for sql in statements:
            conn.execute(sql)
    finally:
        conn.close()


def _pg_raw(dsn: str, statements: list[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for sql in statements:
            conn.execute(sql)  # type: ignore[arg-type]


def _tamper(store: Store, table: str, key: str, value: Any, column: str, new: str) -> None:
    """Change one row behind the store's back, the way an attacker with file or superuser
    access would: around the append-only triggers."""
    update = f"UPDATE {table} SET {column} = '{new}' WHERE {key} = '{value}'"
    if isinstance(store, MemoryStore):
        [row] = [r for r in store._chains[table] if str(r[key]) == str(value)]
        row[column] = new
    elif isinstance(store, SqliteStore):
        conn = sqlite3.connect(store.sqlite.path)
        [(ddl,)] = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = ?", (f"{table}_no_update",)
        ).fetchall()
        conn.close()
        _sqlite_raw(store.sqlite.path, [f"DROP TRIGGER {table}_no_update", update, ddl])
    else:
        assert isinstance(store, PostgresStore)
        trigger = f"{table}_append_only"
        _pg_raw(
            store.pg.dsn,
            [
                f"ALTER TABLE {table} DISABLE TRIGGER {trigger}",
                update,
                f"ALTER TABLE {table} ENABLE TRIGGER {trigger}",
            ],
        )


def test_verify_finds_exactly_the_tampered_row(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await fill_every_chain(store)
        [first, second] = await store.incidents(job.id)
        _tamper(store, "incidents", "id", first.id, "message", "nothing to see")
        report = await store.verify_audit()
        assert not report.ok
        assert report.first_bad is not None
        assert report.first_bad[:2] == ("incidents", first.id)
        assert "changed" in report.first_bad[2]
        assert len(report.problems) == 1  # its successor still links to its recorded hash
        assert [i.id for i in await store.incidents(job.id)] == [first.id, second.id]

    use_store(body)


def test_verify_finds_a_tampered_policy_evaluation(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await fill_every_chain(store)
        evs = await store.policy_evaluations(job.id)
        _tamper(store, "policy_evaluations", "id", evs[1].id, "verdict", "allow")
        report = await store.verify_audit()
        assert report.problems == (("policy_evaluations", str(evs[1].id), report.problems[0][2]),)

    use_store(body)


@pytest.mark.parametrize(
    "store_kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_the_database_refuses_update_and_delete(
    store_kind: str, new_store: Callable[[], Store]
) -> None:
    async def main() -> None:
        store = new_store()
        await store.open()
        try:
            await fill_every_chain(store)
        finally:
            await store.close()
        for table in CHAINED:
            for sql in (f"UPDATE {table} SET prev_hash = 'x'", f"DELETE FROM {table}"):
                if isinstance(store, SqliteStore):
                    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                        _sqlite_raw(store.sqlite.path, [sql])
                else:
                    assert isinstance(store, PostgresStore)
                    with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                        _pg_raw(store.pg.dsn, [sql])
            if isinstance(store, PostgresStore):
                with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                    _pg_raw(store.pg.dsn, [f"TRUNCATE {table}"])
        again = new_store()
        await again.open()
        try:
            assert (await again.verify_audit()).ok
        finally:
            await again.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    "store_kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_verify_notices_rows_removed_around_the_triggers(
    store_kind: str, new_store: Callable[[], Store]
) -> None:
    async def main() -> None:
        store = new_store()
        await store.open()
        try:
            job = await submit(store)
            await store.append_policy_evaluations([evaluation(job, at=NOW + n) for n in range(4)])
            middle, last = (
                "DELETE FROM policy_evaluations WHERE seq = 2",
                ("DELETE FROM policy_evaluations WHERE seq = 4"),
            )
            if isinstance(store, SqliteStore):
                conn = sqlite3.connect(store.sqlite.path)
                [(ddl,)] = conn.execute(
                    "SELECT sql FROM sqlite_master WHERE name = 'policy_evaluations_no_delete'"
                ).fetchall()
                conn.close()
                _sqlite_raw(
                    store.sqlite.path,
                    ["DROP TRIGGER policy_evaluations_no_delete", middle, last, ddl],
                )
            else:
                assert isinstance(store, PostgresStore)
                _pg_raw(
                    store.pg.dsn,
                    [
                        "ALTER TABLE policy_evaluations "
                        "DISABLE TRIGGER policy_evaluations_append_only",
                        middle,
                        last,
                        "ALTER TABLE policy_evaluations "
                        "ENABLE TRIGGER policy_evaluations_append_only",
                    ],
                )
            report = await store.verify_audit()
            whys = [p[2] for p in report.problems]
            assert len(whys) == 2
            assert "rows 2…2 are missing" in whys[0]
            assert "chain head is seq 4 but the rows end at seq 3" in whys[1]
        finally:
            await store.close()

    asyncio.run(main())


# ---- several engines on one PostgreSQL database --------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize("store_kind", ["postgres"], indirect=True)
def test_two_engines_reserving_cannot_overshoot_a_ceiling(
    store_kind: str, new_store: Callable[[], Store]
) -> None:
    async def main() -> None:
        async with opened(new_store(), new_store()) as (one, two):
            await one.set_budget(
                BudgetCeiling(
                    scope=ScopeKind.TENANT, target="acme", period=Period.DAILY, ceiling_usd=10.0
                ),
                at=NOW,
            )
            results = await asyncio.gather(
                *(
                    store.reserve_budget(
                        ScopeKind.TENANT, "acme", NOW, 1.0, f"{name}-{n}", at=NOW + n
                    )
                    for n in range(15)
                    for name, store in (("one", one), ("two", two))
                )
            )
            assert sum(results) == 10
            status = await two.budget_status(ScopeKind.TENANT, "acme", NOW)
            assert (status.reserved, status.remaining) == (10.0, 0.0)
            assert (await one.verify_audit()).ok

    asyncio.run(main())


@pytest.mark.postgres
@pytest.mark.parametrize("store_kind", ["postgres"], indirect=True)
def test_two_engines_appending_keep_one_unbroken_chain(
    store_kind: str, new_store: Callable[[], Store]
) -> None:
    async def main() -> None:
        async with opened(new_store(), new_store()) as (one, two):
            job = await submit(one)
            await asyncio.gather(
                *(
                    store.append_policy_evaluations(
                        [evaluation(job, at=NOW + n), evaluation(job, at=NOW + n)]
                    )
                    for n in range(25)
                    for store in (one, two)
                )
            )
            await asyncio.gather(
                *(
                    store.append_incidents([incident(job)])
                    for _ in range(10)
                    for store in (one, two)
                )
            )
            report = await one.verify_audit()
            assert report.ok, report.problems
            assert report.checked == 120 + 1  # and the job's timeline: submitted

    asyncio.run(main())


# ---- policy evaluations across jobs (`corral policy log|stats`) ---------------------------


def test_recent_policy_evaluations_across_jobs_newest_last(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        assert await store.recent_policy_evaluations() == []
        one, two = await submit(store), await submit(store)
        await store.append_policy_evaluations(
            [evaluation(one, at=NOW), evaluation(two, "deny", "kill_switch_active", at=NOW + 1)]
        )
        await store.append_policy_evaluations(
            [
                replace(
                    evaluation(one, "deny", "out_of_scope", at=NOW + 2),
                    stage="tool_call",
                    subject="Bash",
                    attempt=1,
                ),
                evaluation(two, "pause", "runner_paused", at=NOW + 3),
            ]
        )
        found = await store.recent_policy_evaluations()
        assert [(e.job_id, e.verdict, e.at) for e in found] == [
            (one.id, "allow", NOW),
            (two.id, "deny", NOW + 1),
            (one.id, "deny", NOW + 2),
            (two.id, "pause", NOW + 3),
        ]
        assert all(e.id is not None for e in found)
        assert found[2].stage == "tool_call" and found[2].inputs == {"n": 1}
        assert [e.at for e in await store.recent_policy_evaluations(limit=2)] == [NOW + 2, NOW + 3]
        assert await store.recent_policy_evaluations(limit=0) == []
        assert await store.recent_policy_evaluations(limit=-1) == []
        pre = await store.recent_policy_evaluations(stage="pre_run")
        assert [e.reason for e in pre] == ["allowed", "kill_switch_active", "runner_paused"]
        denied = await store.recent_policy_evaluations(verdict="deny")
        assert [e.reason for e in denied] == ["kill_switch_active", "out_of_scope"]
        both = await store.recent_policy_evaluations(stage="pre_run", verdict="deny")
        assert [(e.job_id, e.reason) for e in both] == [(two.id, "kill_switch_active")]
        late = await store.recent_policy_evaluations(since=NOW + 2)
        assert [e.at for e in late] == [NOW + 2, NOW + 3]
        assert await store.recent_policy_evaluations(stage="tool_call", since=NOW + 3) == []
        assert [
            e.at
            for e in await store.recent_policy_evaluations(verdict="deny", since=NOW + 1, limit=1)
        ] == [NOW + 2]

    use_store(body)
