"""Pre-run policy: may this job be dispatched now?

`decide(inp, now)` is a pure function of a snapshot the engine gathers (`PrerunInput`): no I/O,
no clock reads. Seven steps, first match wins:

1. `kill_switch`    an active kill switch in scope (global, the job's tenant, role or id)
                    → deny / kill_switch_active
2. `pause`          an active pause in scope → pause / runner_paused (the job waits)
3. `budget`         a ceiling of the job's tenant or role has no room for this job's
                    reservation in the current period → deny / budget_ceiling_exceeded
4. `parallel_limit` the tenant's other active runs ≥ its max parallel runs
                    → deny / max_parallel_runs_exceeded (the job is never counted against itself:
                    `decide` removes its id from the active set)
5. `dark_launch`    dark launch enabled for the job's workflow and the workflow outside the
                    window → deny / dark_launch_excluded
6. `approval`       a denied or expired approval → deny / approval_policy_deny; a pending one, or
                    a role that requires approval and no approved approval
                    → require_approval / approval_required
7. `none`           → allow / allowed (an allow names no policy)

The decision carries `snapshot`, a JSON-safe dict of exactly the inputs the deciding step used
(for `allow`: every step's inputs, since every step was checked), which the engine stores with
the policy evaluation.

The job's **workflow** (dark launch) is its `workflow` option when that is a non-empty string,
else its idempotency key, else none (a job without a workflow is never dark-launched):
`workflow_of`.

Budgets are reserve-then-commit (`reserve`, `commit`, `release`, `crossed`): the arithmetic and
the rules; the store applies them inside one transaction so that parallel admissions cannot
overshoot. The incident-rate breaker (`should_pause`) is human oversight: it names
the scopes whose recent incidents cross a threshold, for the engine to pause.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, tzinfo
from enum import StrEnum
from typing import Any

from corral.domain.governance import (
    Approval,
    ApprovalState,
    BudgetCeiling,
    DarkLaunch,
    KillSwitch,
    Pause,
    Period,
    PrerunVerdict,
    Reason,
    ScopeKind,
    Severity,
)
from corral.domain.models import Job

DAY_S = 86_400.0
ROLLING_30D_S = 30 * DAY_S
PRE_RUN_STAGE = "pre_run"  # PolicyEvaluation.stage of the row the engine writes per decision
RUN_SUBJECT = "run"  # Approval.subject of an approval that gates a whole job (not one tool call)
# The `limit_hit` the engine records when it stops an attempt whose running cost crossed a
# budget ceiling (reports.py files incident budget_overrun for it).
BUDGET_CEILING_LIMIT = "budget_ceiling"


class Step(StrEnum):
    """The pre-run steps, in order; the name is the policy type of the evaluation row."""

    KILL_SWITCH = "kill_switch"
    PAUSE = "pause"
    BUDGET = "budget"
    PARALLEL_LIMIT = "parallel_limit"
    DARK_LAUNCH = "dark_launch"
    APPROVAL = "approval"
    NONE = "none"  # allowed: no policy matched


def workflow_of(job: Job) -> str | None:
    """The job's workflow: an explicit `workflow` option, else its idempotency key, else None."""
    return job.options.workflow or job.key or None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRef:
    """What pre-run policy knows of the job."""

    id: str
    role: str
    tenant: str
    workflow: str | None = None

    @classmethod
    def of(cls, job: Job) -> JobRef:
        return cls(id=job.id, role=job.role, tenant=job.tenant, workflow=workflow_of(job))

    def matches(self, scope: ScopeKind, target: str | None) -> bool:
        """True when a switch, pause or ceiling with this scope and target applies to the job."""
        if scope is ScopeKind.GLOBAL:
            return True
        if target is None:
            return False
        if scope is ScopeKind.TENANT:
            return self.tenant == target
        if scope is ScopeKind.ROLE:
            return self.role == target
        return self.id == target

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "role": self.role, "tenant": self.tenant, "workflow": self.workflow}


