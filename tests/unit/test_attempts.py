"""The core's own bounds on a job's attempts (max attempts, per-attempt timeout, the retry budget
across time and cost): a pure decision, tabled, then the same through the Core."""

from __future__ import annotations

import pytest

from corral.core.attempts import AttemptLedger, JobAttempts, deadline, decide
from corral.core.permits import (
    ATTEMPT_REPEATED,
    MAX_ATTEMPTS,
    RETRY_BUDGET_EXHAUSTED,
    TIMEOUT_TOO_LONG,
)
from corral.core.state import CoreState
from corral.domain.errors import InvalidRequest, NotFound
from corral.domain.models import Claimed, Limits
from corral.domain.settings import RetryBudget, RoleSpec, TenantSpec
from tests.unit.test_permits import (
    NOW,
    _attempt,
    failed,
    granted,
    make_core,
    ok,
    settings,
)
from tests.unit.test_retry import job

NONE = RetryBudget()


def seen(last: int = 1, first_at: float = NOW, cost: float = 0.0) -> JobAttempts:
    return JobAttempts(job_id="j1", first_at=first_at, last_index=last, started=last, cost_usd=cost)


@pytest.mark.parametrize(
    ("index", "max_attempts", "known", "budget", "now", "reason"),
    [
        (1, 4, None, NONE, NOW, None),
        (4, 4, seen(3), NONE, NOW, None),
        (5, 4, seen(4), NONE, NOW, MAX_ATTEMPTS),
        (5, 2, None, NONE, NOW, MAX_ATTEMPTS),  # a fresh core still holds the job's own bound
        (3, 10, None, RetryBudget(max_attempts=2), NOW, MAX_ATTEMPTS),  # the role's ceiling
        (2, 10, None, RetryBudget(max_attempts=2), NOW, None),
        (1, 4, seen(1), NONE, NOW, ATTEMPT_REPEATED),  # asking for attempt 1 again and again
        (2, 4, seen(3), NONE, NOW, ATTEMPT_REPEATED),
        (1, 4, None, RetryBudget(max_timeout_s=10), NOW, TIMEOUT_TOO_LONG),  # job asks 30 s
        (1, 4, None, RetryBudget(max_timeout_s=30), NOW, None),
        (2, 4, seen(1), RetryBudget(window_s=60), NOW + 59.9, None),
        (2, 4, seen(1), RetryBudget(window_s=60), NOW + 60, RETRY_BUDGET_EXHAUSTED),
        (1, 4, None, RetryBudget(window_s=60), NOW + 1e6, None),  # the window starts with attempt 1
        (2, 4, seen(1, cost=0.99), RetryBudget(cost_usd=1.0), NOW, None),
        (2, 4, seen(1, cost=1.0), RetryBudget(cost_usd=1.0), NOW, RETRY_BUDGET_EXHAUSTED),
    ],
)
def test_attempt_bounds(
    index: int,
    max_attempts: int,
    known: JobAttempts | None,
    budget: RetryBudget,
    now: float,
    reason: str | None,
) -> None:
    j = job(id="j1", limits=Limits(max_attempts=max_attempts, timeout_s=30.0))
    r = decide(j, index, known, budget, now)
    assert (r.reason if r else None) == reason
    assert r is None or r.final, "asking again cannot help: the scheduler must stop asking"


@pytest.mark.parametrize(
    ("known", "budget", "expected"),
    [
        (None, NONE, NOW + 30),
        (None, RetryBudget(window_s=10), NOW + 10),
        (seen(1, first_at=NOW - 55), RetryBudget(window_s=60), NOW + 5),
        (seen(1, first_at=NOW - 5), RetryBudget(window_s=600), NOW + 30),
    ],
)
def test_a_permit_deadline_never_passes_the_time_window(
    known: JobAttempts | None, budget: RetryBudget, expected: float
) -> None:
    j = job(id="j1", limits=Limits(timeout_s=30.0))
    assert deadline(j, known, budget, NOW) == expected


