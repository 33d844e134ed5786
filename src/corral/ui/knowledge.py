"""The dashboard's knowledge pages (services/knowledge.py): the viewer's tenant's learnings,
searched (the store's full-text index) and filtered by kind, role, tier and status, with the
per-role A/B statistics (runs with and without injected learnings: do they pay?); and one
learning's text, provenance, score history and the attempts it was given to. A learning's title
and body, a history line's reason, are an agent's words: the templates' autoescape escapes them,
and the body is shown as text, never rendered as markdown."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse

from corral.core.ports import KnowledgeStore
from corral.domain.knowledge import LearningKind, Tier
from corral.services import knowledge

Page = Callable[..., HTMLResponse]
LIMIT = 100
Words = Annotated[str, Query(max_length=500)]


def routes(
    ui: FastAPI,
    page: Page,
    reads: Callable[..., Awaitable[Any]],
    store_of: Callable[[Request], KnowledgeStore],
) -> None:
    """Add /knowledge and /knowledge/{id} to the dashboard (`reads`: the jobs:read guard)."""
    signed_reader = Depends(reads)

    @ui.get("/knowledge", response_class=HTMLResponse)
    async def knowledge_page(
        request: Request,
        q: Words = "",
        type: LearningKind | None = None,
        role: Annotated[str, Query(max_length=200)] = "",
        tier: Tier | None = None,
        status: Annotated[str, Query(pattern="^(active|pending|retired|all)$")] = "all",
        viewer: Any = signed_reader,
    ) -> HTMLResponse:
        store, tenant = store_of(request), viewer.token.tenant
        found = await knowledge.find(
            store,
            tenant=tenant,
            query=q,
            role=role or None,
            kind=type,
            tier=tier,
            status=knowledge.status_of(status),
            limit=LIMIT,
        )
        now = time.time()
        return page(
            request,
            "knowledge.html",
            viewer,
            learnings=[knowledge.learning_view(x, now) for x in found],
            stats=await knowledge.stats(store, tenant=tenant),
            f={"q": q, "type": type, "role": role, "tier": tier, "status": status},
            kinds=[k.value for k in LearningKind],
            tiers=[t.value for t in Tier if t is not Tier.DISCARD],
            limit=LIMIT,
        )

    @ui.get("/knowledge/{learning_id}", response_class=HTMLResponse)
    async def learning_page(
        request: Request, learning_id: str, viewer: Any = signed_reader
    ) -> HTMLResponse:
        shown = await knowledge.show(store_of(request), learning_id, viewer.token.tenant)
        return page(request, "learning.html", viewer, x=shown.view(time.time()))
