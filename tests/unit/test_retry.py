"""Retry classification and backoff, table-tested (scheduler/retry.py is a pure function)."""

from __future__ import annotations

import pytest

from corral.domain.models import AttemptResult, Job, JobOptions, Limits
from corral.domain.settings import RetryPolicy
from corral.domain.states import DedupMode, Fault, JobState, Outcome
from corral.scheduler.retry import RetryInput, backoff_s, decide, retryable

NOW = 1000.0


def job(attempts: int = 1, max_attempts: int = 4, **kw: object) -> Job:
    base = dict(
        id="j1",
        state=JobState.RUNNING,
        role="r",
        worker="command",
        env_name="local",
        priority=2,
        tenant="t",
        command=("x",),
        prompt=None,
        cwd=None,
        env={},
        options=JobOptions(),
        limits=Limits(max_attempts=max_attempts),
        key=None,
        dedup=DedupMode.COALESCE,
        workspace=None,
        parent_id=None,
        depth=0,
        created_at=0.0,
        updated_at=0.0,
        sort_at=0.0,
        attempts=attempts,
    )
    base.update(kw)
    return Job(**base)  # type: ignore[arg-type]


def res(
    outcome: Outcome = Outcome.EXITED,
    code: int | None = 1,
    sig: int | None = None,
    fault: Fault | None = None,
) -> AttemptResult:
    return AttemptResult(outcome=outcome, exit_code=code, signal=sig, fault=fault)


DEFAULT = RetryPolicy(base_s=2, cap_s=60)


@pytest.mark.parametrize(
    ("result", "policy", "expected"),
    [
        (res(code=1), DEFAULT, True),
        (res(code=127), DEFAULT, False),  # not found: trying again cannot help
        (res(code=126), DEFAULT, False),
        (res(code=None, sig=9), DEFAULT, True),
        (res(code=None, sig=9), RetryPolicy(retry_signals=False), False),
        (res(Outcome.LOST, None), DEFAULT, True),
        (res(Outcome.LOST, None), RetryPolicy(retry_lost=False), False),
        (res(Outcome.TIMED_OUT, None), DEFAULT, False),
        (res(Outcome.TIMED_OUT, None), RetryPolicy(retry_timeouts=True), True),
        (res(Outcome.CANCELLED, None), DEFAULT, False),
        (res(Outcome.KILLED, None), DEFAULT, False),
        (res(Outcome.SPAWN_ERROR, 127), DEFAULT, False),
        (res(code=75), RetryPolicy(retry_exit_codes=frozenset({75})), True),
        (res(code=1), RetryPolicy(retry_exit_codes=frozenset({75})), False),
        (res(code=0), DEFAULT, False),
        (res(code=1, fault=Fault.WORKER), DEFAULT, True),  # a model API 5xx: worth another try
        (res(code=1, fault=Fault.CONFIG), DEFAULT, False),  # not logged in: never retried
        (res(Outcome.LOST, None, fault=Fault.CONFIG), DEFAULT, False),
    ],
)
def test_retryable(result: AttemptResult, policy: RetryPolicy, expected: bool) -> None:
    assert retryable(result, policy) is expected


@pytest.mark.parametrize(
    ("inp", "state", "retry_at", "limit"),
    [
        (RetryInput(job=job(), result=res(code=0), policy=DEFAULT), JobState.SUCCEEDED, None, None),
        (
            RetryInput(job=job(1), result=res(), policy=DEFAULT, jitter=0.5),
            JobState.RETRY_WAIT,
            NOW + 1.0,
            None,
        ),
        (
            RetryInput(job=job(3), result=res(), policy=DEFAULT, jitter=0.5),
            JobState.RETRY_WAIT,
            NOW + 4.0,
            None,
        ),
        (RetryInput(job=job(4), result=res(), policy=DEFAULT), JobState.DEAD_LETTERED, None, None),
        (RetryInput(job=job(1), result=res(code=127), policy=DEFAULT), JobState.FAILED, None, None),
        (
            RetryInput(job=job(1), result=res(Outcome.TIMED_OUT, None), policy=DEFAULT),
            JobState.TIMED_OUT,
            None,
            "max_duration_s",
        ),
        (
            RetryInput(
                job=job(1),
                result=res(Outcome.TIMED_OUT, None),
                policy=RetryPolicy(retry_timeouts=True, base_s=1),
                jitter=0.0,
            ),
            JobState.RETRY_WAIT,
            NOW,
            "max_duration_s",
        ),
        (
            RetryInput(job=job(1), result=res(code=1), policy=DEFAULT, stop_kind="cancel"),
            JobState.CANCELLED,
            None,
            None,
        ),
        (
            RetryInput(
                job=job(1), result=res(Outcome.CANCELLED, None), policy=DEFAULT, stop_kind="kill"
            ),
            JobState.KILLED,
            None,
            None,
        ),
        (
            RetryInput(job=job(1), result=res(code=0), policy=DEFAULT, stop_kind="cancel"),
            JobState.SUCCEEDED,
            None,
            None,
        ),  # it finished before the stop reached it
    ],
)
def test_decide(
    inp: RetryInput, state: JobState, retry_at: float | None, limit: str | None
) -> None:
    d = decide(inp, NOW)
    assert (d.state, d.retry_at, d.limit_hit) == (state, retry_at, limit)


def test_dead_letter_says_why() -> None:
    d = decide(RetryInput(job=job(4), result=res(code=3), policy=DEFAULT), NOW)
    assert d.error == "exited with code 3 (attempt 4 of 4; retries exhausted)"


@pytest.mark.parametrize("attempt", range(1, 12))
def test_backoff_is_full_jitter_under_an_exponential_cap(attempt: int) -> None:
    ceiling = min(60, 2 * 2 ** (attempt - 1))
    assert backoff_s(DEFAULT, attempt, 0.0) == 0.0
    assert backoff_s(DEFAULT, attempt, 0.999) == pytest.approx(0.999 * ceiling)
