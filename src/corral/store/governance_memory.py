"""Governance records in memory, with the semantics of store/governance_sql.py: the same rows,
the same hash chains (store/chain.py), only appended. No operation awaits between its first read
and its last write, so each is atomic on its event loop; a batch is checked whole before any row
of it is written."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from corral.core.ports import AuditReport, BudgetStatus
from corral.domain.agents import PolicyEvaluation
from corral.domain.errors import Conflict, InvalidRequest, NotFound
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
from corral.domain.models import Job
from corral.store import govrows as g
from corral.store.chain import CHAINS, ROW_ID, AuditKey, Head, Mark, Problem, link, verify_rows

Row = dict[str, Any]


class MemoryGovernance:
    """The governance half of the store port (mixed into MemoryStore)."""

    _jobs: dict[str, Job]

    def _init_governance(self) -> None:
        self._chains: dict[str, list[Row]] = {t: [] for t in CHAINS}
        self._heads: dict[str, Head] = {}
        self.audit_key: AuditKey | None = None
        self._audit_key_bytes: bytes | None = None

    def use_audit_key(self, key: AuditKey) -> None:
        self.audit_key, self._audit_key_bytes = key, None

    def _chain_key(self, *, create: bool = True) -> bytes | None:
        if self._audit_key_bytes is None and self.audit_key is not None:
            self._audit_key_bytes = self.audit_key.get(create=create)
        return self._audit_key_bytes

    def _append(self, table: str, row: Mapping[str, Any]) -> Row:
        head = self._heads.get(table, Head(0, ""))
        key = self._chain_key()
        linked = link(table, row, head.seq + 1, head.hash, key)
        if table in ROW_ID and "id" not in linked:
            linked["id"] = linked["seq"]  # the SQL stores' autoincrement id
        self._chains[table].append(linked)
        keyed_from = head.keyed_from or (linked["seq"] if key is not None else None)
        self._heads[table] = Head(linked["seq"], linked["hash"], keyed_from)
        return dict(linked)

    def _unappend(self, table: str, head: Head | None) -> None:
        """Undo the chain's last append (a rolled-back operation)."""
        self._chains[table].pop()
        if head is None:
            self._heads.pop(table, None)
        else:
            self._heads[table] = head

    def _rows(self, table: str) -> Iterator[Row]:
        return iter(self._chains[table])

    # ---- policy evaluations ----------------------------------------------------------------

    async def append_policy_evaluations(self, evaluations: Sequence[PolicyEvaluation]) -> None:
        for e in evaluations:
            self._append("policy_evaluations", g.evaluation_row(e))

    async def policy_evaluations(
        self, job_id: str, *, attempt: int | None = None, limit: int = 1000
    ) -> list[PolicyEvaluation]:
        found = [
            r
            for r in self._rows("policy_evaluations")
            if r["job_id"] == job_id and attempt in (None, r["attempt"])
        ]
        return [g.evaluation_from_row(r) for r in found[-limit:]] if limit > 0 else []

    async def recent_policy_evaluations(
        self,
        *,
        limit: int = 100,
        stage: str | None = None,
        verdict: str | None = None,
        since: float | None = None,
        tenant: str | None = None,
    ) -> list[PolicyEvaluation]:
        found = [
            r
            for r in self._rows("policy_evaluations")
            if stage in (None, r["stage"])
            and verdict in (None, r["verdict"])
            and (since is None or r["at"] >= since)
            and (tenant is None or self._tenant_of(r["job_id"]) == tenant)
        ]
        return [g.evaluation_from_row(r) for r in found[-limit:]] if limit > 0 else []

    # ---- run reports and incidents ---------------------------------------------------------

    async def record_report(
        self, report: RunReport, incidents: Sequence[Incident] = ()
    ) -> RunReport:
        job = self._jobs.get(report.job_id)
        g.check_reportable(report.job_id, job.state.value if job else None)
        for r in self._rows("run_reports"):
            if r["job_id"] == report.job_id or r["id"] == report.id:
                raise Conflict(
                    f"job {r['job_id']} already has run report {r['id']};"
                    " a run report is written once and never replaced"
                )
        for n, incident in enumerate(incidents):  # all checked before anything is written
            self._check_incident(incident, incidents[:n])
        row = self._append("run_reports", g.report_row(report))
        for incident in incidents:
            self._append("incidents", g.incident_row(incident))
        return g.report_from_row(row)

    async def record_reports(
        self, items: Sequence[tuple[RunReport, Sequence[Incident]]]
    ) -> list[RunReport | None]:
        out: list[RunReport | None] = []
        for report, incidents in items:
            try:
                out.append(await self.record_report(report, incidents))
            except (Conflict, NotFound):
                out.append(None)
        return out

    async def report(self, job_id: str) -> RunReport | None:
        found = [r for r in self._rows("run_reports") if r["job_id"] == job_id]
        return g.report_from_row(found[0]) if found else None

    def _check_incident(self, i: Incident, batch: Sequence[Incident]) -> None:
        known = {r["id"]: r["resolves"] for r in self._rows("incidents")}
        known.update({b.id: b.resolves for b in batch})
        if i.id in known:
            raise Conflict(f"incident {i.id} exists already; incidents are append-only")
        if i.resolves is None:
            return
        if i.resolves not in known:
            raise NotFound(f"incident {i.resolves} (to resolve) does not exist")
        if known[i.resolves] is not None:
            raise Conflict(f"{i.resolves} is a resolution, not an incident to resolve")
        done = [k for k, v in known.items() if v == i.resolves]
        if done:
            raise Conflict(f"incident {i.resolves} is resolved already (by {done[0]})")

    async def append_incidents(self, incidents: Sequence[Incident]) -> list[Incident]:
        for n, incident in enumerate(incidents):
            self._check_incident(incident, incidents[:n])
        return [
            g.incident_from_row(self._append("incidents", g.incident_row(i))) for i in incidents
        ]

    async def incidents(
        self,
        job_id: str | None = None,
        *,
        open_only: bool = False,
        limit: int = 1000,
        tenant: str | None = None,
    ) -> list[Incident]:
        resolved = {r["resolves"] for r in self._rows("incidents") if r["resolves"]}
        found = [
            r
            for r in self._rows("incidents")
            if job_id in (None, r["job_id"])
            and not (open_only and (r["resolves"] or r["id"] in resolved))
            and (tenant is None or self._tenant_of(r["job_id"]) == tenant)
        ]
        return [g.incident_from_row(r) for r in found[-limit:]] if limit > 0 else []

    async def open_incidents(self, job_id: str | None = None) -> list[Incident]:
        return await self.incidents(job_id, open_only=True, limit=1_000_000)

    # ---- kill switches and pauses ----------------------------------------------------------

    def _pairs(self, kind: str) -> list[tuple[Row, Row | None]]:
        rows = [r for r in self._rows("switch_events") if r["kind"] == kind]
        lifts = {r["switch_id"]: r for r in rows if r["action"] == g.LIFT}
        return [(r, lifts.get(r["switch_id"])) for r in rows if r["action"] == g.ACTIVATE]

    def _activate(self, row: Row) -> Row:
        if any(a["switch_id"] == row["switch_id"] for a, _ in self._pairs(row["kind"])):
            raise Conflict(f"{row['kind']} {row['switch_id']} exists already")
        return self._append("switch_events", row)

    def _lift(self, kind: str, switch_id: str, at: float, by: str) -> tuple[Row, Row]:
        found = [(a, lifted) for a, lifted in self._pairs(kind) if a["switch_id"] == switch_id]
        if not found:
            raise NotFound(f"no {kind} {switch_id}")
        activation, lifted = found[0]
        if lifted is not None:
            raise Conflict(f"{kind} {switch_id} was lifted already")
        return activation, self._append("switch_events", g.lift_row(activation, at=at, by=by))

    async def activate_kill_switch(self, switch: KillSwitch) -> KillSwitch:
        return g.kill_switch_from_rows(self._activate(g.switch_row(g.KILL, switch)), None)

    async def lift_kill_switch(self, switch_id: str, *, at: float, by: str) -> KillSwitch:
        return g.kill_switch_from_rows(*self._lift(g.KILL, switch_id, at, by))

    async def kill_switches(self, *, active_at: float | None = None) -> list[KillSwitch]:
        found = [g.kill_switch_from_rows(a, lifted) for a, lifted in self._pairs(g.KILL)]
        return [s for s in found if active_at is None or s.active(active_at)]

    async def activate_pause(self, pause: Pause) -> Pause:
        return g.pause_from_rows(self._activate(g.switch_row(g.PAUSE, pause)), None)

    async def lift_pause(self, pause_id: str, *, at: float, by: str) -> Pause:
        return g.pause_from_rows(*self._lift(g.PAUSE, pause_id, at, by))

    async def pauses(self, *, active_only: bool = True) -> list[Pause]:
        found = [g.pause_from_rows(a, lifted) for a, lifted in self._pairs(g.PAUSE)]
        return [p for p in found if not active_only or p.active()]

    # ---- budgets ---------------------------------------------------------------------------

    async def set_budget(
        self, ceiling: BudgetCeiling, *, at: float | None = None, by: str = ""
    ) -> None:
        if ceiling.ceiling_usd < 0:
            raise InvalidRequest(f"a budget ceiling cannot be negative: {ceiling.ceiling_usd}")
        self._append(
            "budget_ceilings", g.ceiling_row(ceiling, time.time() if at is None else at, by)
        )

    def _ceilings(self) -> dict[tuple[str, str], Row]:
        return {(r["scope"], r["target"]): r for r in self._rows("budget_ceilings")}

    async def budgets(self) -> list[BudgetCeiling]:
        return [g.ceiling_from_row(r) for _, r in sorted(self._ceilings().items())]

    def _open_reservations(self, job_id: str) -> list[Row]:
        settled = {r["settles"] for r in self._rows("budget_ledger") if r["kind"] == g.COMMIT}
        return [
            r
            for r in self._rows("budget_ledger")
            if r["kind"] == g.RESERVE and r["job_id"] == job_id and r["seq"] not in settled
        ]

    def _status(self, scope: ScopeKind, target: str, period_start: float) -> BudgetStatus:
        ceiling = self._ceilings().get((scope.value, target))
        rows = [
            r
            for r in self._rows("budget_ledger")
            if r["scope"] == scope.value
            and r["target"] == target
            and r["charged_at"] >= period_start
        ]
        settled = {r["settles"] for r in rows if r["kind"] == g.COMMIT}
        return BudgetStatus(
            scope=scope,
            target=target,
            period_start=float(period_start),
            ceiling=g.ceiling_from_row(ceiling) if ceiling else None,
            spent=float(sum(r["amount"] for r in rows if r["kind"] == g.COMMIT)),
            reserved=float(
                sum(r["amount"] for r in rows if r["kind"] == g.RESERVE and r["seq"] not in settled)
            ),
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
        if any(
            r["scope"] == scope.value and r["target"] == target
            for r in self._open_reservations(job_id)
        ):
            return True
        remaining = self._status(scope, target, period_start).remaining
        if not g.admits(remaining, amount):
            return False
        when = time.time() if at is None else at
        self._append(
            "budget_ledger",
            {
                "kind": g.RESERVE,
                "job_id": job_id,
                "scope": scope.value,
                "target": target,
                "amount": amount,
                "charged_at": when,
                "at": when,
                "settles": None,
            },
        )
        return True

    async def commit_budget(self, job_id: str, actual: float, *, at: float | None = None) -> int:
        when = time.time() if at is None else at
        held = self._open_reservations(job_id)
        for r in held:
            self._append(
                "budget_ledger",
                {
                    "kind": g.COMMIT,
                    "job_id": job_id,
                    "scope": r["scope"],
                    "target": r["target"],
                    "amount": actual,
                    "charged_at": r["charged_at"],
                    "at": when,
                    "settles": r["seq"],
                },
            )
        return len(held)

    async def budget_status(
        self, scope: ScopeKind, target: str, period_start: float
    ) -> BudgetStatus:
        return self._status(ScopeKind(scope), target, period_start)

    # ---- dark launches ---------------------------------------------------------------------

    async def set_dark_launch(
        self, launch: DarkLaunch, *, at: float | None = None, by: str = ""
    ) -> None:
        if not 0 <= launch.percentage <= 100:
            raise InvalidRequest(f"a dark launch percentage is 0…100, not {launch.percentage}")
        self._append("dark_launches", g.launch_row(launch, time.time() if at is None else at, by))

    def _launches(self) -> dict[str, Row]:
        return {r["workflow"]: r for r in self._rows("dark_launches")}

    async def dark_launch(self, workflow: str) -> DarkLaunch | None:
        row = self._launches().get(workflow)
        return g.launch_from_row(row) if row else None

    async def dark_launches(self) -> list[DarkLaunch]:
        return [g.launch_from_row(r) for _, r in sorted(self._launches().items())]

    # ---- approvals -------------------------------------------------------------------------

    def _latest_approvals(self) -> dict[str, Row]:
        return {r["approval_id"]: r for r in self._rows("approval_events")}

    async def request_approval(self, approval: Approval) -> Approval:
        if approval.id in self._latest_approvals():
            raise Conflict(f"approval {approval.id} exists already")
        return g.approval_from_row(
            self._append(
                "approval_events",
                g.approval_row(
                    approval,
                    ApprovalState.PENDING,
                    at=approval.requested_at,
                    by=None,
                    note=approval.note,
                ),
            )
        )

    async def decide_approval(
        self, approval_id: str, state: ApprovalState, *, at: float, by: str, note: str = ""
    ) -> Approval:
        state = ApprovalState(state)
        if state not in (ApprovalState.APPROVED, ApprovalState.DENIED):
            raise InvalidRequest(f"an approval is decided approved or denied, not {state}")
        current = self._latest_approvals().get(approval_id)
        if current is None:
            raise NotFound(f"no approval {approval_id}")
        g.check_decidable(g.approval_from_row(current), at)
        return g.approval_from_row(
            self._append(
                "approval_events", g.next_approval_row(current, state, at=at, by=by, note=note)
            )
        )

    async def approval(self, approval_id: str) -> Approval:
        current = self._latest_approvals().get(approval_id)
        if current is None:
            raise NotFound(f"no approval {approval_id}")
        return g.approval_from_row(current)

    async def approvals(
        self, *, job_id: str | None = None, state: ApprovalState | None = None
    ) -> list[Approval]:
        rows = [
            r
            for r in self._latest_approvals().values()
            if job_id in (None, r["job_id"])
            and (state is None or r["state"] == ApprovalState(state).value)
        ]
        rows.sort(key=lambda r: (r["requested_at"], r["approval_id"]))
        return [g.approval_from_row(r) for r in rows]

    async def expire_approvals(self, now: float) -> list[Approval]:
        due = sorted(
            (
                r
                for r in self._latest_approvals().values()
                if r["state"] == ApprovalState.PENDING.value and r["expires_at"] <= now
            ),
            key=lambda r: r["seq"],
        )
        return [
            g.approval_from_row(self._append("approval_events", g.expiry_row(r, now))) for r in due
        ]

    # ---- the read model and the audit ------------------------------------------------------

    def _unified(self, job: Job) -> UnifiedRun:
        reports = [r for r in self._rows("run_reports") if r["job_id"] == job.id]
        report: Mapping[str, Any] = reports[0] if reports else {}
        mine = [r for r in self._rows("incidents") if r["job_id"] == job.id]
        resolved = {r["resolves"] for r in self._rows("incidents") if r["resolves"]}
        incidents = [r for r in mine if not r["resolves"]]
        evals = [r for r in self._rows("policy_evaluations") if r["job_id"] == job.id]
        last: Mapping[str, Any] = evals[-1] if evals else {}
        return g.unified_from_row(
            {
                "job_id": job.id,
                "state": job.state.value,
                "role": job.role,
                "tenant": job.tenant,
                "worker": job.worker,
                "created_at": job.created_at,
                "updated_at": job.updated_at,
                "report_id": report.get("id"),
                **{
                    c: report.get(c)
                    for c in (
                        "outcome",
                        "workflow",
                        "cost_usd",
                        "tokens_in",
                        "tokens_out",
                        "started_at",
                        "ended_at",
                        "duration_ms",
                    )
                },
                "incidents_total": len(incidents),
                "incidents_open": sum(r["id"] not in resolved for r in incidents),
                "policy_verdict": last.get("verdict"),
                "policy_reason": last.get("reason"),
                "policy_stage": last.get("stage"),
                "policy_at": last.get("at"),
            }
        )

    def _tenant_of(self, job_id: str | None) -> str | None:
        job = self._jobs.get(job_id or "")
        return job.tenant if job is not None else None

    async def run_unified(
        self,
        limit: int = 100,
        *,
        state: str | None = None,
        tenant: str | None = None,
        before: str | None = None,
    ) -> list[UnifiedRun]:
        jobs = sorted(
            (
                j
                for j in self._jobs.values()
                if state in (None, j.state.value)
                and tenant in (None, j.tenant)
                and (before is None or j.id < before)
            ),
            key=lambda j: j.id,
            reverse=True,
        )
        return [self._unified(j) for j in jobs[:limit]]

    async def unreported(self, limit: int = 100) -> list[str]:
        reported = {r["job_id"] for r in self._rows("run_reports")}
        jobs = sorted(
            (j for j in self._jobs.values() if j.state.terminal and j.id not in reported),
            key=lambda j: (j.updated_at, j.id),
        )
        return [j.id for j in jobs[:limit]]

    async def verify_audit(self, marks: Sequence[Mark] = ()) -> AuditReport:
        checked, problems = 0, list[Problem]()
        key = self._chain_key(create=False)
        for table, rows in self._chains.items():
            check = verify_rows(
                table,
                rows,
                self._heads.get(table),
                key,
                [m for m in marks if m.chain == table],
                getattr(self, "_archived", {}).get(table),
            )
            checked += check.checked
            problems += check.problems
        return AuditReport(
            ok=not problems,
            checked=checked,
            first_bad=problems[0] if problems else None,
            problems=tuple(problems),
        )

    async def audit_heads(self) -> dict[str, Head]:
        return dict(self._heads)

    async def missing_triggers(self) -> list[str]:
        return []  # nothing but the store's own code can change its rows

    async def restore_triggers(self) -> list[str]:
        return []
