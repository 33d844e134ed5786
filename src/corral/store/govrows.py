"""Governance values as rows of the chained tables, and back (shared by the SQL and memory
stores, so both hash exactly the same content)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from corral.domain.agents import PolicyEvaluation
from corral.domain.errors import Conflict, NotFound
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
    UnifiedRun,
)
from corral.domain.states import JobState
from corral.domain.tokens import ApiToken, TokenEvent
from corral.store.rows import dumps

Row = Mapping[str, Any]
KILL, PAUSE = "kill_switch", "pause"
ACTIVATE, LIFT = "activate", "lift"
RESERVE, COMMIT = "reserve", "commit"
EXPIRY_ACTOR = "corral"  # who expires an approval nobody decided
BUDGET_SLACK = 1e-9  # float sums: 0.1 + 0.2 must fit a 0.3 ceiling


def token_event_row(t: ApiToken, action: str, *, at: float, by: str) -> dict[str, Any]:
    """A token's creation or revocation on the `token_events` chain (no secret, no hash)."""
    return {
        "token_id": t.id,
        "action": action,
        "tenant": t.tenant,
        "scopes": ",".join(t.scopes),
        "name": t.name,
        "at": at,
        "actor": by,
        "expires_at": t.expires_at,
    }


def token_event_from_row(r: Row) -> TokenEvent:
    return TokenEvent(
        token_id=r["token_id"],
        action=r["action"],
        tenant=r["tenant"],
        scopes=tuple(s for s in str(r["scopes"]).split(",") if s),
        name=r["name"],
        at=float(r["at"]),
        actor=r["actor"],
        expires_at=None if r["expires_at"] is None else float(r["expires_at"]),
    )


def evaluation_row(e: PolicyEvaluation) -> dict[str, Any]:
    return {
        "at": e.at,
        "job_id": e.job_id,
        "attempt": e.attempt,
        "stage": e.stage,
        "subject": e.subject,
        "verdict": e.verdict,
        "reason": e.reason,
        "message": e.message,
        "inputs": dumps(dict(e.inputs)),
    }


def evaluation_from_row(r: Row) -> PolicyEvaluation:
    return PolicyEvaluation(
        id=int(r["id"]),
        at=float(r["at"]),
        job_id=r["job_id"],
        attempt=r["attempt"],
        stage=r["stage"],
        subject=r["subject"],
        verdict=r["verdict"],
        reason=r["reason"],
        message=r["message"],
        inputs=json.loads(r["inputs"]),
    )


def report_row(r: RunReport) -> dict[str, Any]:
    return {
        "id": r.id,
        "job_id": r.job_id,
        "role": r.role,
        "tenant": r.tenant,
        "workflow": r.workflow,
        "outcome": ReportOutcome(r.outcome).value,
        "attempts": r.attempts,
        "steps": r.steps,
        "tool_calls": r.tool_calls,
        "tokens_in": r.tokens_in,
        "tokens_out": r.tokens_out,
        "cost_usd": r.cost_usd,
        "started_at": r.started_at,
        "ended_at": r.ended_at,
        "duration_ms": r.duration_ms,
        "summary": r.summary,
        "created_at": r.created_at,
        "metrics": dumps(dict(r.metrics)),
    }


def report_from_row(r: Row) -> RunReport:
    return RunReport(
        id=r["id"],
        job_id=r["job_id"],
        role=r["role"],
        tenant=r["tenant"],
        workflow=r["workflow"],
        outcome=ReportOutcome(r["outcome"]),
        attempts=int(r["attempts"]),
        steps=int(r["steps"]),
        tool_calls=int(r["tool_calls"]),
        tokens_in=int(r["tokens_in"]),
        tokens_out=int(r["tokens_out"]),
        cost_usd=float(r["cost_usd"]),
        started_at=r["started_at"],
        ended_at=float(r["ended_at"]),
        duration_ms=r["duration_ms"],
        summary=r["summary"],
        created_at=float(r["created_at"]),
        metrics=json.loads(r["metrics"]),
        hash=r["hash"],
    )


def incident_row(i: Incident) -> dict[str, Any]:
    return {
        "id": i.id,
        "report_id": i.report_id,
        "job_id": i.job_id,
        "type": IncidentType(i.type).value,
        "severity": Severity(i.severity).value,
        "message": i.message,
        "created_at": i.created_at,
        "context": dumps(dict(i.context)),
        "resolves": i.resolves,
    }


def incident_from_row(r: Row) -> Incident:
    return Incident(
        id=r["id"],
        report_id=r["report_id"],
        job_id=r["job_id"],
        type=IncidentType(r["type"]),
        severity=Severity(r["severity"]),
        message=r["message"],
        created_at=float(r["created_at"]),
        context=json.loads(r["context"]),
        resolves=r["resolves"],
        hash=r["hash"],
    )


def switch_row(kind: str, s: KillSwitch | Pause) -> dict[str, Any]:
    """An activation row of a kill switch or a pause."""
    return {
        "kind": kind,
        "switch_id": s.id,
        "action": ACTIVATE,
        "scope": ScopeKind(s.scope).value,
        "target": s.target,
        "reason": s.reason,
        "at": s.created_at,
        "actor": s.created_by,
        "expires_at": getattr(s, "expires_at", None),
    }


