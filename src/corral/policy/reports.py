"""Run reports and incidents, derived once from a terminal job.

Both are pure functions of what the store holds when the job reaches its terminal state; the
store writes their result exactly once (append-only, hash-chained) and never updates it.

**Outcome** comes from the terminal job state and nothing else (`OUTCOME`): a CANCELLED job is
`cancelled`, always: an operator's or a latest-wins cancel is never recorded as a kill (a
known defect of kill-switch designs that write a kill-switch row for every cancel and report it
as killed). Only a KILLED job, which only the kill switch produces, is `killed`.

**Counts.** `attempts` is the number of attempts. `steps` equals `attempts`: Corral sees an
agent's tool calls, not its plan, so the unit of work it can count is the attempt. Tool calls,
tokens in/out and cost are summed over the AgentEvents (one per attempt; a later event for the
same attempt replaces an earlier one); an attempt without an event (a plain command), or whose
event carries no cost, counts the cost its worker reported (`attempt_costs`, from
`AttemptResult.cost_usd`).

**Incidents** (`incidents_for`): one per problem, typed, with the severity of `SEVERITY` (the
single table of severities):

| type                  | when                                                            |
|-----------------------|-----------------------------------------------------------------|
| budget_overrun        | an attempt stopped at a budget (limit_hit `token_budget_in`,     |
|                       | `token_budget_out`, `max_tool_calls` or `budget_ceiling`)        |
| stall_detected        | an attempt whose error says it stalled                          |
| timeout               | an attempt that timed out (or a TIMED_OUT job no attempt        |
|                       | incident explains)                                              |
| failure               | an attempt that FAILED or was LOST (or a FAILED job no attempt  |
|                       | incident explains, e.g. one whose dependency failed)            |
| guardrail_violation   | a tool call denied by a guardrail rule (evaluation stage         |
|                       | `guardrail`, or a reason code starting `guardrail`)             |
| policy_denial         | a tool call denied out of scope (any other non-budget denial),  |
|                       | or a pre-run deny (stage `pre_run`)                             |
| approval_rejected     | a pre-run deny because the approval was denied or expired       |
| retry_exhausted       | a DEAD_LETTERED job                                             |
| kill_switch_activated | a KILLED job that had an attempt running (a KILLED attempt): a  |
|                       | queued job the switch took off the queue gets none              |
| anomaly               | whatever a detector passed in `detectors` reports               |
| deadlock              | never from a report: the engine's world watch raises it while   |
|                       | the jobs of a cycle of waits are still alive                    |
| metric_regression     | never from a report: raised when a training attempt ends with a |
|                       | watched metric worse than its baseline's (runtime/regressions)  |

One attempt yields at most one incident, by the first row that matches (budget, stall, timeout,
failure). A cancelled job yields no incident of its own: a cancel is a decision, not a problem.
Tool-call denials for a budget limit yield none either: the attempt's budget_overrun covers them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NoReturn

from corral.domain.agents import AgentEvent, PolicyEvaluation
from corral.domain.governance import (
    Incident,
    IncidentType,
    Reason,
    ReportOutcome,
    RunReport,
    Severity,
)
from corral.domain.models import Attempt, Job
from corral.domain.states import AttemptState, JobState
from corral.policy.prerun import BUDGET_CEILING_LIMIT, PRE_RUN_STAGE, workflow_of

OUTCOME: Mapping[JobState, ReportOutcome] = MappingProxyType(
    {
        JobState.SUCCEEDED: ReportOutcome.SUCCESS,
        JobState.FAILED: ReportOutcome.FAILED,
        JobState.CANCELLED: ReportOutcome.CANCELLED,  # never killed
        JobState.KILLED: ReportOutcome.KILLED,  # the kill switch only
        JobState.TIMED_OUT: ReportOutcome.TIMED_OUT,
        JobState.DEAD_LETTERED: ReportOutcome.DEAD_LETTERED,
        JobState.DENIED: ReportOutcome.DENIED,
    }
)

# The one table of incident severities (low informational, medium degraded,
# high aborted / review recommended, critical security or safety).
SEVERITY: Mapping[IncidentType, Severity] = MappingProxyType(
    {
        IncidentType.STEP_ERROR: Severity.MEDIUM,
        IncidentType.TOOL_ERROR: Severity.LOW,
        IncidentType.TOOL_TIMEOUT: Severity.LOW,
        IncidentType.TOOL_REJECTION: Severity.LOW,
        IncidentType.TIMEOUT: Severity.MEDIUM,
        IncidentType.BUDGET_OVERRUN: Severity.HIGH,
        IncidentType.POLICY_DENIAL: Severity.LOW,
        IncidentType.APPROVAL_REJECTED: Severity.LOW,
        IncidentType.MEMORY_WRITE_FAILED: Severity.MEDIUM,
        IncidentType.KILL_SWITCH_ACTIVATED: Severity.CRITICAL,
        IncidentType.GUARDRAIL_VIOLATION: Severity.HIGH,
        IncidentType.RETRY_EXHAUSTED: Severity.HIGH,
        IncidentType.STALL_DETECTED: Severity.MEDIUM,
        IncidentType.FAILURE: Severity.MEDIUM,
        IncidentType.ANOMALY: Severity.MEDIUM,
        IncidentType.DEADLOCK: Severity.CRITICAL,
        IncidentType.METRIC_REGRESSION: Severity.MEDIUM,
    }
)

# limit_hit values that mean "stopped at a budget" (policy/scopes.py and the engine's ceiling).
BUDGET_LIMITS = frozenset(
    {"token_budget_in", "token_budget_out", "max_tool_calls", BUDGET_CEILING_LIMIT}
)
GUARDRAIL_STAGE = "guardrail"
SUMMARY_MAX = 500  # characters of the summary


class FrozenDict(dict[str, Any]):
    """A dict that refuses every change: what a report's `metrics` and an incident's `context`
    are made of, so a written record cannot be edited in memory either. Still a dict: `json`
    encodes it as one, `dict(x)` copies it, `==` compares it with a plain dict."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("this record is append-only: it cannot be changed")

    __setitem__ = _refuse
    __delitem__ = _refuse
    __ior__ = _refuse
    clear = _refuse
    pop = _refuse
    popitem = _refuse
    setdefault = _refuse
    update = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self),))


