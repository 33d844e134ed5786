"""The dashboard's epics pages (services/epics.py): every epic of the viewer's tenant with its
wave and tasks, and one epic's tasks — tries, failures, commit, the last gate with each judge's
verdict — and its waves' checkpoints. Every value from an agent (a judge's words, a check's
output) is escaped by the templates' autoescape."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse

from corral.core.ports import EpicStore
from corral.services import epics

Page = Callable[..., HTMLResponse]


def routes(
    ui: FastAPI,
    page: Page,
    reads: Callable[..., Awaitable[Any]],
    store_of: Callable[[Request], EpicStore],
) -> None:
    """Add /epics and /epics/{id} to the dashboard (`reads`: the jobs:read guard)."""
    signed_reader = Depends(reads)

    @ui.get("/epics", response_class=HTMLResponse)
    async def epics_page(request: Request, viewer: Any = signed_reader) -> HTMLResponse:
        found = await epics.listing(store_of(request), viewer.token.tenant, limit=100)
        return page(request, "epics.html", viewer, epics=found)

    @ui.get("/epics/{epic_id}", response_class=HTMLResponse)
    async def epic_page(
        request: Request,
        epic_id: str,
        viewer: Any = signed_reader,
    ) -> HTMLResponse:
        d = await epics.detail(store_of(request), epic_id, viewer.token.tenant)
        return page(request, "epic.html", viewer, d=d)
