"""Retry classification and backoff: a pure decision from an attempt's result."""

from __future__ import annotations

from dataclasses import dataclass

from corral.domain.models import AttemptResult, Job
from corral.domain.settings import RetryPolicy
from corral.domain.states import Fault, JobState, Outcome

# Limits a worker itself stops an attempt at (workers/pump.py: the output cap).
WORKER_LIMITS = frozenset({"output"})


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryInput:
    job: Job  # its `attempts` is the index of the attempt that just ended
    result: AttemptResult
    policy: RetryPolicy
    stop_kind: str | None = None  # "cancel" | "kill" when a stop was requested
    runtime_limit: str | None = None  # the runtime limit the attempt was stopped for
    jitter: float = 1.0  # a uniform sample in [0, 1): full jitter (AWS architecture blog, 2015)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryDecision:
    state: JobState
    retry_at: float | None
    error: str | None
    limit_hit: str | None = None
    retryable: bool = False


def backoff_s(policy: RetryPolicy, attempt: int, jitter: float) -> float:
    """Full jitter: uniform in [0, min(cap, base · 2^(attempt−1)))."""
    return float(jitter * min(policy.cap_s, policy.base_s * 2.0 ** max(0, attempt - 1)))


def retryable(result: AttemptResult, policy: RetryPolicy) -> bool:
    """Is this failure worth another attempt under the role's policy? A configuration fault
    of the worker (a CLI that cannot authenticate, an unknown model) never is."""
    if result.fault is Fault.CONFIG:
        return False
    match result.outcome:
        case Outcome.LOST:
            return policy.retry_lost
        case Outcome.TIMED_OUT:
            return policy.retry_timeouts
        case Outcome.EXITED if result.signal is not None:
            return policy.retry_signals
        case Outcome.EXITED:
            code = result.exit_code
            if code is None or code == 0 or code in policy.never_exit_codes:
                return False
            return policy.retry_exit_codes is None or code in policy.retry_exit_codes
        case _:  # cancelled, killed, spawn errors: trying again cannot help
            return False


def decide(inp: RetryInput, now: float) -> RetryDecision:
    """Where the job goes after an attempt ended."""
    r, job = inp.result, inp.job
    # Stopped by policy (the governor's limits, or the output cap the worker enforced):
    # whatever it printed last, the run is over.
    runtime = inp.runtime_limit or (r.limit_hit if r.limit_hit in WORKER_LIMITS else None)
    if runtime:
        return RetryDecision(
            state=JobState.FAILED,
            retry_at=None,
            error=f"runtime limit reached: {runtime}",
            limit_hit=runtime,
        )
    if r.succeeded:
        return RetryDecision(state=JobState.SUCCEEDED, retry_at=None, error=None)
    error = r.describe()
    if inp.stop_kind or r.outcome in (Outcome.CANCELLED, Outcome.KILLED):
        killed = inp.stop_kind == "kill" or r.outcome is Outcome.KILLED
        return RetryDecision(
            state=JobState.KILLED if killed else JobState.CANCELLED,
            retry_at=None,
            error=job.cancel_requested or error,
            limit_hit=r.limit_hit,
        )
    limit = r.limit_hit or ("max_duration_s" if r.outcome is Outcome.TIMED_OUT else None)
    if not retryable(r, inp.policy):
        final = JobState.TIMED_OUT if r.outcome is Outcome.TIMED_OUT else JobState.FAILED
        return RetryDecision(state=final, retry_at=None, error=error, limit_hit=limit)
    if job.attempts >= job.limits.max_attempts:
        return RetryDecision(
            state=JobState.DEAD_LETTERED,
            retry_at=None,
            limit_hit=limit,
            error=f"{error} (attempt {job.attempts} of "
            f"{job.limits.max_attempts}; retries exhausted)",
            retryable=True,
        )
    delay = backoff_s(inp.policy, job.attempts, inp.jitter)
    return RetryDecision(
        state=JobState.RETRY_WAIT,
        retry_at=now + delay,
        error=error,
        limit_hit=limit,
        retryable=True,
    )
