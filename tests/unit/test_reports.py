"""Run reports and incidents: outcome from the terminal state, sums, the severity table."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import pickle
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from corral.domain.agents import AgentEvent, PolicyEvaluation, ToolCallTrace
from corral.domain.governance import Incident, IncidentType, ReportOutcome, RunReport, Severity
from corral.domain.models import Attempt, Job, JobOptions
from corral.domain.states import ACTIVE, AttemptState, JobState
from corral.policy.reports import (
    OUTCOME,
    SEVERITY,
    Finding,
    build_report,
    freeze,
    incidents_for,
    thaw,
)
from tests.unit.test_retry import job as make_job

NOW = 1_760_000_000.0
A = AttemptState


def job(state: JobState = JobState.SUCCEEDED, **kw: Any) -> Job:
    kw.setdefault("updated_at", 1000.0)
    kw.setdefault("role", "coder")
    kw.setdefault("tenant", "acme")
    return make_job(state=state, **kw)


def attempt(
    index: int,
    state: AttemptState = A.SUCCEEDED,
    start: float | None = None,
    end: float | None = None,
    **kw: Any,
) -> Attempt:
    start = 100.0 * index if start is None else start
    return Attempt(
        id=f"a{index}",
        job_id=kw.pop("job_id", "j1"),
        index=index,
        state=state,
        permit_id=f"p{index}",
        deadline_at=start + 3600,
        created_at=start - 1,
        dir="/tmp/x",
        engine_id="e",
        started_at=start,
        ended_at=start + 50 if end is None else end,
        **kw,
    )


def event(index: int, tools: Sequence[bool] = (), **kw: Any) -> AgentEvent:
    """`tools`: one entry per tool call, True when it was denied."""
    kw.setdefault("at", 100.0 * index + 50)
    return AgentEvent(
        event_id=f"e{index}-{kw['at']}",
        job_id="j1",
        attempt=index,
        role="coder",
        worker="claude-code",
        tenant="acme",
        tool_calls=tuple(ToolCallTrace(tool="Bash", denied=d) for d in tools),
        **kw,
    )


def evaluation(
    reason: str, stage: str = "tool_call", verdict: str = "deny", at: float = 120.0, **kw: Any
) -> PolicyEvaluation:
    return PolicyEvaluation(
        at=at,
        job_id=kw.pop("job_id", "j1"),
        attempt=1,
        stage=stage,
        subject="Bash",
        verdict=verdict,
        reason=reason,
        **kw,
    )  # type: ignore[arg-type]


def report(
    j: Job, attempts: Sequence[Attempt] = (), events: Sequence[AgentEvent] = (), **kw: Any
) -> RunReport:
    return build_report(j, attempts, events, now=NOW, report_id="r1", **kw)


def incidents(
    j: Job,
    attempts: Sequence[Attempt] = (),
    events: Sequence[AgentEvent] = (),
    evaluations: Sequence[PolicyEvaluation] = (),
    **kw: Any,
) -> list[Incident]:
    ids = (f"i{n}" for n in itertools.count(1))
    return incidents_for(
        j, attempts, events, evaluations, now=NOW, report_id="r1", new_id=lambda: next(ids), **kw
    )


# ---- outcome ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "outcome"),
    [
        (JobState.SUCCEEDED, ReportOutcome.SUCCESS),
        (JobState.FAILED, ReportOutcome.FAILED),
        (JobState.CANCELLED, ReportOutcome.CANCELLED),
        (JobState.KILLED, ReportOutcome.KILLED),
        (JobState.TIMED_OUT, ReportOutcome.TIMED_OUT),
        (JobState.DEAD_LETTERED, ReportOutcome.DEAD_LETTERED),
        (JobState.DENIED, ReportOutcome.DENIED),
    ],
)
def test_outcome_is_the_terminal_state(state: JobState, outcome: ReportOutcome) -> None:
    assert report(job(state)).outcome is outcome
    assert OUTCOME[state] is outcome


@pytest.mark.parametrize("state", sorted(ACTIVE))
def test_no_report_for_a_job_that_has_not_ended(state: JobState) -> None:
    with pytest.raises(ValueError, match="not terminal"):
        report(job(state))
    with pytest.raises(ValueError, match="not terminal"):
        incidents(job(state))


def test_a_cancel_is_never_a_kill() -> None:
    """A design that writes a kill-switch deny row for every cancel reports cancels as kills."""
    j = job(JobState.CANCELLED, cancel_requested="operator", stop_kind="cancel")
    attempts = [attempt(1, A.CANCELLED)]
    kill_row = evaluation("kill_switch_active", stage="pre_run", at=50.0)
    assert report(j, attempts).outcome is ReportOutcome.CANCELLED
    found = incidents(j, attempts, evaluations=[kill_row])
    assert IncidentType.KILL_SWITCH_ACTIVATED not in {i.type for i in found}


def test_attempts_or_events_of_another_job_are_refused() -> None:
    with pytest.raises(ValueError):
        report(job(), [attempt(1, job_id="j2")])
    with pytest.raises(ValueError):
        report(job(), [], [dataclasses.replace(event(1), job_id="j2")])
    with pytest.raises(ValueError):
        incidents(job(), evaluations=[evaluation("out_of_scope", job_id="j2")])


# ---- counts, duration, summary, metrics -------------------------------------------------------


def test_report_sums_agent_events_and_falls_back_to_attempt_cost() -> None:
    j = job(
        JobState.SUCCEEDED,
        options=JobOptions(workflow="nightly"),
        updated_at=400.0,
        last_error="boom",
    )
    attempts = [
        attempt(1, A.FAILED, error="boom"),
        attempt(2, A.FAILED, error="bang"),
        attempt(3, A.SUCCEEDED),
    ]
    events = [
        event(1, tools=[False, False, True], tokens_in=100, tokens_out=10, cost_usd=0.5),
        event(2, tools=[False], tokens_in=50, tokens_out=5, cost_usd=None),  # cost → attempt's
        event(
            3,
            tools=[False, True],
            tokens_in=70,
            tokens_out=7,
            cost_usd=0.25,
            final_text="  Done: 3 files fixed.\n  ",
        ),
    ]
    r = report(j, attempts, events, attempt_costs={2: 0.125, 3: 99.0})
    assert (r.attempts, r.steps, r.tool_calls, r.tokens_in, r.tokens_out) == (3, 3, 6, 220, 22)
    assert r.cost_usd == 0.875  # 0.5 + 0.125 (no event cost) + 0.25 (event cost wins)
    assert (r.started_at, r.ended_at, r.duration_ms) == (100.0, 400.0, 300_000)
    assert r.summary == "Done: 3 files fixed."
    assert r.workflow == "nightly" and (r.role, r.tenant, r.job_id) == ("coder", "acme", "j1")
    assert (r.id, r.created_at) == ("r1", NOW)
    assert thaw(r.metrics) == {
        "tool_statuses": {"allowed": 4, "denied": 2},
        "attempt_outcomes": {"failed": 2, "succeeded": 1},
        "limit_hits": [],
    }


def test_a_command_job_counts_attempt_costs() -> None:
    r = report(
        job(JobState.FAILED), [attempt(1, A.FAILED, error="exit 3")], attempt_costs={1: 0.02}
    )
    assert (r.tool_calls, r.tokens_in, r.cost_usd) == (0, 0, 0.02)


def test_a_later_event_for_one_attempt_replaces_an_earlier_one() -> None:
    events = [event(1, tokens_in=10, at=150.0), event(1, tokens_in=99, at=160.0)]
    assert report(job(), [attempt(1)], events).tokens_in == 99


def test_duration_runs_to_the_last_attempt_end_when_the_job_row_is_older() -> None:
    r = report(job(updated_at=10.0), [attempt(1, start=100.0, end=175.5)])
    assert (r.ended_at, r.duration_ms) == (175.5, 75_500)


def test_a_job_that_never_ran() -> None:
    r = report(job(JobState.DENIED, updated_at=42.0, last_error=None))
    assert (r.attempts, r.started_at, r.ended_at, r.duration_ms) == (0, None, 42.0, None)
    assert r.summary == "denied after 0 attempts"


@pytest.mark.parametrize(
    ("events", "attempts", "last_error", "summary"),
    [
        ([event(1, final_text="first"), event(2, final_text="  ")], [], None, "first"),
        ([event(1)], [attempt(1, A.FAILED, error="exit 2")], None, "exit 2"),
        (
            [],
            [attempt(1, A.FAILED, error="exit 2")],
            "dependency j0 failed",
            "dependency j0 failed",
        ),
        ([], [attempt(1, A.TIMED_OUT)], None, "timed out after 1 attempt"),
        ([event(1, final_text="x" * 2000)], [], None, "x" * 499 + "…"),
        (
            [],
            [attempt(1, A.FAILED, error="exit 2"), attempt(2)],
            "exit 2",
            "success after 2 attempts",
        ),  # an earlier attempt's error is not what the job did
        ([], [], "Traceback:\n  line 3\n", "Traceback: line 3"),  # one line
    ],
)
def test_summary(
    events: list[AgentEvent], attempts: list[Attempt], last_error: str | None, summary: str
) -> None:
    state = (
        JobState.TIMED_OUT
        if summary.startswith("timed")
        else JobState.SUCCEEDED
        if summary.startswith("success")
        else JobState.FAILED
    )
    r = report(job(state, last_error=last_error), attempts, events)
    assert r.summary == summary


def test_report_and_incidents_are_frozen() -> None:
    r = report(job(), [attempt(1)])
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.outcome = ReportOutcome.KILLED  # type: ignore[misc]
    with pytest.raises(TypeError):
        r.metrics["tool_statuses"]["allowed"] = 7
    [i] = incidents(job(JobState.DEAD_LETTERED))
    with pytest.raises(dataclasses.FrozenInstanceError):
        i.severity = Severity.LOW  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        i.message = "nothing happened"  # type: ignore[misc]
    with pytest.raises(TypeError):
        i.context["state"] = "SUCCEEDED"  # type: ignore[index]
    assert thaw(i.context)["state"] == "DEAD_LETTERED"


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.__setitem__("a", 2),
        lambda d: d.__delitem__("a"),
        lambda d: d.clear(),
        lambda d: d.pop("a"),
        lambda d: d.popitem(),
        lambda d: d.setdefault("c", 1),
        lambda d: d.update(a=3),
        lambda d: d["b"].__setitem__("x", 0),
    ],
)
def test_frozen_records_refuse_every_change(change: Any) -> None:
    d = freeze({"a": 1, "b": {"x": [1, 2]}})
    with pytest.raises(TypeError):
        change(d)
    assert d == {"a": 1, "b": {"x": (1, 2)}}


def test_frozen_records_still_serialise_and_copy() -> None:
    r = report(job(), [attempt(1)], [event(1, tools=[True])])
    assert json.loads(json.dumps(r.metrics)) == thaw(r.metrics)
    assert json.loads(json.dumps(dict(r.metrics)))["tool_statuses"] == {"allowed": 0, "denied": 1}
    assert copy.deepcopy(r) == r and pickle.loads(pickle.dumps(r)) == r
    assert dataclasses.asdict(r)["metrics"]["tool_statuses"] == {"allowed": 0, "denied": 1}


# ---- incidents --------------------------------------------------------------------------------


def test_the_severity_table_covers_every_type() -> None:
    assert set(SEVERITY) == set(IncidentType)
    assert {
        t: SEVERITY[t]
        for t in (
            IncidentType.FAILURE,
            IncidentType.TIMEOUT,
            IncidentType.BUDGET_OVERRUN,
            IncidentType.POLICY_DENIAL,
            IncidentType.GUARDRAIL_VIOLATION,
            IncidentType.KILL_SWITCH_ACTIVATED,
            IncidentType.RETRY_EXHAUSTED,
            IncidentType.STALL_DETECTED,
            IncidentType.ANOMALY,
        )
    } == {
        IncidentType.FAILURE: Severity.MEDIUM,
        IncidentType.TIMEOUT: Severity.MEDIUM,
        IncidentType.BUDGET_OVERRUN: Severity.HIGH,
        IncidentType.POLICY_DENIAL: Severity.LOW,
        IncidentType.GUARDRAIL_VIOLATION: Severity.HIGH,
        IncidentType.KILL_SWITCH_ACTIVATED: Severity.CRITICAL,
        IncidentType.RETRY_EXHAUSTED: Severity.HIGH,
        IncidentType.STALL_DETECTED: Severity.MEDIUM,
        IncidentType.ANOMALY: Severity.MEDIUM,
    }


IT = IncidentType
ScenarioRow = tuple[
    str, JobState, list[Attempt], list[AgentEvent], list[PolicyEvaluation], list[IncidentType]
]
SCENARIOS: list[ScenarioRow] = [
    ("clean success", JobState.SUCCEEDED, [attempt(1)], [], [], []),
    (
        "success after a failure",
        JobState.SUCCEEDED,
        [attempt(1, A.FAILED, exit_code=1), attempt(2)],
        [],
        [],
        [IT.FAILURE],
    ),
    (
        "lost then failed",
        JobState.FAILED,
        [attempt(1, A.LOST), attempt(2, A.FAILED, error="exit 3")],
        [],
        [],
        [IT.FAILURE, IT.FAILURE],
    ),
    ("failed without an attempt (dependency)", JobState.FAILED, [], [], [], [IT.FAILURE]),
    (
        "timed out",
        JobState.TIMED_OUT,
        [attempt(1, A.TIMED_OUT, limit_hit="max_duration_s")],
        [],
        [],
        [IT.TIMEOUT],
    ),
    ("timed out, no attempt row", JobState.TIMED_OUT, [], [], [], [IT.TIMEOUT]),
    (
        "retried timeouts then dead-lettered",
        JobState.DEAD_LETTERED,
        [attempt(1, A.TIMED_OUT), attempt(2, A.FAILED)],
        [],
        [],
        [IT.TIMEOUT, IT.FAILURE, IT.RETRY_EXHAUSTED],
    ),
    (
        "token budget",
        JobState.FAILED,
        [attempt(1, A.CANCELLED, limit_hit="token_budget_out")],
        [],
        [evaluation("token_budget_out")],
        [IT.BUDGET_OVERRUN],
    ),
    (
        "tool-call storm",
        JobState.SUCCEEDED,
        [attempt(1, limit_hit="max_tool_calls")],
        [],
        [evaluation("max_tool_calls")],
        [IT.BUDGET_OVERRUN],
    ),
    (
        "budget ceiling crossed mid-run",
        JobState.FAILED,
        [attempt(1, A.CANCELLED, limit_hit="budget_ceiling")],
        [],
        [],
        [IT.BUDGET_OVERRUN],
    ),
    (
        "limit seen only in the agent event",
        JobState.FAILED,
        [attempt(1, A.FAILED)],
        [event(1, limit_hit="token_budget_in")],
        [],
        [IT.BUDGET_OVERRUN],
    ),
    (
        "stalled",
        JobState.DEAD_LETTERED,
        [attempt(1, A.FAILED, error="stalled: no output for 600 s")],
        [],
        [],
        [IT.STALL_DETECTED, IT.RETRY_EXHAUSTED],
    ),
    (
        "out-of-scope tool call",
        JobState.SUCCEEDED,
        [attempt(1)],
        [],
        [evaluation("allowed", verdict="allow"), evaluation("out_of_scope")],
        [IT.POLICY_DENIAL],
    ),
    (
        "guardrail by stage",
        JobState.SUCCEEDED,
        [attempt(1)],
        [],
        [evaluation("kubectl_delete_running_job", stage="guardrail")],
        [IT.GUARDRAIL_VIOLATION],
    ),
    (
        "guardrail by reason",
        JobState.SUCCEEDED,
        [attempt(1)],
        [],
        [evaluation("guardrail_sql_drop")],
        [IT.GUARDRAIL_VIOLATION],
    ),
    (
        "pre-run deny",
        JobState.DENIED,
        [],
        [],
        [evaluation("max_parallel_runs_exceeded", stage="pre_run")],
        [IT.POLICY_DENIAL],
    ),
    (
        "pre-run allow is no incident",
        JobState.SUCCEEDED,
        [attempt(1)],
        [],
        [evaluation("allowed", stage="pre_run", verdict="allow")],
        [],
    ),
    (
        "approval denied",
        JobState.DENIED,
        [],
        [],
        [evaluation("approval_policy_deny", stage="pre_run")],
        [IT.APPROVAL_REJECTED],
    ),
    ("denied without an evaluation row", JobState.DENIED, [], [], [], [IT.POLICY_DENIAL]),
    (
        "killed while running",
        JobState.KILLED,
        [attempt(1, A.KILLED)],
        [],
        [],
        [IT.KILL_SWITCH_ACTIVATED],
    ),
    ("killed in the queue: no attempt was running", JobState.KILLED, [], [], [], []),
    ("cancelled", JobState.CANCELLED, [attempt(1, A.CANCELLED)], [], [], []),
    ("cancelled while queued", JobState.CANCELLED, [], [], [], []),
]


@pytest.mark.parametrize(
    ("state", "attempts", "events", "evaluations", "expected"),
    [s[1:] for s in SCENARIOS],
    ids=[s[0] for s in SCENARIOS],
)
def test_incidents(
    state: JobState,
    attempts: list[Attempt],
    events: list[AgentEvent],
    evaluations: list[PolicyEvaluation],
    expected: list[IncidentType],
) -> None:
    found = incidents(
        job(
            state,
            cancel_requested="kill switch ks1: incident 7" if state is JobState.KILLED else None,
        ),
        attempts,
        events,
        evaluations,
    )
    assert [i.type for i in found] == expected
    for n, i in enumerate(found, 1):
        assert i.severity is SEVERITY[i.type]
        assert (i.id, i.report_id, i.job_id, i.created_at) == (f"i{n}", "r1", "j1", NOW)
        assert i.message and "\n" not in i.message
        assert "occurred_at" in i.context and i.resolves is None


def test_kill_incident_is_critical_and_says_why() -> None:
    [i] = incidents(
        job(JobState.KILLED, cancel_requested="kill switch ks1: incident 7"), [attempt(1, A.KILLED)]
    )
    assert (i.type, i.severity) == (IncidentType.KILL_SWITCH_ACTIVATED, Severity.CRITICAL)
    assert "incident 7" in i.message and i.context["occurred_at"] == 1000.0


def test_attempt_incident_context() -> None:
    [i] = incidents(
        job(JobState.SUCCEEDED), [attempt(1, A.FAILED, exit_code=2, error=None), attempt(2)]
    )
    assert thaw(i.context) == {
        "attempt": 1,
        "attempt_id": "a1",
        "state": "FAILED",
        "error": None,
        "exit_code": 2,
        "signal": None,
        "limit_hit": None,
        "occurred_at": 150.0,
    }
    assert i.message == "attempt 1 failed: exit code 2"


def test_anomaly_detectors_are_a_hook() -> None:
    def detect(
        j: Job, attempts: Sequence[Attempt], events: Sequence[AgentEvent]
    ) -> Iterable[Finding]:
        if sum(e.tokens_out for e in events) > 1000:
            yield Finding(
                message="output tokens 10× the role's median",
                occurred_at=j.updated_at,
                context={"tokens_out": 5000},
            )

    found = incidents(
        job(JobState.SUCCEEDED), [attempt(1)], [event(1, tokens_out=5000)], detectors=[detect]
    )
    assert [(i.type, i.severity) for i in found] == [(IncidentType.ANOMALY, Severity.MEDIUM)]
    assert thaw(found[0].context) == {"tokens_out": 5000, "occurred_at": 1000.0}
