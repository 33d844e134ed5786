"""`/api/v1/knowledge`: the token's tenant's learnings (services/knowledge.py) — list and
full-text search, one with its history and citations, promote a pending one, retire one, and
the A/B statistics per role. Another tenant's learning is not found. Promoting and retiring
need `govern` (deciding what agents are given is governance); the change is recorded as made by
`token:<id>`."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from corral.domain.knowledge import LearningKind, Tier
from corral.schemas import api as bodies
from corral.schemas import knowledge as views
from corral.services import knowledge

from .auth import Govern, JobsRead, actor
from .state import state_of

router = APIRouter(prefix="/api/v1/knowledge", tags=["knowledge"])
LearningId = Annotated[str, "the learning's whole id (a short one: list with `ref`)"]
Status = Annotated[str, Query(pattern=f"^({'|'.join(knowledge.STATUSES)})$")]


@router.get("", response_model=views.LearningPage)
async def list_learnings(
    request: Request,
    token: JobsRead,
    q: Annotated[str | None, Query(max_length=1000, description="Words (any of them).")] = None,
    type: Annotated[LearningKind | None, Query(description="The learning's kind.")] = None,
    role: Annotated[str | None, Query(max_length=200)] = None,
    tier: Tier | None = None,
    status: Status = "all",
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ref: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=100,
            description="Only the learnings this names: the whole id, or a prefix or suffix "
            "of 4+ characters (how `corral knowledge --url` resolves a short id; `q` is then "
            "not used).",
        ),
    ] = None,
) -> Any:
    """The tenant's learnings: with `q`, those the full-text search finds, best match first;
    else the newest first. Confidence and freshness are decayed to now."""
    found = await knowledge.find(
        state_of(request).store,
        tenant=token.tenant,
        query=q,
        role=role,
        kind=type,
        tier=tier,
        status=knowledge.status_of(status),
        limit=limit,
        ref=ref,
    )
    now = time.time()
    return views.LearningPage.model_validate(
        {"learnings": [knowledge.learning_view(x, now) for x in found]}
    ).dump()


@router.get("/stats", response_model=views.KnowledgeStats)
async def knowledge_stats(
    request: Request, token: JobsRead, role: Annotated[str | None, Query(max_length=200)] = None
) -> Any:
    """Per role of the tenant, the finished runs given learnings and those not, their success
    rate, tool calls per run and the difference; the learnings by status."""
    return await knowledge.stats(state_of(request).store, tenant=token.tenant, role=role)


@router.get("/{learning_id}", response_model=views.LearningShow)
async def get_learning(learning_id: LearningId, request: Request, token: JobsRead) -> Any:
    """One learning (as `corral knowledge show --json`): provenance, history, citations."""
    shown = await knowledge.show(state_of(request).store, learning_id, token.tenant)
    return shown.view(time.time())


@router.post("/{learning_id}/promote", response_model=views.Learning)
async def promote_learning(
    learning_id: LearningId,
    request: Request,
    token: Govern,
    body: bodies.PromoteBody | None = None,
) -> Any:
    """Approve a pending (bronze) learning: runs of its role are given it from now on (422
    when it is not pending)."""
    st = state_of(request)
    found = await knowledge.learning_of(st.store, learning_id, token.tenant)
    note = (body or bodies.PromoteBody()).note
    done = await knowledge.promote(st.store, found.id, by=actor(token), note=note)
    return knowledge.learning_view(done, time.time())


@router.post("/{learning_id}/retire", response_model=views.Learning)
async def retire_learning(
    learning_id: LearningId, body: bodies.RetireBody, request: Request, token: Govern
) -> Any:
    """Stop giving a learning to runs (kept, with its history; final)."""
    st = state_of(request)
    found = await knowledge.learning_of(st.store, learning_id, token.tenant)
    done = await knowledge.retire(st.store, found.id, by=actor(token), reason=body.reason)
    return knowledge.learning_view(done, time.time())
