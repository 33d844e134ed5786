"""`/api/v1` mechanism (`admin`: it is the whole engine's, every tenant's): the core's status,
breakers (list, reset), escalations (list, clear) and the locked workspaces. The core's state
lives in the running engine; the routes ask it through its control socket as `corral status`
does (services/engine.py), in a worker thread so the event loop keeps serving."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Path, Request, Response

from corral.schemas import views
from corral.services import clusters, engine, metrics, queries

from .auth import Admin, Metrics
from .state import state_of

router = APIRouter(prefix="/api/v1", tags=["mechanism"])
Name = Annotated[str, Path(min_length=1, max_length=200)]


@router.get("/status", response_model=views.EngineStatus)
async def status(request: Request, token: Admin) -> Any:
    """The core's live snapshot: permits, watchdog, store health, breakers, escalations."""
    data_dir = state_of(request).config.data_dir
    snap = await anyio.to_thread.run_sync(lambda: engine.snapshot(data_dir))
    return views.EngineStatus(**snap).dump()


@router.get("/environments", response_model=list[views.Environment])
async def environments(request: Request, token: Admin) -> Any:
    """The environments, their caps and, for a Ray one, its cluster's health asked now."""
    config = state_of(request).config
    envs = await anyio.to_thread.run_sync(lambda: clusters.environments(config))
    return [views.Environment(**e).dump() for e in envs]


@router.get("/breakers", response_model=list[views.Breaker])
async def breakers(request: Request, token: Admin) -> Any:
    data_dir = state_of(request).config.data_dir
    snap = await anyio.to_thread.run_sync(lambda: engine.snapshot(data_dir))
    return [views.Breaker(**b).dump() for b in snap.get("breakers", [])]


@router.post("/breakers/{name}/reset", response_model=views.BreakerReset)
async def reset_breaker(name: Name, request: Request, token: Admin) -> Any:
    """Close a breaker by hand (recorded as an operator reset)."""
    data_dir = state_of(request).config.data_dir
    await anyio.to_thread.run_sync(lambda: engine.reset_breaker(data_dir, name))
    return views.BreakerReset(breaker=name, state="CLOSED").dump()


@router.get("/escalations", response_model=list[views.Escalation])
async def escalations(request: Request, token: Admin) -> Any:
    data_dir = state_of(request).config.data_dir
    snap = await anyio.to_thread.run_sync(lambda: engine.snapshot(data_dir))
    return [views.Escalation(**e).dump() for e in snap.get("escalations", [])]


@router.post("/escalations/{escalation_id}/clear", response_model=views.EscalationCleared)
async def clear_escalation(escalation_id: Name, request: Request, token: Admin) -> Any:
    """End an escalation; for a core crash loop, whether the core is back."""
    data_dir = state_of(request).config.data_dir
    cleared, core = await anyio.to_thread.run_sync(
        lambda: engine.clear_escalation(data_dir, escalation_id)
    )
    return views.EscalationCleared(
        escalation=None if cleared is None else str(cleared), cleared=True, core=core
    ).dump()


@router.get("/workspaces", response_model=list[views.Workspace])
async def workspaces(request: Request, token: Admin) -> Any:
    """Workspaces locked by a job, and since when."""
    held = await queries.workspaces(state_of(request).store)
    return [
        views.Workspace(workspace=w, job=j, acquired_at=views.iso_time(t)).dump()
        for w, j, t in held
    ]


# Prometheus scrapes /metrics by convention: outside /api/v1.
metrics_router = APIRouter(tags=["metrics"])


@metrics_router.get(
    "/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}}
)
async def prometheus_metrics(request: Request, token: Metrics) -> Response:
    """The fleet's figures in the Prometheus text format, read now from the store and the core
    (docs/how-to/observability.md); `metrics` scope: aggregates only, never a job id."""
    st = state_of(request)
    body = await metrics.exposition(st.store, st.config)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
