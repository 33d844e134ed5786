"""Governance records over SQL: every table here is append-only in the
database (triggers, migration 0006) and hash-chained (store/chain.py).

Every write takes its chain's tip first (`ChainWriter.take`), which serialises writers of that
table across engines; what the transaction reads afterwards (an incident's resolution, an
approval's latest state, the budget sums) cannot change before it commits.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

from corral.core.ports import AuditReport, BudgetStatus
from corral.domain.agents import PolicyEvaluation
from corral.domain.errors import Conflict, InvalidRequest, NotFound, StoreError
from corral.domain.governance import (
    Approval,
    ApprovalState,
    BudgetCeiling,
    DarkLaunch,
    Incident,
    KillSwitch,
    Pause,
    RunReport,
    ScopeKind,
    UnifiedRun,
)
from corral.store import govrows as g
from corral.store.admission import TERMINAL_SQL
from corral.store.chain import CHAINS, AuditKey, Head, Mark
from corral.store.chain_sql import ChainWriter, append_only_triggers, read_heads, verify_table
from corral.store.driver import Driver, Row, Tx, indexed_by
from corral.store.migrate import current_schema, statements


def _cols(table: str) -> str:
    return ", ".join((*CHAINS[table], "hash"))


_INCIDENT = f"SELECT {_cols('incidents')} FROM incidents"
_SWITCHES = (
    f"SELECT {', '.join('a.' + c for c in CHAINS['switch_events'])}, l.at AS lifted_at"
    " FROM switch_events a LEFT JOIN switch_events l ON l.kind = a.kind"
    " AND l.switch_id = a.switch_id AND l.action = 'lift'"
    " WHERE a.kind = ? AND a.action = 'activate'"
)
_LATEST_APPROVAL = (
    f"SELECT {_cols('approval_events')} FROM approval_events e WHERE e.seq ="
    " (SELECT MAX(x.seq) FROM approval_events x"
    " WHERE x.approval_id = e.approval_id)"
)
_CEILING = f"SELECT {_cols('budget_ceilings')} FROM budget_ceilings"
_OPEN_RESERVATIONS = (
    f"SELECT {', '.join('b.' + c for c in CHAINS['budget_ledger'])} FROM budget_ledger b"
    " LEFT JOIN budget_ledger c ON c.settles = b.seq"
    " WHERE b.kind = 'reserve' AND c.seq IS NULL AND b.job_id = ?"
)


def _lifted(r: Row) -> Row | None:
    return {"at": r["lifted_at"]} if r["lifted_at"] is not None else None


class SqlGovernance:
    """The governance half of the store port (mixed into SqlStore)."""

    driver: Driver
    audit_key: AuditKey | None
    _audit_key_bytes: bytes | None

    def use_audit_key(self, key: AuditKey) -> None:
        self.audit_key, self._audit_key_bytes = key, None

    async def _chain_key(self, tx: Tx) -> bytes | None:
        """The audit chain's key, created on first use — unless records were keyed already:
        a new key would make every one of them fail verification, so its loss is an error
        (None: the store has no key source, plain SHA-256 as before migration 0012)."""
        if self._audit_key_bytes is None and self.audit_key is not None:
            key = self.audit_key.get(create=False)
            if key is None:
                keyed = await tx.fetchone(
                    "SELECT chain FROM audit_heads WHERE keyed_from IS NOT NULL LIMIT 1"
                )
                if keyed is not None:
                    raise StoreError(
                        f"the audit key {self.audit_key} is missing, but this"
                        " store's records were hashed with one: restore it from"
                        " your backup (docs/explanation/audit.md)"
                    )
                key = self.audit_key.get(create=True)
            self._audit_key_bytes = key
        return self._audit_key_bytes

    # ---- policy evaluations (written by the governor and the pre-run engine) ---------------

    async def append_policy_evaluations(self, evaluations: Sequence[PolicyEvaluation]) -> None:
        if not evaluations:
            return
        async with self.driver.write() as tx:
            await self._append_evaluations(tx, evaluations)

    async def _append_evaluations(self, tx: Tx, evaluations: Sequence[PolicyEvaluation]) -> None:
        """Chain `evaluations` in the caller's transaction (a submission's, with its job)."""
        if not evaluations:
            return
        chain = await ChainWriter.take(tx, "policy_evaluations", await self._chain_key(tx))
        for e in evaluations:
            await chain.append(g.evaluation_row(e))
        await chain.flush()

    async def policy_evaluations(
        self, job_id: str, *, attempt: int | None = None, limit: int = 1000
    ) -> list[PolicyEvaluation]:
        where = "job_id = ?"
        params: list[Any] = [job_id]
        if attempt is not None:
            where += " AND attempt = ?"
            params.append(attempt)
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                "SELECT id, at, job_id, attempt, stage, subject, verdict, reason, message, inputs"
                f" FROM policy_evaluations WHERE {where} ORDER BY id DESC LIMIT ?",
                (*params, limit),
            )
        return [g.evaluation_from_row(r) for r in reversed(rows)]

    async def recent_policy_evaluations(
        self,
        *,
        limit: int = 100,
        stage: str | None = None,
        verdict: str | None = None,
        since: float | None = None,
        tenant: str | None = None,
    ) -> list[PolicyEvaluation]:
        if limit <= 0:  # SQLite reads a negative LIMIT as none at all
            return []
        clauses: list[str] = []
        params: list[Any] = []
        for clause, value in (
            ("stage = ?", stage),
            ("verdict = ?", verdict),
            ("at >= ?", since),
            # the limit counts the tenant's: another tenant's busy fleet cannot crowd them out
            ("EXISTS (SELECT 1 FROM jobs j WHERE j.id = job_id AND j.tenant = ?)", tenant),
        ):
            if value is not None:
                clauses.append(clause)
                params.append(value)
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                "SELECT id, at, job_id, attempt, stage, subject, verdict, reason, message, inputs"
                f" FROM policy_evaluations{where} ORDER BY id DESC LIMIT ?",
                (*params, limit),
            )
        return [g.evaluation_from_row(r) for r in reversed(rows)]

    # ---- run reports and incidents ---------------------------------------------------------

    async def record_report(
        self, report: RunReport, incidents: Sequence[Incident] = ()
    ) -> RunReport:
        async with self.driver.write() as tx:
            chain = await ChainWriter.take(tx, "run_reports", await self._chain_key(tx))
            job = await tx.fetchone("SELECT state FROM jobs WHERE id = ?", (report.job_id,))
            g.check_reportable(report.job_id, job["state"] if job else None)
            found = await tx.fetchone(
                "SELECT id, job_id FROM run_reports WHERE job_id = ? OR id = ?",
                (report.job_id, report.id),
            )
            if found is not None:
                raise Conflict(
                    f"job {found['job_id']} already has run report {found['id']};"
                    " a run report is written once and never replaced"
                )
            row = await chain.append(g.report_row(report))
            await chain.flush()
            await tx.execute("UPDATE jobs SET reported = 1 WHERE id = ?", (report.job_id,))
            if incidents:
                await self._append_incidents(tx, incidents)
        return g.report_from_row(row)

    async def record_reports(
        self, items: Sequence[tuple[RunReport, Sequence[Incident]]]
    ) -> list[RunReport | None]:
        if not items:
            return []
        out: list[RunReport | None] = []
        async with self.driver.write() as tx:  # one transaction, one chain head update each
            reports = await ChainWriter.take(tx, "run_reports", await self._chain_key(tx))
            ids = [r.job_id for r, _ in items]
            marks = ", ".join("?" * len(ids))
            states = {
                row["id"]: row["state"]
                for row in await tx.fetchall(
                    f"SELECT id, state FROM jobs WHERE id IN ({marks})", ids
                )
            }
            taken = {
                v
                for row in await tx.fetchall(
                    f"SELECT id, job_id FROM run_reports WHERE job_id IN ({marks})"
                    f" OR id IN ({marks})",
                    (*ids, *(r.id for r, _ in items)),
                )
                for v in (row["id"], row["job_id"])
            }
            opened: list[Incident] = []
            for report, incidents in items:
                try:
                    g.check_reportable(report.job_id, states.get(report.job_id))
                except (Conflict, NotFound):
                    out.append(None)
                    continue
                if report.job_id in taken or report.id in taken:
                    out.append(None)  # written already (another engine): never replaced
                    continue
                taken.update((report.job_id, report.id))
                out.append(g.report_from_row(await reports.append(g.report_row(report))))
                opened.extend(incidents)
            await reports.flush()
            # written now, or before (by another engine): no longer waiting (`unreported`)
            done = [i for i in ids if i in taken and i in states]
            if done:
                marks = ", ".join("?" * len(done))
                await tx.execute(f"UPDATE jobs SET reported = 1 WHERE id IN ({marks})", done)
            if opened:
                await self._append_incidents(tx, opened)
        return out

    async def report(self, job_id: str) -> RunReport | None:
        async with self.driver.read() as tx:
            row = await tx.fetchone(
                f"SELECT {_cols('run_reports')} FROM run_reports WHERE job_id = ?", (job_id,)
            )
        return g.report_from_row(row) if row else None

    async def append_incidents(self, incidents: Sequence[Incident]) -> list[Incident]:
        if not incidents:
            return []
        async with self.driver.write() as tx:
            return await self._append_incidents(tx, incidents)

    async def _append_incidents(self, tx: Tx, incidents: Sequence[Incident]) -> list[Incident]:
        chain = await ChainWriter.take(tx, "incidents", await self._chain_key(tx))
        out = []
        for incident in incidents:
            await self._check_incident(tx, incident)
            out.append(g.incident_from_row(await chain.append(g.incident_row(incident))))
        await chain.flush()
        return out

    async def _check_incident(self, tx: Tx, i: Incident) -> None:
        if await tx.fetchone("SELECT 1 AS x FROM incidents WHERE id = ?", (i.id,)):
            raise Conflict(f"incident {i.id} exists already; incidents are append-only")
        if i.resolves is None:
            return
        target = await tx.fetchone("SELECT resolves FROM incidents WHERE id = ?", (i.resolves,))
        if target is None:
            raise NotFound(f"incident {i.resolves} (to resolve) does not exist")
        if target["resolves"] is not None:
            raise Conflict(f"{i.resolves} is a resolution, not an incident to resolve")
        done = await tx.fetchone("SELECT id FROM incidents WHERE resolves = ?", (i.resolves,))
        if done is not None:
            raise Conflict(f"incident {i.resolves} is resolved already (by {done['id']})")

    async def incidents(
        self,
        job_id: str | None = None,
        *,
        open_only: bool = False,
        limit: int = 1000,
        tenant: str | None = None,
    ) -> list[Incident]:
        clauses, params = [], []
        if job_id is not None:
            clauses.append("i.job_id = ?")
            params.append(job_id)
        if tenant is not None:  # a job archived by retention has no tenant left: not shown
            clauses.append("EXISTS (SELECT 1 FROM jobs j WHERE j.id = i.job_id AND j.tenant = ?)")
            params.append(tenant)
        if open_only:
            clauses.append(
                "i.resolves IS NULL AND NOT EXISTS"
                " (SELECT 1 FROM incidents x WHERE x.resolves = i.id)"
            )
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                f"{_INCIDENT} i{where} ORDER BY i.seq DESC LIMIT ?", (*params, limit)
            )
        return [g.incident_from_row(r) for r in reversed(rows)]

    async def open_incidents(self, job_id: str | None = None) -> list[Incident]:
        return await self.incidents(job_id, open_only=True, limit=1_000_000)

    # ---- kill switches and pauses ----------------------------------------------------------

    async def _activate(self, row: dict[str, Any]) -> dict[str, Any]:
        async with self.driver.write() as tx:
            chain = await ChainWriter.take(tx, "switch_events", await self._chain_key(tx))
            if await tx.fetchone(
                "SELECT 1 AS x FROM switch_events WHERE kind = ? AND switch_id = ?",
                (row["kind"], row["switch_id"]),
            ):
                raise Conflict(f"{row['kind']} {row['switch_id']} exists already")
            linked = await chain.append(row)
            await chain.flush()
        return linked

    async def _lift(self, kind: str, switch_id: str, at: float, by: str) -> tuple[Row, Row]:
        async with self.driver.write() as tx:
            chain = await ChainWriter.take(tx, "switch_events", await self._chain_key(tx))
            rows = await tx.fetchall(_SWITCHES + " AND a.switch_id = ?", (kind, switch_id))
            if not rows:
                raise NotFound(f"no {kind} {switch_id}")
            if rows[0]["lifted_at"] is not None:
                raise Conflict(f"{kind} {switch_id} was lifted already")
            lifted = await chain.append(g.lift_row(rows[0], at=at, by=by))
            await chain.flush()
        return rows[0], lifted

    async def _switches(self, kind: str) -> list[Row]:
        async with self.driver.read() as tx:
            return await tx.fetchall(_SWITCHES + " ORDER BY a.seq", (kind,))

    async def activate_kill_switch(self, switch: KillSwitch) -> KillSwitch:
        return g.kill_switch_from_rows(await self._activate(g.switch_row(g.KILL, switch)), None)

    async def lift_kill_switch(self, switch_id: str, *, at: float, by: str) -> KillSwitch:
        return g.kill_switch_from_rows(*await self._lift(g.KILL, switch_id, at, by))

    async def kill_switches(self, *, active_at: float | None = None) -> list[KillSwitch]:
        found = [g.kill_switch_from_rows(r, _lifted(r)) for r in await self._switches(g.KILL)]
        return [s for s in found if active_at is None or s.active(active_at)]

    async def activate_pause(self, pause: Pause) -> Pause:
        return g.pause_from_rows(await self._activate(g.switch_row(g.PAUSE, pause)), None)

    async def lift_pause(self, pause_id: str, *, at: float, by: str) -> Pause:
        return g.pause_from_rows(*await self._lift(g.PAUSE, pause_id, at, by))

    async def pauses(self, *, active_only: bool = True) -> list[Pause]:
        found = [g.pause_from_rows(r, _lifted(r)) for r in await self._switches(g.PAUSE)]
        return [p for p in found if not active_only or p.active()]

    # ---- budgets ---------------------------------------------------------------------------

    async def set_budget(
        self, ceiling: BudgetCeiling, *, at: float | None = None, by: str = ""
    ) -> None:
        if ceiling.ceiling_usd < 0:
            raise InvalidRequest(f"a budget ceiling cannot be negative: {ceiling.ceiling_usd}")
        async with self.driver.write() as tx:
            chain = await ChainWriter.take(tx, "budget_ceilings", await self._chain_key(tx))
            await chain.append(g.ceiling_row(ceiling, time.time() if at is None else at, by))
            await chain.flush()

    async def budgets(self) -> list[BudgetCeiling]:
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                _CEILING + " c WHERE c.seq = (SELECT MAX(x.seq) FROM budget_ceilings x"
                " WHERE x.scope = c.scope AND x.target = c.target) ORDER BY c.scope, c.target"
            )
        return [g.ceiling_from_row(r) for r in rows]

    async def _status(
        self, tx: Tx, scope: ScopeKind, target: str, period_start: float
    ) -> BudgetStatus:
        row = await tx.fetchone(
            _CEILING + " WHERE scope = ? AND target = ? ORDER BY seq DESC LIMIT 1",
            (scope.value, target),
        )
        sums = await tx.fetchone(
            "SELECT COALESCE(SUM(CASE WHEN b.kind = 'commit' THEN b.amount ELSE 0 END), 0)"
            " AS spent, COALESCE(SUM(CASE WHEN b.kind = 'reserve' AND c.seq IS NULL"
            " THEN b.amount ELSE 0 END), 0) AS reserved FROM budget_ledger b"
            " LEFT JOIN budget_ledger c ON c.settles = b.seq"
            " WHERE b.scope = ? AND b.target = ? AND b.charged_at >= ?",
            (scope.value, target, period_start),
        )
        assert sums is not None
        return BudgetStatus(
            scope=scope,
            target=target,
            period_start=float(period_start),
            ceiling=g.ceiling_from_row(row) if row else None,
            spent=float(sums["spent"]),
            reserved=float(sums["reserved"]),
        )

    async def reserve_budget(
        self,
        scope: ScopeKind,
        target: str,
        period_start: float,
        amount: float,
        job_id: str,
        *,
        at: float | None = None,
    ) -> bool:
        if amount < 0:
            raise InvalidRequest(f"cannot reserve a negative amount: {amount}")
        scope = ScopeKind(scope)
        async with self.driver.write() as tx:
            # the budget lock, too
            chain = await ChainWriter.take(tx, "budget_ledger", await self._chain_key(tx))
            held = await tx.fetchone(
                _OPEN_RESERVATIONS + " AND b.scope = ? AND b.target = ?",
                (job_id, scope.value, target),
            )
            if held is not None:
                return True
            status = await self._status(tx, scope, target, period_start)
            remaining = status.remaining
            if not g.admits(remaining, amount):
                return False
            when = time.time() if at is None else at
            await chain.append(
                {
                    "kind": g.RESERVE,
                    "job_id": job_id,
                    "scope": scope.value,
                    "target": target,
                    "amount": amount,
                    "charged_at": when,
                    "at": when,
                    "settles": None,
                }
            )
            await chain.flush()
        return True

    async def commit_budget(self, job_id: str, actual: float, *, at: float | None = None) -> int:
        when = time.time() if at is None else at
        async with self.driver.write() as tx:
            chain = await ChainWriter.take(tx, "budget_ledger", await self._chain_key(tx))
            held = await tx.fetchall(_OPEN_RESERVATIONS + " ORDER BY b.seq", (job_id,))
            for r in held:
                await chain.append(
                    {
                        "kind": g.COMMIT,
                        "job_id": job_id,
                        "scope": r["scope"],
                        "target": r["target"],
                        "amount": actual,
                        "charged_at": r["charged_at"],
                        "at": when,
                        "settles": r["seq"],
                    }
                )
            await chain.flush()
        return len(held)

    async def budget_status(
        self, scope: ScopeKind, target: str, period_start: float
    ) -> BudgetStatus:
        async with self.driver.read() as tx:
            return await self._status(tx, ScopeKind(scope), target, period_start)

    # ---- dark launches ---------------------------------------------------------------------

    async def set_dark_launch(
        self, launch: DarkLaunch, *, at: float | None = None, by: str = ""
    ) -> None:
        if not 0 <= launch.percentage <= 100:
            raise InvalidRequest(f"a dark launch percentage is 0…100, not {launch.percentage}")
        async with self.driver.write() as tx:
            chain = await ChainWriter.take(tx, "dark_launches", await self._chain_key(tx))
            await chain.append(g.launch_row(launch, time.time() if at is None else at, by))
            await chain.flush()

    async def dark_launch(self, workflow: str) -> DarkLaunch | None:
        async with self.driver.read() as tx:
            row = await tx.fetchone(
                f"SELECT {_cols('dark_launches')} FROM dark_launches"
                " WHERE workflow = ? ORDER BY seq DESC LIMIT 1",
                (workflow,),
            )
        return g.launch_from_row(row) if row else None

    async def dark_launches(self) -> list[DarkLaunch]:
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                f"SELECT {_cols('dark_launches')} FROM dark_launches d WHERE d.seq ="
                " (SELECT MAX(x.seq) FROM dark_launches x WHERE x.workflow = d.workflow)"
                " ORDER BY d.workflow"
            )
        return [g.launch_from_row(r) for r in rows]

    # ---- approvals -------------------------------------------------------------------------

    async def request_approval(self, approval: Approval) -> Approval:
        async with self.driver.write() as tx:
            chain = await ChainWriter.take(tx, "approval_events", await self._chain_key(tx))
            if await tx.fetchone(
                "SELECT 1 AS x FROM approval_events WHERE approval_id = ?", (approval.id,)
            ):
                raise Conflict(f"approval {approval.id} exists already")
            row = await chain.append(
                g.approval_row(
                    approval,
                    ApprovalState.PENDING,
                    at=approval.requested_at,
                    by=None,
                    note=approval.note,
                )
            )
            await chain.flush()
        return g.approval_from_row(row)

    async def decide_approval(
        self, approval_id: str, state: ApprovalState, *, at: float, by: str, note: str = ""
    ) -> Approval:
        state = ApprovalState(state)
        if state not in (ApprovalState.APPROVED, ApprovalState.DENIED):
            raise InvalidRequest(f"an approval is decided approved or denied, not {state}")
        async with self.driver.write() as tx:
            chain = await ChainWriter.take(tx, "approval_events", await self._chain_key(tx))
            current = await tx.fetchone(_LATEST_APPROVAL + " AND e.approval_id = ?", (approval_id,))
            if current is None:
                raise NotFound(f"no approval {approval_id}")
            g.check_decidable(g.approval_from_row(current), at)
            row = await chain.append(g.next_approval_row(current, state, at=at, by=by, note=note))
            await chain.flush()
        return g.approval_from_row(row)

    async def approval(self, approval_id: str) -> Approval:
        async with self.driver.read() as tx:
            row = await tx.fetchone(_LATEST_APPROVAL + " AND e.approval_id = ?", (approval_id,))
        if row is None:
            raise NotFound(f"no approval {approval_id}")
        return g.approval_from_row(row)

    async def approvals(
        self, *, job_id: str | None = None, state: ApprovalState | None = None
    ) -> list[Approval]:
        sql, params = _LATEST_APPROVAL, []
        if job_id is not None:
            sql += " AND e.job_id = ?"
            params.append(job_id)
        if state is not None:
            sql += " AND e.state = ?"
            params.append(ApprovalState(state).value)
        async with self.driver.read() as tx:
            rows = await tx.fetchall(sql + " ORDER BY e.requested_at, e.approval_id", params)
        return [g.approval_from_row(r) for r in rows]

    async def expire_approvals(self, now: float) -> list[Approval]:
        due_sql = _LATEST_APPROVAL + " AND e.state = 'pending' AND e.expires_at <= ? ORDER BY e.seq"
        # looked at first without the write lock: the reporter asks every second and after
        # every batch of ends, and nearly always nothing is due
        async with self.driver.read() as tx:
            if not await tx.fetchall(due_sql, (now,)):
                return []
        async with self.driver.write() as tx:
            chain = await ChainWriter.take(tx, "approval_events", await self._chain_key(tx))
            due = await tx.fetchall(due_sql, (now,))
            out = [g.approval_from_row(await chain.append(g.expiry_row(r, now))) for r in due]
            await chain.flush()
        return out

    # ---- the read model and the audit ------------------------------------------------------

    async def run_unified(
        self,
        limit: int = 100,
        *,
        state: str | None = None,
        tenant: str | None = None,
        before: str | None = None,
    ) -> list[UnifiedRun]:
        clauses, params = [], []
        for column, value in (("state", state), ("tenant", tenant)):
            if value:  # tenant: the index jobs_by_tenant reads that tenant's newest jobs only
                clauses.append(f"{column} = ?")
                params.append(value)
        if before:
            clauses.append("job_id < ?")
            params.append(before)
        where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                f"SELECT {', '.join(g.UNIFIED_COLUMNS)} FROM v_run_unified"
                f" {where}ORDER BY job_id DESC LIMIT ?",
                (*params, limit),
            )
        return [g.unified_from_row(r) for r in rows]

    async def unreported(self, limit: int = 100) -> list[str]:
        async with self.driver.read() as tx:
            # down the jobs_unreported partial index: only the jobs still waiting, never the
            # whole history (SQLite without statistics took the (state, id) index: every
            # terminal job)
            rows = await tx.fetchall(
                "SELECT j.id AS id, EXISTS (SELECT 1 FROM run_reports r WHERE r.job_id = j.id)"
                f" AS has FROM jobs j{indexed_by(self.driver, 'jobs_unreported')}"
                f" WHERE j.reported = 0 AND j.state IN {TERMINAL_SQL}"
                " ORDER BY j.updated_at, j.id LIMIT ?",
                (limit,),
            )
        # A report without the flag: a version before it reported the job during a rolling
        # upgrade. No job to report; flagged where it is met, so it leaves the index.
        stale = [str(r["id"]) for r in rows if r["has"]]
        if stale:
            async with self.driver.write() as tx:
                marks = ", ".join("?" * len(stale))
                await tx.execute(f"UPDATE jobs SET reported = 1 WHERE id IN ({marks})", stale)
        return [str(r["id"]) for r in rows if not r["has"]]

    async def verify_audit(self, marks: Sequence[Mark] = ()) -> AuditReport:
        checked, prechain, problems = 0, 0, []
        key = self._audit_key_bytes or (
            self.audit_key.get(create=False) if self.audit_key else None
        )
        async with self.driver.read() as tx:
            for table in CHAINS:
                check = await verify_table(
                    tx, table, key=key, marks=[m for m in marks if m.chain == table]
                )
                checked += check.checked
                prechain += check.prechain
                problems += check.problems
            problems += [
                ("triggers", name, "append-only trigger missing or disabled")
                for name in await self._missing_triggers(tx)
            ]
        return AuditReport(
            ok=not problems,
            checked=checked,
            prechain=prechain,
            first_bad=problems[0] if problems else None,
            problems=tuple(problems),
        )

    async def audit_heads(self) -> dict[str, Head]:
        async with self.driver.read() as tx:
            return await read_heads(tx)

    async def missing_triggers(self) -> list[str]:
        async with self.driver.read() as tx:
            return await self._missing_triggers(tx)

    async def restore_triggers(self) -> list[str]:
        missing = await self.missing_triggers()
        if not missing:
            return []
        ddl = {
            m.group(1): stmt
            for stmt in statements(current_schema(self.driver.dialect))
            if (m := re.match(r"CREATE TRIGGER (\w+) ", stmt))
        }
        async with self.driver.write() as tx:
            for name in missing:
                table = re.search(r" ON (\w+) ", ddl[name])
                assert table is not None
                if self.driver.dialect == "postgres":  # disabled, or gone
                    await tx.execute(f"DROP TRIGGER IF EXISTS {name} ON {table.group(1)}")
                await tx.execute(ddl[name])
        return missing

    async def _missing_triggers(self, tx: Tx) -> list[str]:
        if self.driver.dialect == "sqlite":
            rows = await tx.fetchall("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        else:
            rows = await tx.fetchall(
                "SELECT t.tgname AS name FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                " WHERE c.relnamespace = current_schema()::regnamespace AND NOT t.tgisinternal"
                " AND t.tgenabled <> 'D'"
            )
        present = {str(r["name"]) for r in rows}
        return [n for n in append_only_triggers(self.driver.dialect) if n not in present]
