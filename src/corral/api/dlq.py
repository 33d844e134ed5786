"""`/api/v1/dlq`: the caller's tenant's dead-letter queue — list, requeue with a fresh attempt
budget, purge (services/dlq.py)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from corral.schemas import api as bodies
from corral.schemas import views
from corral.services import dlq, tenancy

from .auth import JobsRead, JobsWrite
from .state import state_of

router = APIRouter(prefix="/api/v1/dlq", tags=["dlq"])


@router.get("", response_model=bodies.JobPage)
async def dlq_list(
    request: Request,
    token: JobsRead,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: Annotated[str | None, Query(max_length=100)] = None,
) -> Any:
    """Dead-lettered jobs not yet requeued or purged, newest first."""
    page = await tenancy.jobs_of(
        state_of(request).store, token.tenant, limit=limit, cursor=cursor, dead_lettered=True
    )
    return bodies.JobPage(
        jobs=[views.JobDetail.of(j) for j in page.jobs], next_cursor=page.next_cursor
    ).dump()


@router.post("/{job_id}/requeue", status_code=201, response_model=views.Requeued)
async def dlq_requeue(job_id: str, request: Request, token: JobsWrite) -> Any:
    """A fresh copy of a dead-lettered job with a fresh attempt budget (201)."""
    st = state_of(request)
    await tenancy.job_of(st.store, job_id, token.tenant)
    new = await dlq.requeue(st.store, st.config, job_id, wake=st.wake)
    return views.Requeued(id=new.id, requeued_from=new.requeued_from, state=new.state).dump()


@router.post("/purge", response_model=views.Purged)
async def dlq_purge(body: bodies.PurgeBody, request: Request, token: JobsWrite) -> Any:
    """Drop jobs from the dead-letter queue (`all`: every one of the tenant's); their records,
    attempts and logs stay."""
    st = state_of(request)
    refs = await tenancy.dead_letters_to_purge(st.store, token.tenant, body.jobs, every=body.all)
    return views.Purged(purged=await dlq.purge(st.store, st.config, refs)).dump()
