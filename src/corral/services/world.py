"""The world model read from the store (corral.world builds it): `corral world`, `GET
/agentops/world-model` and the engine's deadlock watch all call `snapshot`.

What it reads: the active jobs (every state short of an end), the attempts in flight with each
one's latest checkpoint (tool calls so far, the tool it is in, its session), the waits the
running jobs recorded, and the latest finished jobs for the causal graph. A job following
another to its end from inside an attempt (`corral wait`, `corral submit --wait`) records the
wait on its own timeline (`record_wait`): that is how a parent waiting on its child shows."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from corral.core.ports import JobQuery, JobStore, JobTraces
from corral.domain.agents import Checkpoint
from corral.domain.errors import CorralError
from corral.domain.models import Job, JobEvent
from corral.domain.settings import Settings
from corral.domain.states import ACTIVE, JobState
from corral.schemas import views
from corral.world.model import Caps, Edge, World, build

Clock = Callable[[], float]
WAIT_STARTED = "wait_started"  # a job's timeline: it follows `data.on` to its end
WAIT_ENDED = "wait_ended"  # … and stopped following it
ACTIVE_CAP = 100_000  # active jobs read per state at most
FINISHED = 100  # the latest finished jobs the causal graph shows


@dataclass(frozen=True, slots=True, kw_only=True)
class Scope:
    """Which jobs a snapshot shows: a tenant's (the HTTP API's token) or every one."""

    tenant: str | None = None
    finished: int = FINISHED


def caps_of(settings: Settings) -> Caps:
    return Caps(
        roles={name: r.concurrency for name, r in settings.roles.items()},
        envs={name: (e.kind, e.max_inflight) for name, e in settings.environments.items()},
    )


async def snapshot(
    store: JobTraces, settings: Settings, scope: Scope | None = None, *, clock: Clock = time.time
) -> World:
    """The world as the store shows it now."""
    scope = scope or Scope()
    jobs: dict[str, Job] = {}
    for state in sorted(ACTIVE):
        for j in await store.list_jobs(JobQuery(state=JobState(state), limit=ACTIVE_CAP)):
            jobs[j.id] = j
    if scope.finished:
        for j in await store.list_jobs(JobQuery(limit=scope.finished + len(jobs))):
            if j.state.terminal and len(jobs) < ACTIVE_CAP:
                jobs.setdefault(j.id, j)
    inflight = await store.inflight()
    if scope.tenant is not None:
        jobs = {i: j for i, j in jobs.items() if j.tenant == scope.tenant}
        inflight = [(j, a) for j, a in inflight if j.tenant == scope.tenant]
    checkpoints: dict[str, Checkpoint] = {}
    waits: dict[str, set[str]] = {}
    for j, _ in inflight:
        found = await store.checkpoints(j.id)
        if found:
            checkpoints[j.id] = found[-1]
        waits[j.id] = open_waits([e for _, e in await store.events(j.id)])
    return build(jobs.values(), inflight, checkpoints, waits, caps_of(settings), now=clock())


def open_waits(timeline: list[JobEvent]) -> set[str]:
    """The jobs a job's timeline says it is following now."""
    following: dict[str, int] = {}
    for e in timeline:
        target = e.data.get("on")
        if not isinstance(target, str):
            continue
        if e.kind == WAIT_STARTED:
            following[target] = following.get(target, 0) + 1
        elif e.kind == WAIT_ENDED:
            following[target] = following.get(target, 0) - 1
    return {t for t, n in following.items() if n > 0}


async def record_wait(
    store: JobStore, waiter: str, target: str, *, started: bool, clock: Clock = time.time
) -> bool:
    """On `waiter`'s timeline: it started (or stopped) following `target` to its end. Not
    recorded (False) when the waiter is not a job the store knows, or is the target itself."""
    try:
        job = await store.get_job(waiter)
    except CorralError:
        return False
    if job.id == target or job.state.terminal:
        return False
    kind = WAIT_STARTED if started else WAIT_ENDED
    verb = "waits for" if started else "stopped waiting for"
    await store.append_events(
        [
            JobEvent(
                job_id=job.id,
                at=clock(),
                kind=kind,
                message=f"{verb} {target}",
                attempt=job.attempts or None,
                data={"on": target},
            )
        ]
    )
    return True


def _edge(e: Edge) -> views.WorldEdge:
    return views.WorldEdge(
        job_id=e.source, related_job_id=e.target, relationship=e.kind, slot=e.slot
    )


def world_view(w: World) -> views.WorldModel:
    """The published shape of a snapshot (`corral world --json`, the HTTP API)."""
    return views.WorldModel(
        at=views.iso_time(w.at),
        agents={
            a.job_id: views.WorldAgent(
                role=a.role,
                status=a.state,
                attempt=a.attempt,
                worker=a.worker,
                env=a.env,
                tenant=a.tenant,
                started_at=views.iso_time(a.started_at),
                tool_call_count=a.tool_calls,
                current_tool=a.current_tool,
                session_id=a.session_id,
            )
            for a in w.agents
        },
        user_plane={
            e.name: views.WorldEnvironment(
                kind=e.kind,
                jobs_in_flight=e.inflight,
                cap=e.cap,
                queue_depth=e.queued,
                cluster_status=e.cluster_status,
                gpu_utilisation=e.gpu_utilisation,
            )
            for e in w.environments
        },
        execution_topology=[_edge(e) for e in w.edges],
        causal_graph=[
            views.WorldCause(
                control_plane_intent_id=c.job_id,
                root_intent_id=c.root_id,
                parent_intent_id=c.parent_id,
                role=c.role,
                state=c.state,
                user_plane_job=views.UserPlaneJob(
                    ray_submission_id=c.user_plane.ray_submission_id,
                    notebook=c.user_plane.notebook,
                    wandb_run=c.user_plane.wandb_run,
                ),
                outcome=c.outcome,
                exit_code=c.exit_code,
            )
            for c in w.causal
        ],
        deadlocks=[
            views.WorldDeadlock(
                jobs=list(d.jobs), cycle=[_edge(e) for e in d.edges], message=d.describe()
            )
            for d in w.deadlocks
        ],
    )
