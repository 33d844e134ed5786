"""Governance values: run reports, incidents, kill
switches, pauses, budget ceilings, dark launches and approvals. Pure values; the pre-run engine
(policy/prerun.py) decides from them and the store keeps them append-only."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class PrerunVerdict(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    PAUSE = "pause"
    REQUIRE_APPROVAL = "require_approval"


class Reason(StrEnum):
    """Machine reason codes of the pre-run engine (snake_case, never free text)."""

    KILL_SWITCH_ACTIVE = "kill_switch_active"
    RUNNER_PAUSED = "runner_paused"
    BUDGET_CEILING_EXCEEDED = "budget_ceiling_exceeded"
    MAX_PARALLEL_RUNS_EXCEEDED = "max_parallel_runs_exceeded"
    DARK_LAUNCH_EXCLUDED = "dark_launch_excluded"
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_POLICY_DENY = "approval_policy_deny"
    ALLOWED = "allowed"


class ScopeKind(StrEnum):
    """What a kill switch, a pause or a budget applies to."""

    GLOBAL = "global"
    TENANT = "tenant"
    ROLE = "role"
    JOB = "job"


class Period(StrEnum):
    DAILY = "daily"
    MONTHLY = "monthly"
    ROLLING_30D = "rolling_30d"


class ReportOutcome(StrEnum):
    """A run report's outcome (a cancel is not a kill)."""

    SUCCESS = "success"
    FAILED = "failed"
    CANCELLED = "cancelled"
    KILLED = "killed"
    TIMED_OUT = "timed_out"
    DEAD_LETTERED = "dead_lettered"
    DENIED = "denied"


class IncidentType(StrEnum):
    """What an incident is about; `policy/reports.py` says which attempt yields which."""

    STEP_ERROR = "step_error"
    TOOL_ERROR = "tool_error"
    TOOL_TIMEOUT = "tool_timeout"
    TOOL_REJECTION = "tool_rejection"
    TIMEOUT = "timeout"
    BUDGET_OVERRUN = "budget_overrun"
    POLICY_DENIAL = "policy_denial"
    APPROVAL_REJECTED = "approval_rejected"
    MEMORY_WRITE_FAILED = "memory_write_failed"
    KILL_SWITCH_ACTIVATED = "kill_switch_activated"
    GUARDRAIL_VIOLATION = "guardrail_violation"
    RETRY_EXHAUSTED = "retry_exhausted"
    STALL_DETECTED = "stall_detected"
    FAILURE = "failure"
    ANOMALY = "anomaly"
    DEADLOCK = "deadlock"  # raised while jobs run (runtime/worldwatch.py), not in a report
    # a training run's watched metric worse than its baseline's (runtime/regressions.py)
    METRIC_REGRESSION = "metric_regression"


class Severity(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


@dataclass(frozen=True, slots=True, kw_only=True)
class KillSwitch:
    """New runs in scope are denied; running attempts in scope are stopped (KILLED)."""

    id: str
    scope: ScopeKind
    target: str | None  # tenant / role / job id; None for global
    reason: str
    created_at: float
    created_by: str
    expires_at: float | None = None
    lifted_at: float | None = None  # lifting is a new record in the store, shown here

    def active(self, now: float) -> bool:
        return self.lifted_at is None and (self.expires_at is None or now < self.expires_at)


@dataclass(frozen=True, slots=True, kw_only=True)
class Pause:
    """New dispatch in scope waits; running attempts finish."""

    id: str
    scope: ScopeKind
    target: str | None
    reason: str
    created_at: float
    created_by: str
    resumed_at: float | None = None

    def active(self) -> bool:
        return self.resumed_at is None


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetCeiling:
    """USD per period for a tenant or a role, from attempt cost (reserve, then commit)."""

    scope: ScopeKind  # TENANT or ROLE
    target: str
    period: Period
    ceiling_usd: float


@dataclass(frozen=True, slots=True, kw_only=True)
class DarkLaunch:
    """Only `percentage` % of workflows run: position = md5(workflow)[:32 bits] mod 100."""

    workflow: str
    percentage: int  # 0 … 100
    enabled: bool = True


class ApprovalState(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True, kw_only=True)
class Approval:
    """A human decision a job (or one exact tool call) waits for; expiry is a denial."""

    id: str
    job_id: str
    subject: str  # "run", or the exact tool call (e.g. the shell command) it is bound to
    digest: str  # sha256 of the subject: an approval is valid for exactly this action
    reason: str  # machine code of the rule that asked
    requested_at: float
    expires_at: float
    state: ApprovalState = ApprovalState.PENDING
    decided_at: float | None = None
    decided_by: str | None = None
    note: str = ""

    @classmethod
    def asked(
        cls, *, id: str, job_id: str, subject: str, reason: str, now: float, ttl_s: float
    ) -> Approval:
        """A new request, bound to its subject's digest, expiring `ttl_s` from `now`."""
        return cls(
            id=id,
            job_id=job_id,
            subject=subject,
            digest=approval_digest(subject),
            reason=reason,
            requested_at=now,
            expires_at=now + ttl_s,
        )


def approval_digest(subject: str) -> str:
    """SHA-256 (hex) of an approval subject: what an approval record binds to."""
    return hashlib.sha256(subject.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class RunReport:
    """Written exactly once, when a job reaches a terminal state; never updated."""

    id: str
    job_id: str
    role: str
    tenant: str
    workflow: str | None
    outcome: ReportOutcome
    attempts: int
    steps: int
    tool_calls: int
    tokens_in: int
    tokens_out: int
    cost_usd: float
    started_at: float | None
    ended_at: float
    duration_ms: int | None
    summary: str
    created_at: float
    metrics: Mapping[str, Any] = field(default_factory=dict)
    hash: str = ""  # of the chain, set by the store


@dataclass(frozen=True, slots=True, kw_only=True)
class Incident:
    """A structured problem attached to a run report; append-only (a resolution is a new
    record)."""

    id: str
    report_id: str | None
    job_id: str
    type: IncidentType
    severity: Severity
    message: str
    created_at: float
    context: Mapping[str, Any] = field(default_factory=dict)
    resolves: str | None = None  # the incident this record resolves
    hash: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class UnifiedRun:
    """One row of the `v_run_unified` read model: a job, its report, its incidents (open and
    total, resolutions not counted) and its latest policy verdict."""

    job_id: str
    state: str
    role: str
    tenant: str
    worker: str
    created_at: float
    updated_at: float
    report_id: str | None
    outcome: str | None
    workflow: str | None
    cost_usd: float | None
    tokens_in: int | None
    tokens_out: int | None
    started_at: float | None
    ended_at: float | None
    duration_ms: int | None
    incidents_total: int
    incidents_open: int
    policy_verdict: str | None
    policy_reason: str | None
    policy_stage: str | None
    policy_at: float | None
