"""`/api/v1` budgets and dark launches (services/controls.py, as `corral budget` and `corral
dark-launch`). A `govern` token reads and sets its tenant's budget; role budgets and dark
launches reach every tenant: setting them needs `admin`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request

from corral.domain.governance import ScopeKind
from corral.schemas import api as bodies
from corral.schemas import views
from corral.services import controls, tenancy
from corral.services.controls import BudgetLine, LaunchStanding

from .auth import Govern, actor
from .state import state_of

router = APIRouter(prefix="/api/v1", tags=["policy"])
Workflow = Annotated[str, Path(min_length=1, max_length=200)]


def _budget(line: BudgetLine) -> views.Budget:
    c = line.ceiling
    return views.Budget(
        scope=c.scope,
        target=c.target,
        period=c.period,
        ceiling_usd=c.ceiling_usd,
        period_start=views.iso_time(line.period_start),
        resets_at=views.iso_time(line.resets_at),
        spent_usd=line.spent_usd,
        reserved_usd=line.reserved_usd,
        headroom_usd=line.headroom_usd,
    )


def _launch(s: LaunchStanding) -> views.DarkLaunch:
    launch = s.setting
    return views.DarkLaunch(
        workflow=s.workflow,
        set=launch is not None,
        enabled=bool(launch and launch.enabled),
        percentage=launch.percentage if launch else None,
        position=s.position,
        in_window=s.in_window,
        runs=s.runs,
    )


@router.get("/budgets", response_model=list[views.Budget])
async def budgets(request: Request, token: Govern) -> Any:
    """The ceilings that apply to the tenant (its own and the roles') and their standing."""
    lines = await controls.budgets(state_of(request).store, scope=None, target=None)
    return [
        _budget(line).dump()
        for line in lines
        if token.allows("admin")
        or line.ceiling.scope is ScopeKind.ROLE
        or line.ceiling.target == token.tenant
    ]


@router.post("/budgets", response_model=views.Budget)
async def set_budget(body: bodies.BudgetBody, request: Request, token: Govern) -> Any:
    """Set a ceiling (the latest per scope and target wins)."""
    st = state_of(request)
    target = body.target or (token.tenant if body.scope == "tenant" else "")
    ceiling = controls.budget_ceiling(
        scope=body.scope, target=target, period=body.period, ceiling_usd=body.ceiling_usd
    )
    await tenancy.scope_allowed(
        st.store, token.tenant, ceiling.scope, ceiling.target, admin=token.allows("admin")
    )
    _, line = await controls.set_budget(st.store, ceiling, by=actor(token), wake=st.wake)
    return _budget(line).dump()


@router.get("/dark-launches", response_model=list[views.DarkLaunch])
async def dark_launches(request: Request, token: Govern) -> Any:
    """Every workflow that has a dark launch setting, with its md5 position."""
    return [_launch(s).dump() for s in await controls.dark_launches(state_of(request).store)]


@router.post("/dark-launches/{workflow}", response_model=views.DarkLaunch)
async def set_dark_launch(
    workflow: Workflow, body: bodies.DarkLaunchBody, request: Request, token: Govern
) -> Any:
    """Enable a workflow's dark launch at `percentage`, or disable it (admin: a workflow's runs
    are every tenant's)."""
    st = state_of(request)
    await tenancy.scope_allowed(
        st.store, token.tenant, ScopeKind.GLOBAL, None, admin=token.allows("admin")
    )
    standing = await controls.set_dark_launch(
        st.store,
        workflow,
        percentage=body.percentage,
        enabled=body.enabled,
        by=actor(token),
        wake=st.wake,
    )
    return _launch(standing).dump()
