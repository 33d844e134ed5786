"""`/api/v1/epics`: the token's tenant's epics (services/epics.py) — start, list, get (tasks,
verdicts and wave checkpoints), cancel. An epic's target repository is a path on the engine's
host: the API may name one only under the configuration's `api.epic_repos`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from corral.schemas import api as bodies
from corral.schemas.epics import Epic, EpicPage, EpicShow
from corral.services import epics

from .auth import JobsRead, JobsWrite, actor
from .state import state_of

router = APIRouter(prefix="/api/v1/epics", tags=["epics"])
EpicId = Annotated[str, "the epic's id (or a unique prefix)"]


@router.post("", response_model=Epic, status_code=201)
async def start_epic(body: bodies.EpicBody, request: Request, token: JobsWrite) -> Any:
    """Start an epic for the token's tenant: validated as an epic file (422 naming the bad
    key), its roles known to the configuration, its repository under `api.epic_repos` (403
    otherwise), its branch new (409 when it exists). The engine runs its waves."""
    st = state_of(request)
    repo = epics.open_to_api(body.repo, st.config)
    got = await epics.start(
        st.store,
        st.config,
        body.epic,
        repo=repo,
        within=epics.api_roots(st.config),
        base=body.base,
        tenant=token.tenant,
        wake=st.wake,
        clock=st.clock,
    )
    d = await epics.detail(st.store, got.id, token.tenant)
    return Epic.of(d.epic, d.tasks).dump()


@router.get("", response_model=EpicPage)
async def list_epics(
    request: Request, token: JobsRead, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> Any:
    """The tenant's epics, newest first, each with its tasks' states."""
    found = await epics.listing(state_of(request).store, token.tenant, limit)
    return EpicPage(epics=[Epic.of(d.epic, d.tasks) for d in found]).dump()


@router.get("/{epic_id}", response_model=EpicShow)
async def get_epic(epic_id: EpicId, request: Request, token: JobsRead) -> Any:
    """One epic: its tasks' tries, failures, commits and last verdicts, and its waves (as
    `corral epic show --json`); 404 for another tenant's."""
    d = await epics.detail(state_of(request).store, epic_id, token.tenant)
    return EpicShow.full(d.epic, d.tasks, d.waves).dump()


@router.post("/{epic_id}/cancel", response_model=Epic)
async def cancel_epic(
    epic_id: EpicId, request: Request, token: JobsWrite, body: bodies.CancelBody | None = None
) -> Any:
    """Ask the engine to stop the epic at once (409 when it has ended); what passed stays on
    its branch. The reason recorded names the token."""
    st = state_of(request)
    reason = f"{(body or bodies.CancelBody()).reason} (by {actor(token)})"
    got = await epics.cancel(
        st.store, epic_id, reason=reason, wake=st.wake, tenant=token.tenant, clock=st.clock
    )
    d = await epics.detail(st.store, got.id, token.tenant)
    return Epic.of(d.epic, d.tasks).dump()