def freeze(value: Any) -> Any:
    """A read-only deep copy: mappings become FrozenDicts, lists and tuples tuples."""
    if isinstance(value, Mapping):
        return FrozenDict({str(k): freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """A plain, mutable copy of a frozen `metrics` or `context` (dicts and lists)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [thaw(v) for v in value]
    return value


def _check(job: Job, attempts: Sequence[Attempt], events: Sequence[AgentEvent]) -> None:
    if not job.state.terminal:
        raise ValueError(f"job {job.id} is {job.state.value}, not terminal: no report yet")
    for kind, owner in [("attempt", a.job_id) for a in attempts] + [
        ("agent event", e.job_id) for e in events
    ]:
        if owner != job.id:
            raise ValueError(f"{kind} of job {owner} given for job {job.id}")


def _events_by_attempt(events: Sequence[AgentEvent]) -> dict[int, AgentEvent]:
    latest: dict[int, AgentEvent] = {}
    for e in sorted(events, key=lambda e: e.at):
        latest[e.attempt] = e
    return latest


def _summary(
    job: Job, attempts: Sequence[Attempt], events: Mapping[int, AgentEvent], outcome: ReportOutcome
) -> str:
    for index in sorted(events, reverse=True):
        text = (events[index].final_text or "").strip()
        if text:
            return _clip(text)
    if outcome is not ReportOutcome.SUCCESS:  # a retried error is not what a success did
        errors = [a.error for a in sorted(attempts, key=lambda a: a.index) if a.error]
        last_error = job.last_error or (errors[-1] if errors else None)
        if last_error and last_error.strip():
            return _clip(" ".join(last_error.split()))
    n = len(attempts)
    return f"{outcome.value.replace('_', ' ')} after {n} attempt{'' if n == 1 else 's'}"


def _clip(text: str) -> str:
    return text if len(text) <= SUMMARY_MAX else text[: SUMMARY_MAX - 1].rstrip() + "…"


def build_report(
    job: Job,
    attempts: Sequence[Attempt],
    agent_events: Sequence[AgentEvent],
    *,
    now: float,
    report_id: str,
    attempt_costs: Mapping[int, float] | None = None,
) -> RunReport:
    """The run report of a terminal job (ValueError for a job that is not terminal, or for
    attempts / events of another job). `attempt_costs`: attempt index → the cost its worker
    reported (`AttemptResult.cost_usd`), used where no AgentEvent gives one."""
    _check(job, attempts, agent_events)
    outcome = OUTCOME[job.state]
    events = _events_by_attempt(agent_events)
    costs = attempt_costs or {}
    cost = 0.0
    for index in {a.index for a in attempts} | set(events):
        event_cost = events[index].cost_usd if index in events else None
        cost += event_cost if event_cost is not None else costs.get(index, 0.0)
    tools = {"allowed": 0, "denied": 0}
    for e in events.values():
        for call in e.tool_calls:
            tools["denied" if call.denied else "allowed"] += 1
    outcomes: dict[str, int] = {}
    for a in attempts:
        outcomes[a.state.value.lower()] = outcomes.get(a.state.value.lower(), 0) + 1
    starts = [a.started_at for a in attempts if a.started_at is not None]
    started = min(starts) if starts else None
    ended = max([job.updated_at, *(a.ended_at for a in attempts if a.ended_at is not None)])
    return RunReport(
        id=report_id,
        job_id=job.id,
        role=job.role,
        tenant=job.tenant,
        workflow=workflow_of(job),
        outcome=outcome,
        attempts=len(attempts),
        steps=len(attempts),
        tool_calls=sum(len(e.tool_calls) for e in events.values()),
        tokens_in=sum(e.tokens_in for e in events.values()),
        tokens_out=sum(e.tokens_out for e in events.values()),
        cost_usd=round(cost, 6),
        started_at=started,
        ended_at=ended,
        duration_ms=round((ended - started) * 1000) if started is not None else None,
        summary=_summary(job, attempts, events, outcome),
        created_at=now,
        metrics=freeze(
            {
                "tool_statuses": tools,
                "attempt_outcomes": outcomes,
                "limit_hits": sorted(
                    {a.limit_hit for a in attempts if a.limit_hit}
                    | {e.limit_hit for e in events.values() if e.limit_hit}
                ),
            }
        ),
    )


# ---- incidents --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """A problem a detector saw (the anomaly hook); its severity comes from `SEVERITY`."""

    type: IncidentType = IncidentType.ANOMALY
    message: str
    occurred_at: float
    context: Mapping[str, Any] = field(default_factory=dict)


Detector = Callable[[Job, Sequence[Attempt], Sequence[AgentEvent]], Iterable[Finding]]


def _attempt_finding(a: Attempt, event: AgentEvent | None) -> Finding | None:
    limit = a.limit_hit or (event.limit_hit if event else None)
    error = a.error or (event.error if event else None)
    at = a.ended_at if a.ended_at is not None else a.created_at
    ctx = {
        "attempt": a.index,
        "attempt_id": a.id,
        "state": a.state.value,
        "error": error,
        "exit_code": a.exit_code,
        "signal": a.signal,
        "limit_hit": limit,
    }
    if limit in BUDGET_LIMITS:
        return Finding(
            type=IncidentType.BUDGET_OVERRUN,
            occurred_at=at,
            context=ctx,
            message=f"attempt {a.index} was stopped at its {limit} budget",
        )
    if error and "stall" in error.lower():
        return Finding(
            type=IncidentType.STALL_DETECTED,
            occurred_at=at,
            context=ctx,
            message=f"attempt {a.index} stalled: {error}",
        )
    if a.state is AttemptState.TIMED_OUT:
        return Finding(
            type=IncidentType.TIMEOUT,
            occurred_at=at,
            context=ctx,
            message=f"attempt {a.index} timed out",
        )
    if a.state in (AttemptState.FAILED, AttemptState.LOST):
        what = error or (
            "its process was lost" if a.state is AttemptState.LOST else f"exit code {a.exit_code}"
        )
        return Finding(
            type=IncidentType.FAILURE,
            occurred_at=at,
            context=ctx,
            message=f"attempt {a.index} failed: {what}",
        )
    return None


def _evaluation_finding(e: PolicyEvaluation) -> Finding | None:
    if e.verdict != "deny":
        return None
    ctx = {
        "evaluation_id": e.id,
        "stage": e.stage,
        "subject": e.subject,
        "reason": e.reason,
        "attempt": e.attempt,
    }
    if e.stage == PRE_RUN_STAGE:
        kind = (
            IncidentType.APPROVAL_REJECTED
            if e.reason == Reason.APPROVAL_POLICY_DENY
            else IncidentType.POLICY_DENIAL
        )
        return Finding(
            type=kind,
            occurred_at=e.at,
            context=ctx,
            message=f"pre-run policy denied the run: {e.reason}",
        )
    if e.stage == GUARDRAIL_STAGE or e.reason.startswith("guardrail"):
        return Finding(
            type=IncidentType.GUARDRAIL_VIOLATION,
            occurred_at=e.at,
            context=ctx,
            message=f"guardrail denied {e.subject}: {e.reason}",
        )
    if e.reason in BUDGET_LIMITS:
        return None  # the attempt's budget_overrun reports it
    return Finding(
        type=IncidentType.POLICY_DENIAL,
        occurred_at=e.at,
        context=ctx,
        message=f"{e.subject} denied: {e.reason}",
    )


def _job_findings(
    job: Job, from_attempts: bool, from_evaluations: Sequence[Finding], killed_live: bool
) -> list[Finding]:
    """The job's own incident, unless an attempt's or an evaluation's already explains it."""
    denials = {f.type for f in from_evaluations} & {
        IncidentType.POLICY_DENIAL,
        IncidentType.APPROVAL_REJECTED,
    }
    ctx = {
        "state": job.state.value,
        "error": job.last_error,
        "reason": job.cancel_requested,
        "attempts": job.attempts,
    }
    at = job.updated_at
    out: list[Finding] = []
    if job.state is JobState.KILLED and killed_live:
        out.append(
            Finding(
                type=IncidentType.KILL_SWITCH_ACTIVATED,
                occurred_at=at,
                context=ctx,
                message=f"the kill switch stopped the job: "
                f"{job.cancel_requested or 'no reason recorded'}",
            )
        )
    elif job.state is JobState.DEAD_LETTERED:
        out.append(
            Finding(
                type=IncidentType.RETRY_EXHAUSTED,
                occurred_at=at,
                context=ctx,
                message=f"retries exhausted after {job.attempts} attempts; "
                "the job is in the dead-letter queue",
            )
        )
    elif job.state is JobState.TIMED_OUT and not from_attempts:
        out.append(
            Finding(
                type=IncidentType.TIMEOUT, occurred_at=at, context=ctx, message="the job timed out"
            )
        )
    elif job.state is JobState.FAILED and not from_attempts:
        out.append(
            Finding(
                type=IncidentType.FAILURE,
                occurred_at=at,
                context=ctx,
                message=f"the job failed: {job.last_error or 'no error recorded'}",
            )
        )
    elif job.state is JobState.DENIED and not denials:
        out.append(
            Finding(
                type=IncidentType.POLICY_DENIAL,
                occurred_at=at,
                context=ctx,
                message=f"the job was denied: {job.last_error or 'by policy'}",
            )
        )
    return out


def incidents_for(
    job: Job,
    attempts: Sequence[Attempt],
    agent_events: Sequence[AgentEvent],
    evaluations: Sequence[PolicyEvaluation],
    *,
    now: float,
    report_id: str | None,
    new_id: Callable[[], str],
    detectors: Sequence[Detector] = (),
) -> list[Incident]:
    """The incidents of a terminal job, in order: attempts (by index), policy evaluations (by
    time), detectors' findings, then the job's own (kill, dead letter …). Severity from
    `SEVERITY`; `context` records when it happened (`occurred_at`) and what showed it."""
    _check(job, attempts, agent_events)
    events = _events_by_attempt(agent_events)
    by_attempt = [
        f
        for a in sorted(attempts, key=lambda a: a.index)
        if (f := _attempt_finding(a, events.get(a.index))) is not None
    ]
    for e in evaluations:
        if e.job_id != job.id:
            raise ValueError(f"policy evaluation of job {e.job_id} given for job {job.id}")
    by_evaluation = [
        f
        for e in sorted(evaluations, key=lambda e: (e.at, e.id or 0))
        if (f := _evaluation_finding(e)) is not None
    ]
    detected = [f for detect in detectors for f in detect(job, attempts, agent_events)]
    killed_live = any(a.state is AttemptState.KILLED for a in attempts)
    found = [
        *by_attempt,
        *by_evaluation,
        *detected,
        *_job_findings(job, bool(by_attempt), by_evaluation, killed_live),
    ]
    return [
        Incident(
            id=new_id(),
            report_id=report_id,
            job_id=job.id,
            type=f.type,
            severity=SEVERITY[f.type],
            message=f.message,
            created_at=now,
            context=freeze({**f.context, "occurred_at": f.occurred_at}),
        )
        for f in found
    ]
