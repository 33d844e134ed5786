"""Causal replay: the whole control-plane chain behind a job — its root intent (the first job of
its chain of parents), every job spawned below that root, and each one's timeline, tool calls
and policy evaluations, merged in time order — with the audit chains verified, so what is shown
is known not to have been changed since it was written.

Tool calls carry no time of their own: an attempt's trace is written when it ends, so its calls
are placed at that instant, in their order.

`corral replay` takes a job, or what an attempt of it started outside Corral: its Ray submission
id (workers/rayjob.py `submission_id`) or its W&B run id (domain/ids.py `wandb_run_id`). Both
are derived from the job and the attempt, so they are resolved by reading them back, not by a
lookup table: the job must exist and have had that attempt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from corral.config import Config
from corral.core.ports import AuditReport, JobQuery, Store
from corral.domain.errors import NotFound
from corral.domain.ids import job_of_wandb_run_id, wandb_run_id
from corral.domain.models import Job
from corral.schemas import views
from corral.services import audit
from corral.workers.rayjob import submission_id

MAX_JOBS = 10_000  # jobs a replay follows at most (a runaway tree is cut, and says so)
CHILDREN = 100_000  # children read per job at most


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    at: float
    job_id: str
    kind: Literal["event", "tool_call", "policy"]
    attempt: int | None
    subject: str  # an event's kind, a tool's name, a policy stage
    detail: str  # the event's message, "allowed"/"denied: why", "verdict: reason"


@dataclass(frozen=True, slots=True, kw_only=True)
class Replay:
    job: Job  # the job asked about
    root: Job
    attempt: int | None = None  # asked about by a Ray submission or W&B run id: its attempt
    jobs: list[Job]  # the root, then every descendant, breadth first
    steps: list[Step]
    audit: AuditReport
    cut: bool = False  # more than MAX_JOBS jobs: the rest are not shown


async def resolve(store: Store, ref: str) -> tuple[Job, int | None]:
    """The job `ref` names — a job id (or a unique prefix or suffix), a Ray submission id or a
    W&B run id — with the attempt when it was one of the last two (both read the same way:
    `corral-<job id>-<attempt>`; the assertion below keeps them so)."""
    parsed = job_of_wandb_run_id(ref)
    if parsed is None:
        return await store.get_job(ref), None
    job_id, index = parsed
    try:
        job = await store.get_job(job_id)
    except NotFound:
        job = None
    if job is None or job.id != job_id:  # the whole id only: no prefix inside a run id
        raise NotFound(f"no job {job_id} (from the Ray submission or W&B run id {ref})")
    if not 1 <= index <= job.attempts:
        raise NotFound(
            f"job {job.id} has no attempt {index} (it made {job.attempts}): {ref} names none"
        )
    if ref not in (submission_id(job.id, index), wandb_run_id(job.id, index)):
        raise NotFound(f"{ref} is neither a Ray submission id nor a W&B run id of job {job.id}")
    return job, index


async def replay(store: Store, config: Config, ref: str) -> Replay:
    job, attempt = await resolve(store, ref)
    root = job
    seen = {root.id}
    while root.parent_id is not None and root.parent_id not in seen:
        root = await store.get_job(root.parent_id)
        seen.add(root.id)
    jobs, frontier, cut = [root], [root], False
    while frontier and not cut:
        nxt = []
        for parent in frontier:
            children = await store.list_jobs(JobQuery(parent_id=parent.id, limit=CHILDREN))
            for child in sorted(children, key=lambda j: j.id):
                if len(jobs) >= MAX_JOBS:
                    cut = True
                    break
                jobs.append(child)
                nxt.append(child)
        frontier = nxt
    steps: list[Step] = []
    for j in jobs:
        steps.extend(await _steps(store, j))
    steps.sort(key=lambda s: s.at)  # stable: a job's own order holds among equal instants
    return Replay(
        job=job,
        root=root,
        attempt=attempt,
        jobs=jobs,
        steps=steps,
        audit=await audit.verify(store, config),
        cut=cut,
    )


async def _steps(store: Store, j: Job) -> list[Step]:
    out = [
        Step(
            at=e.at,
            job_id=j.id,
            kind="event",
            attempt=e.attempt,
            subject=e.kind,
            detail=e.message or (f"{e.from_state} → {e.to_state}" if e.to_state else ""),
        )
        for _, e in await store.events(j.id)
    ]
    for ev in await store.agent_events(j.id):
        out.extend(
            Step(
                at=ev.at,
                job_id=j.id,
                kind="tool_call",
                attempt=ev.attempt,
                subject=call.tool,
                detail=f"denied: {call.reason or 'by policy'}" if call.denied else "allowed",
            )
            for call in ev.tool_calls
        )
    out.extend(
        Step(
            at=p.at,
            job_id=j.id,
            kind="policy",
            attempt=p.attempt,
            subject=f"{p.stage} {p.subject}",
            detail=f"{p.verdict}: {p.reason}",
        )
        for p in await store.policy_evaluations(j.id, limit=1 << 31)
    )
    return out


def replay_view(r: Replay) -> views.Replay:
    """The published shape of a replay (`corral replay --json`)."""
    a = r.audit
    return views.Replay(
        job_id=r.job.id,
        root_intent_id=r.root.id,
        attempt=r.attempt,
        jobs=[
            views.ReplayJob(
                id=j.id,
                parent_id=j.parent_id,
                depth=j.depth,
                role=j.role,
                state=j.state,
                created_at=views.iso_time(j.created_at),
            )
            for j in r.jobs
        ],
        steps=[
            views.ReplayStep(
                at=views.iso_time(s.at),
                job_id=s.job_id,
                kind=s.kind,
                attempt=s.attempt,
                subject=s.subject,
                detail=s.detail,
            )
            for s in r.steps
        ],
        audit=views.AuditReport(
            ok=a.ok,
            checked=a.checked,
            prechain=a.prechain,
            checkpoints=a.checkpoints,
            first_bad=a.first_bad,
            problems=list(a.problems),
        ),
        cut=r.cut,
    )