# ---- budgets: reserve, then commit ------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetState:
    """One ceiling and what counts against it in its current period.

    `spent_usd` is the committed cost of attempts since `period_start(ceiling.period, now)`;
    `reserved_usd` the sum of open reservations (attempts admitted and not yet committed).
    """

    ceiling: BudgetCeiling
    spent_usd: float = 0.0
    reserved_usd: float = 0.0

    @property
    def headroom_usd(self) -> float:
        return self.ceiling.ceiling_usd - self.spent_usd - self.reserved_usd

    def admits(self, amount: float) -> bool:
        """The admission rule: some room is left and the amount fits in it.

        `spent + reserved + amount ≤ ceiling`, and a ceiling with no room left (headroom ≤ 0)
        admits nothing, not even a zero estimate: an exhausted budget stops new runs.
        """
        if amount < 0:
            raise ValueError(f"a reservation cannot be negative ({amount})")
        return self.headroom_usd > 0 and amount <= self.headroom_usd

    def to_dict(self) -> dict[str, Any]:
        c = self.ceiling
        return {
            "scope": c.scope.value,
            "target": c.target,
            "period": c.period.value,
            "ceiling_usd": c.ceiling_usd,
            "spent_usd": self.spent_usd,
            "reserved_usd": self.reserved_usd,
            "headroom_usd": self.headroom_usd,
        }


def reserve(state: BudgetState, amount: float) -> tuple[bool, BudgetState]:
    """Hold `amount` USD for an attempt about to start: (admitted, state after).

    Admitted only if `state.admits(amount)`; then the reservation counts against the ceiling
    until `commit` or `release`. The store runs check and update in one transaction per ceiling
    (and all of a job's ceilings in one transaction), so two parallel admissions see each
    other's reservations and together can never pass the ceiling. Refused: the state unchanged.
    """
    if not state.admits(amount):
        return False, state
    return True, replace(state, reserved_usd=state.reserved_usd + amount)


def commit(state: BudgetState, reserved: float, actual: float) -> BudgetState:
    """An attempt ended: its reservation is replaced by what it actually cost."""
    if actual < 0 or reserved < 0:
        raise ValueError("costs and reservations cannot be negative")
    return replace(
        state,
        reserved_usd=max(0.0, state.reserved_usd - reserved),
        spent_usd=state.spent_usd + actual,
    )


def release(state: BudgetState, reserved: float) -> BudgetState:
    """An admitted attempt never started (or cost nothing): its reservation is given back."""
    return commit(state, reserved, 0.0)


def crossed(state: BudgetState, cost_so_far: float, *, own_reservation: float = 0.0) -> bool:
    """True when an attempt's running cost has pushed the ceiling over: an overrun.

    `state` is the ceiling as the store holds it now; `own_reservation` is this attempt's share
    of `state.reserved_usd` (0 if the state excludes it). The attempt has overrun when the
    committed spend, the other attempts' reservations and its own cost so far together exceed
    the ceiling: `spent + (reserved − own) + cost_so_far > ceiling`. The engine then stops the
    attempt (limit_hit `budget_ceiling`) and files incident budget_overrun.
    """
    others = max(0.0, state.reserved_usd - own_reservation)
    return state.spent_usd + others + cost_so_far > state.ceiling.ceiling_usd


def period_start(period: Period, now: float, tz: tzinfo = UTC) -> float:
    """Start of the period containing `now`: daily, midnight; monthly, the first of the month at
    midnight (both in `tz`, UTC by default); rolling_30d, `now` − 30 days."""
    if period is Period.ROLLING_30D:
        return now - ROLLING_30D_S
    local = datetime.fromtimestamp(now, tz)
    start = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if period is Period.MONTHLY:
        start = start.replace(day=1)
    return start.timestamp()


def period_end(period: Period, now: float, tz: tzinfo = UTC) -> float:
    """When the period containing `now` resets (rolling_30d: never as a whole, so `now`)."""
    if period is Period.ROLLING_30D:
        return now
    start = datetime.fromtimestamp(period_start(period, now, tz), tz)
    if period is Period.DAILY:
        return (start + timedelta(days=1)).timestamp()
    year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
    return start.replace(year=year, month=month).timestamp()


