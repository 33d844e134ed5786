"""`/agentops/world-model`: the world model of the token's tenant (services/world.py) — its
running agents, the environments' slots and queues as its jobs use them, the execution
topology, the causal graph and any deadlock among its jobs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from corral.schemas import views
from corral.services import world

from .auth import JobsRead
from .state import state_of

router = APIRouter(prefix="/agentops", tags=["agentops"])


@router.get("/world-model", response_model=views.WorldModel)
async def world_model(request: Request, token: JobsRead) -> Any:
    """A snapshot of the fleet as the store shows it now, the token's tenant's jobs only."""
    st = state_of(request)
    snap = await world.snapshot(
        st.store, st.config.settings, world.Scope(tenant=token.tenant), clock=st.clock
    )
    return world.world_view(snap).dump()
