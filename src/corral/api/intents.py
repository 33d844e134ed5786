"""`/agentops/intents`: the AgentOps surface as it is specified — an intent is a job submitted
for the token's tenant; its answer is where it stands and about when it starts
(services/intents.py documents the estimate)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse

from corral.schemas import api as bodies
from corral.schemas import views
from corral.services import cancellation, intents, notebooks, tenancy
from corral.services.submissions import submit

from .auth import JobsRead, JobsWrite, actor
from .jobs import submit_request
from .state import state_of

router = APIRouter(prefix="/agentops/intents", tags=["agentops"])


@router.post("", status_code=202, response_model=bodies.IntentAccepted)
async def create_intent(
    body: bodies.IntentCreate,
    request: Request,
    token: JobsWrite,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Any:
    """Submit an intent (a job): 202 with its id, its place in the queue and a start estimate."""
    st = state_of(request)
    req = submit_request(body, token, idempotency_key)
    if body.source is not None:
        req = notebooks.intent_request(
            req, body.source, body.environment, body.parameters, body.copyback
        )
    job = (await submit(st.store, st.config, req, st.wake, services=st.submissions)).result.job
    where = await intents.placement(st.store, st.config, job)
    return JSONResponse(
        bodies.IntentAccepted(
            intent_id=job.id,
            queue_position=where.queue_position,
            estimated_start_s=where.estimated_start_s,
        ).dump(),
        status_code=202,
    )


@router.get("/{intent_id}", response_model=bodies.IntentStatus)
async def get_intent(intent_id: str, request: Request, token: JobsRead) -> Any:
    """How an intent is doing: its status, latest checkpoint, tool calls and duration."""
    st = state_of(request)
    job = await tenancy.job_of(st.store, intent_id, token.tenant)
    p = await intents.progress(st.store, job)
    return bodies.IntentStatus(
        status=p.status,
        checkpoint=p.checkpoint,
        tool_call_count=p.tool_call_count,
        duration_ms=p.duration_ms,
    ).dump()


@router.post("/{intent_id}/cancel", response_model=views.Cancelled)
async def cancel_intent(intent_id: str, request: Request, token: JobsWrite) -> Any:
    """Cancel an intent: 200, or 409 when it has ended."""
    st = state_of(request)
    await tenancy.job_of(st.store, intent_id, token.tenant)
    done = await cancellation.cancel(
        st.store,
        st.config,
        intent_id,
        reason=f"intent cancelled (by {actor(token)})",
        caller=None,
        wake=st.wake,
    )
    j = done.job
    return views.Cancelled(id=j.id, state=j.state, cancel_requested=j.cancel_requested).dump()