def test_the_core_counts_attempts_itself_whatever_index_it_is_asked_for() -> None:
    core, events, _ = make_core()
    j = job(id="j1", role="r", limits=Limits(max_attempts=2))
    p = granted(core, j, attempt=1)
    core.launch(Claimed(job=j, attempt=_attempt(p, j), permit=p), NOW)
    core.complete(p, j, failed(), NOW + 1)
    again = core.request_permit(j, 1, NOW + 2)  # a scheduler retrying "attempt 1" forever
    assert getattr(again, "reason", None) == ATTEMPT_REPEATED
    past = core.request_permit(j, 5, NOW + 2)
    assert getattr(past, "reason", None) == MAX_ATTEMPTS and getattr(past, "final", False)
    assert "attempt 5 of job j1 is past its max_attempts 2" in getattr(past, "message", "")
    assert [e.reason for e in events if e.kind == "rejection"] == [ATTEMPT_REPEATED, MAX_ATTEMPTS]
    p2 = granted(core, j, NOW + 3, attempt=2)
    assert p2.attempt_index == 2


def test_a_role_retry_budget_of_cost_stops_the_next_attempt() -> None:
    s = settings(
        roles={
            "r": RoleSpec(
                name="r", concurrency=10, retry_budget=RetryBudget(cost_usd=1.0, window_s=3600)
            )
        }
    )
    core, _, _ = make_core(s)
    j = job(id="j1", role="r", limits=Limits(max_attempts=10, timeout_s=7200))
    for i, cost in enumerate((0.4, 0.7), start=1):
        p = granted(core, j, NOW + i, attempt=i)
        assert p.deadline_at == (NOW + 1) + 3600, "clamped to the window of attempt 1"
        assert p.granted["retry_budget"].startswith("window_end=")
        core.launch(Claimed(job=j, attempt=_attempt(p, j), permit=p), NOW + i)
        core.complete(p, j, failed(cost=cost), NOW + i)
    r = core.request_permit(j, 3, NOW + 10)
    assert getattr(r, "reason", None) == RETRY_BUDGET_EXHAUSTED
    assert "cost $1.1 of its $1" in getattr(r, "message", "")


def test_cost_reported_for_a_running_attempt_is_charged_and_added_to_its_result() -> None:
    s = settings(tenants={"t": TenantSpec(name="t", cost_allowance_usd=2.0)})
    core, _, _ = make_core(s)
    j = job(id="j1", role="r")
    p = granted(core, j)
    core.launch(Claimed(job=j, attempt=_attempt(p, j), permit=p), NOW)
    charged = core.report_cost("j1", 0.25, NOW + 1)
    assert charged["job_cost_usd"] == 0.25 and charged["tenant_remaining_usd"] == 1.75
    result = core.complete(p, j, failed(cost=0.5), NOW + 2)
    assert result.cost_usd == 0.75
    assert core.costs.spent("t", NOW + 2) == 0.75
    late = core.report_cost("j1", 0.05, NOW + 3)  # billed after the attempt ended
    assert late["job_cost_usd"] == pytest.approx(0.8) and late["tenant"] == "t"


def test_reporting_cost_for_a_job_the_core_never_saw_is_an_error() -> None:
    core, _, _ = make_core()
    with pytest.raises(NotFound, match="job nope"):
        core.report_cost("nope", 1.0, NOW)
    granted(core, job(id="j1", role="r"))
    with pytest.raises(InvalidRequest, match="finite"):
        core.report_cost("j1", float("nan"), NOW)


def test_the_counts_survive_a_core_restart_through_its_state() -> None:
    core, _, _ = make_core()
    j = job(id="j1", role="r")
    p = granted(core, j)
    core.launch(Claimed(job=j, attempt=_attempt(p, j), permit=p), NOW)
    core.complete(p, j, ok(), NOW + 1)
    state = CoreState.from_dict(core.state().to_dict())
    fresh, _, _ = make_core()
    fresh.restore(state)
    assert getattr(fresh.request_permit(j, 1, NOW + 2), "reason", None) == ATTEMPT_REPEATED


def test_the_ledger_forgets_the_least_recently_active_jobs_first() -> None:
    ledger = AttemptLedger(keep=2)
    for name in ("a", "b", "c"):
        ledger.started(name, 1, NOW)
    ledger.charge("b", 1.0)
    ledger.started("d", 1, NOW)
    assert [e.job_id for e in ledger.export()] == ["b", "d"]