# ---- dark launch ------------------------------------------------------------------------------


def dark_launch_position(workflow: str) -> int:
    """The workflow's fixed position, 0 … 99: the first 32 bits of md5(workflow, UTF-8) read
    as an unsigned big-endian integer, mod 100 (never negative; docs/reference/dark-launch.md
    publishes test vectors)."""
    digest = hashlib.md5(workflow.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big", signed=False) % 100


def in_dark_launch_window(workflow: str, percentage: int) -> bool:
    """Included iff position < percentage: 0 excludes every workflow, 100 includes every one."""
    return dark_launch_position(workflow) < percentage


# ---- the input and the decision ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PrerunInput:
    """Everything the decision needs, as the engine read it (one consistent snapshot).

    - `kill_switches`, `pauses`: every switch / pause the engine holds (or those that may apply);
      `decide` keeps those in scope and active at `now`.
    - `budgets`: the ceilings of the job's tenant and role with their period's spend and open
      reservations; `estimate_usd` the reservation this job's next attempt would take.
    - `active_job_ids`: ids of the tenant's active runs as the engine counts them (the job's own
      id may be among them: `decide` removes it); `max_parallel_runs` None: no limit.
    - `dark_launch`: the dark-launch setting of the job's workflow, if any.
    - `approval_roles`: roles whose jobs need a human approval; `approval`: this job's run
      approval (subject `run`), if one was requested.
    """

    job: JobRef
    kill_switches: Sequence[KillSwitch] = ()
    pauses: Sequence[Pause] = ()
    budgets: Sequence[BudgetState] = ()
    estimate_usd: float = 0.0
    active_job_ids: frozenset[str] = frozenset()
    max_parallel_runs: int | None = None
    dark_launch: DarkLaunch | None = None
    approval_roles: frozenset[str] = frozenset()
    approval: Approval | None = None

    def __post_init__(self) -> None:
        if self.estimate_usd < 0:
            raise ValueError(f"estimate_usd cannot be negative ({self.estimate_usd})")
        if self.max_parallel_runs is not None and self.max_parallel_runs < 0:
            raise ValueError(f"max_parallel_runs cannot be negative ({self.max_parallel_runs})")
        dl = self.dark_launch
        if dl is not None:
            if dl.workflow != self.job.workflow:
                raise ValueError(
                    f"dark launch of workflow {dl.workflow!r} given for a job of "
                    f"workflow {self.job.workflow!r}"
                )
            if not 0 <= dl.percentage <= 100:
                raise ValueError(f"dark launch percentage {dl.percentage} is not in 0 … 100")
        a = self.approval
        if a is not None and (a.job_id != self.job.id or a.subject != RUN_SUBJECT):
            raise ValueError(f"approval {a.id} does not gate the run of job {self.job.id}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PrerunDecision:
    verdict: PrerunVerdict
    reason: Reason
    message: str  # one line for people
    step: Step
    snapshot: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Match:
    verdict: PrerunVerdict
    reason: Reason
    message: str


_StepFn = Callable[[PrerunInput, float], tuple[_Match | None, dict[str, Any]]]


def _switch_dict(s: KillSwitch) -> dict[str, Any]:
    return {
        "id": s.id,
        "scope": s.scope.value,
        "target": s.target,
        "reason": s.reason,
        "created_at": s.created_at,
        "created_by": s.created_by,
        "expires_at": s.expires_at,
    }


def _pause_dict(p: Pause) -> dict[str, Any]:
    return {
        "id": p.id,
        "scope": p.scope.value,
        "target": p.target,
        "reason": p.reason,
        "created_at": p.created_at,
        "created_by": p.created_by,
    }


def _scope_text(scope: ScopeKind, target: str | None) -> str:
    return "global" if scope is ScopeKind.GLOBAL else f"{scope.value} {target}"


def _kill_switch(inp: PrerunInput, now: float) -> tuple[_Match | None, dict[str, Any]]:
    hits = [s for s in inp.kill_switches if s.active(now) and inp.job.matches(s.scope, s.target)]
    snap = {"active_in_scope": [_switch_dict(s) for s in hits]}
    if not hits:
        return None, snap
    s = hits[0]
    return _Match(
        PrerunVerdict.DENY,
        Reason.KILL_SWITCH_ACTIVE,
        f"kill switch {s.id} ({_scope_text(s.scope, s.target)}) is on: {s.reason}",
    ), snap


def _pause(inp: PrerunInput, now: float) -> tuple[_Match | None, dict[str, Any]]:
    hits = [p for p in inp.pauses if p.active() and inp.job.matches(p.scope, p.target)]
    snap = {"active_in_scope": [_pause_dict(p) for p in hits]}
    if not hits:
        return None, snap
    p = hits[0]
    return _Match(
        PrerunVerdict.PAUSE,
        Reason.RUNNER_PAUSED,
        f"dispatch is paused ({_scope_text(p.scope, p.target)}): {p.reason}",
    ), snap


def _budget(inp: PrerunInput, now: float) -> tuple[_Match | None, dict[str, Any]]:
    applicable = [b for b in inp.budgets if inp.job.matches(b.ceiling.scope, b.ceiling.target)]
    rows = []
    over: list[BudgetState] = []
    for b in applicable:
        ok = b.admits(inp.estimate_usd)
        rows.append(
            {**b.to_dict(), "period_start": period_start(b.ceiling.period, now), "admits": ok}
        )
        if not ok:
            over.append(b)
    snap = {"estimate_usd": inp.estimate_usd, "ceilings": rows}
    if not over:
        return None, snap
    b = over[0]
    c = b.ceiling
    return _Match(
        PrerunVerdict.DENY,
        Reason.BUDGET_CEILING_EXCEEDED,
        (
            f"{c.period.value} budget of {c.scope.value} {c.target} is exhausted: "
            f"${b.spent_usd:.2f} spent + ${b.reserved_usd:.2f} reserved + "
            f"${inp.estimate_usd:.2f} for this job > ${c.ceiling_usd:.2f}"
        ),
    ), snap


def _parallel(inp: PrerunInput, now: float) -> tuple[_Match | None, dict[str, Any]]:
    others = sorted(inp.active_job_ids - {inp.job.id})
    limit = inp.max_parallel_runs
    snap = {
        "tenant": inp.job.tenant,
        "max_parallel_runs": limit,
        "active_runs": len(others),
        "active_job_ids": others,
        "self_excluded": inp.job.id in inp.active_job_ids,
    }
    if limit is None or len(others) < limit:
        return None, snap
    return _Match(
        PrerunVerdict.DENY,
        Reason.MAX_PARALLEL_RUNS_EXCEEDED,
        f"tenant {inp.job.tenant} has {len(others)} active runs; its limit is {limit}",
    ), snap


def _dark_launch(inp: PrerunInput, now: float) -> tuple[_Match | None, dict[str, Any]]:
    dl = inp.dark_launch
    if dl is None or not dl.enabled or inp.job.workflow is None:
        return None, {"workflow": inp.job.workflow, "enabled": bool(dl and dl.enabled)}
    position = dark_launch_position(dl.workflow)
    included = position < dl.percentage
    snap = {
        "workflow": dl.workflow,
        "enabled": True,
        "percentage": dl.percentage,
        "position": position,
        "included": included,
    }
    if included:
        return None, snap
    return _Match(
        PrerunVerdict.DENY,
        Reason.DARK_LAUNCH_EXCLUDED,
        f"workflow {dl.workflow} is outside the dark launch window (position "
        f"{position} ≥ {dl.percentage}%)",
    ), snap


def _approval(inp: PrerunInput, now: float) -> tuple[_Match | None, dict[str, Any]]:
    a = inp.approval
    role_requires = inp.job.role in inp.approval_roles
    snap: dict[str, Any] = {
        "role": inp.job.role,
        "role_requires_approval": role_requires,
        "approval": None,
    }
    if a is not None:
        expired = a.state is ApprovalState.EXPIRED or (
            a.state is ApprovalState.PENDING and now >= a.expires_at
        )
        snap["approval"] = {
            "id": a.id,
            "state": a.state.value,
            "expires_at": a.expires_at,
            "expired": expired,
            "decided_by": a.decided_by,
            "decided_at": a.decided_at,
        }
        if a.state is ApprovalState.APPROVED:
            return None, snap
        if a.state is ApprovalState.DENIED or expired:
            how = "expired" if expired else f"was denied by {a.decided_by or 'a reviewer'}"
            return _Match(
                PrerunVerdict.DENY, Reason.APPROVAL_POLICY_DENY, f"approval {a.id} {how}"
            ), snap
        return _Match(
            PrerunVerdict.REQUIRE_APPROVAL, Reason.APPROVAL_REQUIRED, f"approval {a.id} is pending"
        ), snap
    if role_requires:
        return _Match(
            PrerunVerdict.REQUIRE_APPROVAL,
            Reason.APPROVAL_REQUIRED,
            f"jobs of role {inp.job.role} need a human approval",
        ), snap
    return None, snap


STEPS: tuple[tuple[Step, _StepFn], ...] = (
    (Step.KILL_SWITCH, _kill_switch),
    (Step.PAUSE, _pause),
    (Step.BUDGET, _budget),
    (Step.PARALLEL_LIMIT, _parallel),
    (Step.DARK_LAUNCH, _dark_launch),
    (Step.APPROVAL, _approval),
)


def decide(inp: PrerunInput, now: float) -> PrerunDecision:
    """The pre-run verdict: the first step that matches decides (module docstring)."""
    base: dict[str, Any] = {"job": inp.job.to_dict(), "now": now}
    checked: dict[str, Any] = {}
    for step, check in STEPS:
        match, snap = check(inp, now)
        if match is not None:
            return PrerunDecision(
                verdict=match.verdict,
                reason=match.reason,
                message=match.message,
                step=step,
                snapshot={**base, step.value: snap},
            )
        checked[step.value] = snap
    return PrerunDecision(
        verdict=PrerunVerdict.ALLOW,
        reason=Reason.ALLOWED,
        message="no pre-run policy holds the job back",
        step=Step.NONE,
        snapshot={**base, **checked},
    )


# ---- human oversight: the incident-rate breaker -----------------------------------------------

SEVERITY_RANK: Mapping[Severity, int] = {
    Severity.LOW: 0,
    Severity.MEDIUM: 1,
    Severity.HIGH: 2,
    Severity.CRITICAL: 3,
}

IncidentMark = tuple[float, ScopeKind, str | None, Severity]  # (at, scope, target, severity)


def should_pause(
    incidents: Iterable[IncidentMark],
    now: float,
    window_s: float,
    threshold: int,
    min_severity: Severity,
) -> list[tuple[ScopeKind, str | None]]:
    """The scopes whose incident rate crosses the threshold: pause dispatch there.

    Counts the incidents of severity ≥ `min_severity` that occurred in the window
    `(now − window_s, now]`, per (scope, target) exactly as given (an incident counts only for
    the scope it names: the engine passes one mark per scope it wants watched, e.g. the job's
    tenant and its role). A scope crosses when its count reaches `threshold`. Sorted, so the
    result is deterministic.
    """
    if threshold < 1 or window_s <= 0:
        raise ValueError("threshold must be ≥ 1 and window_s > 0")
    floor = SEVERITY_RANK[min_severity]
    counts: dict[tuple[ScopeKind, str | None], int] = {}
    for at, scope, target, severity in incidents:
        if now - window_s < at <= now and SEVERITY_RANK[severity] >= floor:
            key = (scope, None if scope is ScopeKind.GLOBAL else target)
            counts[key] = counts.get(key, 0) + 1
    return sorted(
        (k for k, n in counts.items() if n >= threshold), key=lambda k: (k[0].value, k[1] or "")
    )
