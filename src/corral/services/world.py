"""The world model read from the store (corral.world builds it): `corral world` and `GET
/agentops/world-model` call `snapshot`, the reading the engine's deadlock watch shares
(runtime/worldwatch.py), and `world_view` gives its published shape.

What it reads: the active jobs (every state short of an end), the attempts in flight with each
one's latest checkpoint (tool calls so far, the tool it is in, its session), the waits the
running jobs recorded, and the latest finished jobs for the causal graph. A job following
another to its end from inside an attempt (`corral wait`, `corral submit --wait`) records the
wait on its own timeline (`record_wait`): that is how a parent waiting on its child shows."""

from __future__ import annotations

import time
from collections.abc import Callable

from corral.core.ports import BaselineStore, JobStore
from corral.domain.errors import CorralError
from corral.domain.models import Baseline, JobEvent
from corral.runtime.worldwatch import WAIT_ENDED, WAIT_STARTED, Scope, snapshot
from corral.schemas import views
from corral.world.model import Edge, World

Clock = Callable[[], float]
__all__ = [
    "WAIT_ENDED",
    "WAIT_STARTED",
    "Scope",
    "baselines",
    "record_wait",
    "snapshot",
    "world_view",
]


async def baselines(store: BaselineStore) -> list[Baseline]:
    """The anomaly detector's rolling baselines, by role, kind and metric."""
    return await store.baselines()


async def record_wait(
    store: JobStore, waiter: str, target: str, *, started: bool, clock: Clock = time.time
) -> bool:
    """On `waiter`'s timeline: it started (or stopped) following `target` to its end. Not
    recorded (False) when the waiter is not a live job the store knows, is the target itself,
    or the store cannot take the write now (the wait goes on unrecorded)."""
    try:
        job = await store.get_job(waiter)
    except CorralError:
        return False
    if job.id == target or job.state.terminal:
        return False
    kind = WAIT_STARTED if started else WAIT_ENDED
    verb = "waits for" if started else "stopped waiting for"
    try:  # the wait itself never fails for want of its record
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
    except CorralError:
        return False
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