def lift_row(activation: Row, *, at: float, by: str) -> dict[str, Any]:
    return {
        "kind": activation["kind"],
        "switch_id": activation["switch_id"],
        "action": LIFT,
        "scope": activation["scope"],
        "target": activation["target"],
        "reason": activation["reason"],
        "at": at,
        "actor": by,
        "expires_at": None,
    }


def kill_switch_from_rows(a: Row, lifted: Row | None) -> KillSwitch:
    return KillSwitch(
        id=a["switch_id"],
        scope=ScopeKind(a["scope"]),
        target=a["target"],
        reason=a["reason"],
        created_at=float(a["at"]),
        created_by=a["actor"],
        expires_at=a["expires_at"],
        lifted_at=float(lifted["at"]) if lifted else None,
    )


def pause_from_rows(a: Row, lifted: Row | None) -> Pause:
    return Pause(
        id=a["switch_id"],
        scope=ScopeKind(a["scope"]),
        target=a["target"],
        reason=a["reason"],
        created_at=float(a["at"]),
        created_by=a["actor"],
        resumed_at=float(lifted["at"]) if lifted else None,
    )


def ceiling_row(c: BudgetCeiling, at: float, by: str) -> dict[str, Any]:
    return {
        "scope": ScopeKind(c.scope).value,
        "target": c.target,
        "period": Period(c.period).value,
        "ceiling_usd": c.ceiling_usd,
        "at": at,
        "actor": by,
    }


def ceiling_from_row(r: Row) -> BudgetCeiling:
    return BudgetCeiling(
        scope=ScopeKind(r["scope"]),
        target=r["target"],
        period=Period(r["period"]),
        ceiling_usd=float(r["ceiling_usd"]),
    )


def launch_row(d: DarkLaunch, at: float, by: str) -> dict[str, Any]:
    return {
        "workflow": d.workflow,
        "percentage": int(d.percentage),
        "enabled": int(d.enabled),
        "at": at,
        "actor": by,
    }


def launch_from_row(r: Row) -> DarkLaunch:
    return DarkLaunch(
        workflow=r["workflow"], percentage=int(r["percentage"]), enabled=bool(r["enabled"])
    )


def approval_row(
    a: Approval, state: ApprovalState, *, at: float, by: str | None, note: str
) -> dict[str, Any]:
    return {
        "approval_id": a.id,
        "job_id": a.job_id,
        "subject": a.subject,
        "digest": a.digest,
        "reason": a.reason,
        "requested_at": a.requested_at,
        "expires_at": a.expires_at,
        "state": ApprovalState(state).value,
        "at": at,
        "actor": by,
        "note": note,
    }


def approval_from_row(r: Row) -> Approval:
    """An approval as its latest event row says."""
    state = ApprovalState(r["state"])
    decided = state is not ApprovalState.PENDING
    return Approval(
        id=r["approval_id"],
        job_id=r["job_id"],
        subject=r["subject"],
        digest=r["digest"],
        reason=r["reason"],
        requested_at=float(r["requested_at"]),
        expires_at=float(r["expires_at"]),
        state=state,
        decided_at=float(r["at"]) if decided else None,
        decided_by=r["actor"] if decided else None,
        note=r["note"],
    )


UNIFIED_COLUMNS = tuple(UnifiedRun.__dataclass_fields__)
_INTS = ("tokens_in", "tokens_out", "duration_ms")
_FLOATS = ("cost_usd", "started_at", "ended_at", "policy_at")


def unified_from_row(r: Row) -> UnifiedRun:
    vals = {c: r[c] for c in UNIFIED_COLUMNS}
    for c in _INTS:
        vals[c] = None if vals[c] is None else int(vals[c])
    for c in _FLOATS:
        vals[c] = None if vals[c] is None else float(vals[c])
    vals["created_at"] = float(vals["created_at"])
    vals["updated_at"] = float(vals["updated_at"])
    vals["incidents_total"] = int(vals["incidents_total"] or 0)
    vals["incidents_open"] = int(vals["incidents_open"] or 0)
    return UnifiedRun(**vals)


def admits(remaining: float | None, amount: float) -> bool:
    """The admission rule of policy/prerun.py's BudgetState, applied atomically: some room is
    left and the amount fits in it (an exhausted budget admits nothing, not even 0)."""
    if remaining is None:
        return True
    return remaining > 0 and amount <= remaining + BUDGET_SLACK


def check_reportable(job_id: str, state: str | None) -> None:
    """A run report is written for an existing job in a terminal state."""
    if state is None:
        raise NotFound(f"no job {job_id} to report on")
    if not JobState(state).terminal:
        raise Conflict(f"job {job_id} is {state}: a run report is written when it has ended")


def check_decidable(a: Approval, at: float) -> None:
    """Only a pending approval, before it expires, takes a decision."""
    if a.state is not ApprovalState.PENDING:
        raise Conflict(f"approval {a.id} is {a.state.value} already")
    if at >= a.expires_at:
        raise Conflict(f"approval {a.id} expired at {a.expires_at}; request a new one")


def next_approval_row(
    current: Row, state: ApprovalState, *, at: float, by: str | None, note: str
) -> dict[str, Any]:
    """The event that moves an approval (as its latest row says) to `state`."""
    return approval_row(approval_from_row(current), state, at=at, by=by, note=note)


def expiry_row(current: Row, now: float) -> dict[str, Any]:
    return next_approval_row(
        current, ApprovalState.EXPIRED, at=now, by=EXPIRY_ACTOR, note="expired undecided"
    )
