"""What both stores (store/memory.py, store/sql.py) decide the same way, as pure functions: the
lifecycle checks, what a stop ends a job as, the job events they write, how a submission's
dependencies resolve and what a dependency's end does to its dependents.

Each store does its own reading and writing around these; tests/contract/ runs one suite against
both to keep them equal.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from corral.domain.errors import Conflict, InvalidRequest, NotFound
from corral.domain.models import AttemptResult, Job, JobEvent, SubmitResult
from corral.domain.states import AttemptState, JobState, Outcome, can_transition
from corral.store.rows import event_params

# What a stop request ends a job as: an operator's cancel, the kill switch, or a permit the core
# refused for good (a global safe stop that fails queued work).
STOP_STATES = {"cancel": JobState.CANCELLED, "kill": JobState.KILLED, "deny": JobState.DENIED}

ATTEMPT_STATE_FOR = {
    Outcome.TIMED_OUT: AttemptState.TIMED_OUT,
    Outcome.CANCELLED: AttemptState.CANCELLED,
    Outcome.KILLED: AttemptState.KILLED,
    Outcome.LOST: AttemptState.LOST,
    Outcome.SPAWN_ERROR: AttemptState.FAILED,
}

EVENT_COLUMNS = ("job_id", "at", "kind", "from_state", "to_state", "attempt", "message", "data")
CORE_EVENT_FIELDS = ("at", "kind", "scope", "name", "state", "severity", "reason", "message")


def core_event_params(e: Mapping[str, Any]) -> tuple[Any, ...]:
    """A core event (CoreEvent.to_dict()) as the columns of core_events."""
    return (
        *(e.get(f, "" if f != "at" else 0.0) for f in CORE_EVENT_FIELDS),
        json.dumps(e.get("data") or {}, sort_keys=True, default=str),
    )


def check_transition(job: Job, to: JobState) -> None:
    """The lifecycle table is enforced where states are written, whoever asks."""
    if not can_transition(job.state, to):
        raise Conflict(f"job {job.id} cannot go from {job.state.value} to {to.value}")


def attempt_state_for(result: AttemptResult) -> AttemptState:
    if result.outcome is Outcome.EXITED:
        return AttemptState.SUCCEEDED if result.succeeded else AttemptState.FAILED
    return ATTEMPT_STATE_FOR[result.outcome]


def job_event(
    job: Job,
    kind: str,
    now: float,
    message: str = "",
    *,
    to: JobState | None = None,
    attempt: int | None = None,
    data: Mapping[str, Any] | None = None,
) -> JobEvent:
    return JobEvent(
        job_id=job.id,
        at=now,
        kind=kind,
        message=message,
        from_state=job.state.value,
        to_state=to.value if to else None,
        attempt=attempt,
        data=dict(data or {}),
    )


def event_row(e: JobEvent) -> dict[str, Any]:
    """A job event as the columns of job_events (its chain columns apart)."""
    return dict(zip(EVENT_COLUMNS, event_params(e), strict=True))


def submitted_events(
    job: Job, now: float, superseded: str | None, failed_dep: str | None
) -> list[JobEvent]:
    """The timeline's first lines of a new job: submitted (naming the job a latest-wins
    submission superseded), and failed at once when a dependency had already failed."""
    events = [
        JobEvent(
            job_id=job.id,
            at=now,
            kind="submitted",
            to_state=job.state.value,
            message=("supersedes " + superseded) if superseded else "",
            data={
                "priority": job.priority,
                "role": job.role,
                **({"by": job.options.submitted_by} if job.options.submitted_by else {}),
            },
        )
    ]
    if failed_dep:
        events.append(
            JobEvent(
                job_id=job.id,
                at=now,
                kind="dependency_failed",
                message=failed_dep,
                to_state=JobState.FAILED.value,
            )
        )
    return events


def acquired_event(job: Job, now: float, wait_ms: float) -> JobEvent:
    """The timeline line of a job taking its workspace's lock after waiting `wait_ms`."""
    return JobEvent(
        job_id=job.id,
        at=now,
        kind="workspace_lock_acquired",
        message=f"workspace {job.workspace}",
        data={"workspace": job.workspace, "wait_ms": round(wait_ms, 3)},
    )


def requeue_blocked(job_id: str, new_job: Job, result: SubmitResult) -> str:
    what = (
        f"its workspace {new_job.workspace}"
        if result.coalesced_on == "workspace"
        else f"its key {new_job.key!r}"
    )
    return (
        f"cannot requeue {job_id}: {what} is held by job {result.job.id}; "
        "requeue once that job has ended"
    )


def dependencies(job: Job) -> list[str]:
    """The jobs a submission names with --after, each once (a repeated --after counts once)."""
    return list(dict.fromkeys(job.after))


def resolve_deps(job: Job, found: Mapping[str, Job | None]) -> tuple[Job, list[str], str | None]:
    """A submission against its dependencies as the store found them (`found`: each of
    `dependencies(job)` → its job, None if there is none): (the job to insert, the ids it waits
    for, why it failed at once or None). Succeeded dependencies are counted off; one that ended
    otherwise fails the job at submission. Raises for a job naming itself or no job, in the
    order the dependencies were named."""
    pending: list[str] = []
    failed: str | None = None
    for dep_id in dependencies(job):
        if dep_id == job.id:
            raise InvalidRequest(f"job {job.id} cannot depend on itself")
        dep = found.get(dep_id)
        if dep is None:
            raise NotFound(f"--after names no job: {dep_id}")
        if dep.state is JobState.SUCCEEDED:
            continue
        if dep.state.terminal:
            failed = failed or f"dependency {dep.id} ended {dep.state.value}"
        else:
            pending.append(dep.id)
    if failed:
        return job.with_(state=JobState.FAILED, last_error=failed), pending, failed
    return job.with_(deps_pending=len(pending)), pending, None


def dependency_failed(dep: Job, ended: JobState) -> str | None:
    """What a dependency's end does to a queued dependent: None, it is counted off (it
    succeeded); else why the dependent fails (and its own dependents after it)."""
    return None if ended is JobState.SUCCEEDED else f"dependency {dep.id} ended {ended.value}"
