"""The core's own count of a job's attempts: max attempts, the per-attempt timeout and the retry
budget across time and cost, which no scheduler policy can override
(docs/reference/core-protocol.md, "What an attempt may be").

The scheduler says which attempt it asks a permit for; the core does not take its word for how
many ran. It remembers, per job, the attempts it started (the highest index, when the first
started) and what they cost, and refuses a permit for an attempt that is past the job's
`max_attempts` (or the role's ceiling), that it already started, whose timeout is past the role's
ceiling, or that would start after the job's attempts used up their time window or their cost.
All these refusals are final: asking again cannot succeed. The deadline of a permit is never
later than the end of the job's time window. tests/unit/test_attempts.py tables the decisions.

What is remembered lives as long as the core (bounded to the most recently active jobs) and is
part of `CoreState`, so a scheduler that restores a restarted core's state keeps the counts; a
core started afresh knows nothing of earlier attempts and counts from the first it sees.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from corral.core.permits import (
    ATTEMPT_REPEATED,
    MAX_ATTEMPTS,
    RETRY_BUDGET_EXHAUSTED,
    TIMEOUT_TOO_LONG,
    Rejected,
)
from corral.domain.models import Job
from corral.domain.settings import RetryBudget

KEEP_JOBS = 65_536  # jobs remembered; the least recently active are forgotten first


@dataclass(frozen=True, slots=True, kw_only=True)
class JobAttempts:
    """What the core knows of one job's attempts."""

    job_id: str
    first_at: float  # when the first attempt this core saw started
    last_index: int  # the highest attempt index started
    started: int  # attempts started (as seen by this core)
    cost_usd: float = 0.0  # what they cost: results and reports


def decide(
    job: Job, index: int, seen: JobAttempts | None, budget: RetryBudget, now: float
) -> Rejected | None:
    """Why attempt `index` of `job` may not have a permit, or None (a pure decision)."""
    cap = job.limits.max_attempts
    if budget.max_attempts is not None and budget.max_attempts < cap:
        cap = budget.max_attempts
    if index > cap:
        return Rejected(
            reason=MAX_ATTEMPTS,
            final=True,
            message=f"attempt {index} of job {job.id} is past its max_attempts "
            f"{cap}" + _ceiling(budget.max_attempts, cap, job.role),
        )
    if seen is not None and index <= seen.last_index:
        return Rejected(
            reason=ATTEMPT_REPEATED,
            final=True,
            message=f"attempt {index} of job {job.id} was already started here "
            f"(the last was attempt {seen.last_index}); a permit is for "
            "a new attempt",
        )
    limit = budget.max_timeout_s
    if limit is not None and job.limits.timeout_s > limit:
        return Rejected(
            reason=TIMEOUT_TOO_LONG,
            final=True,
            message=f"job {job.id} asks {job.limits.timeout_s:g}s per attempt; role "
            f"{job.role} allows at most {limit:g}s "
            "(retry_budget.max_timeout_s)",
        )
    return _spent(job, seen, budget, now)


def _ceiling(ceiling: int | None, cap: int, role: str) -> str:
    return f" (role {role}'s retry_budget.max_attempts)" if ceiling == cap else ""


def _spent(job: Job, seen: JobAttempts | None, budget: RetryBudget, now: float) -> Rejected | None:
    if seen is None:
        return None
    if budget.window_s is not None and now >= seen.first_at + budget.window_s:
        return Rejected(
            reason=RETRY_BUDGET_EXHAUSTED,
            final=True,
            message=f"job {job.id}'s attempts have had their {budget.window_s:g}s "
            f"(retry_budget.window_s of role {job.role}, counted from its "
            "first attempt)",
        )
    if budget.cost_usd is not None and seen.cost_usd >= budget.cost_usd:
        return Rejected(
            reason=RETRY_BUDGET_EXHAUSTED,
            final=True,
            message=f"job {job.id}'s {seen.started} attempt(s) cost "
            f"${seen.cost_usd:.4g} of its ${budget.cost_usd:g} "
            f"(retry_budget.cost_usd of role {job.role})",
        )
    return None


def deadline(job: Job, seen: JobAttempts | None, budget: RetryBudget, now: float) -> float:
    """The permit's deadline: the per-attempt timeout, never past the end of the time window."""
    at = now + job.limits.timeout_s
    if budget.window_s is not None:
        start = seen.first_at if seen is not None else now
        at = min(at, start + budget.window_s)
    return at


class AttemptLedger:
    """Per job: the attempts this core started and their cost (most recently active kept)."""

    def __init__(self, keep: int = KEEP_JOBS) -> None:
        self.keep = keep
        self._jobs: OrderedDict[str, JobAttempts] = OrderedDict()

    def get(self, job_id: str) -> JobAttempts | None:
        return self._jobs.get(job_id)

    def started(self, job_id: str, index: int, now: float) -> None:
        """Attempt `index` of the job started under a permit (or was found running)."""
        seen = self._jobs.get(job_id)
        if seen is None:
            self._put(JobAttempts(job_id=job_id, first_at=now, last_index=index, started=1))
        else:
            self._put(
                JobAttempts(
                    job_id=job_id,
                    first_at=min(seen.first_at, now),
                    last_index=max(seen.last_index, index),
                    started=seen.started + 1,
                    cost_usd=seen.cost_usd,
                )
            )

    def charge(self, job_id: str, usd: float) -> None:
        """Cost of one of the job's attempts (a worker's result, or a report)."""
        seen = self._jobs.get(job_id)
        if seen is not None and math.isfinite(usd) and usd > 0:
            self._put(
                JobAttempts(
                    job_id=job_id,
                    first_at=seen.first_at,
                    last_index=seen.last_index,
                    started=seen.started,
                    cost_usd=seen.cost_usd + usd,
                )
            )

    def _put(self, entry: JobAttempts) -> None:
        self._jobs[entry.job_id] = entry
        self._jobs.move_to_end(entry.job_id)
        while len(self._jobs) > self.keep:
            self._jobs.popitem(last=False)

    def export(self) -> list[JobAttempts]:
        return list(self._jobs.values())

    def restore(self, entries: Iterable[JobAttempts]) -> None:
        """Resume a previous core's counts, merged with what this one saw meanwhile."""
        for e in entries:
            seen = self._jobs.get(e.job_id)
            if seen is not None:
                e = JobAttempts(
                    job_id=e.job_id,
                    first_at=min(seen.first_at, e.first_at),
                    last_index=max(seen.last_index, e.last_index),
                    started=max(seen.started, e.started),
                    cost_usd=max(seen.cost_usd, e.cost_usd),
                )
            self._put(e)
