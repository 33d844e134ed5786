"""`/api/v1` governance: kill switches, pauses and approvals for the caller's tenant
(services/controls.py, services/approvals.py; who may set what: services/tenancy.py). Every
control and decision is recorded as made by `token:<id>`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from corral.domain.errors import NotFound
from corral.domain.governance import ApprovalState
from corral.domain.tokens import ApiToken
from corral.schemas import api as bodies
from corral.schemas import views
from corral.services import approvals, controls, tenancy

from .auth import Approve, Govern, actor
from .state import ApiState, state_of

router = APIRouter(prefix="/api/v1", tags=["governance"])
KillSwitchView: Any = views.KillSwitch
PauseView: Any = views.Pause
ApprovalView: Any = views.Approval


def _target(body: bodies.ControlBody | bodies.ResumeBody, token: ApiToken) -> str | None:
    """A tenant-scoped control without a target is the caller's own tenant."""
    if body.scope.value == "tenant" and body.target is None:
        return token.tenant
    return body.target


async def _allowed(
    st: ApiState, token: ApiToken, body: bodies.ControlBody | bodies.ResumeBody
) -> str | None:
    target = _target(body, token)
    await tenancy.scope_allowed(
        st.store, token.tenant, body.scope, target, admin=token.allows("admin")
    )
    return target


@router.get("/kill-switches", response_model=list[KillSwitchView])
async def kill_switches(request: Request, token: Govern) -> Any:
    """The kill switches active now that apply to the caller's tenant."""
    st = state_of(request)
    found = await tenancy.visible_controls(
        st.store, await controls.kill_switches(st.store), token.tenant, admin=token.allows("admin")
    )
    return [views.record(s).dump() for s in found]


@router.post("/kill-switches", status_code=201, response_model=KillSwitchView)
async def kill_switch_on(body: bodies.KillSwitchBody, request: Request, token: Govern) -> Any:
    """Deny new runs in a scope and stop the running ones (beyond the caller's tenant: admin)."""
    st = state_of(request)
    target = await _allowed(st, token, body)
    switch = await controls.kill_switch_on(
        st.store,
        scope=body.scope,
        target=target,
        reason=body.reason,
        expires_in=body.expires_in_s,
        by=actor(token),
        wake=st.wake,
    )
    return views.record(switch).dump()


@router.post("/kill-switches/{switch_id}/lift", response_model=KillSwitchView)
async def kill_switch_off(switch_id: str, request: Request, token: Govern) -> Any:
    """Lift one active kill switch the caller may set."""
    st = state_of(request)
    visible = await tenancy.visible_controls(
        st.store, await controls.kill_switches(st.store), token.tenant, admin=token.allows("admin")
    )
    mine = [s for s in visible if s.id == switch_id]
    if not mine:
        raise NotFound(f"no active kill switch {switch_id}")
    await tenancy.scope_allowed(
        st.store, token.tenant, mine[0].scope, mine[0].target, admin=token.allows("admin")
    )
    lifted = await controls.kill_switch_off(
        st.store,
        switch_id=switch_id,
        scope=mine[0].scope,
        target=mine[0].target,
        by=actor(token),
        wake=st.wake,
    )
    return views.record(lifted[0]).dump()


@router.get("/pauses", response_model=list[PauseView])
async def pauses(request: Request, token: Govern) -> Any:
    """The active pauses that apply to the caller's tenant."""
    st = state_of(request)
    found = await tenancy.visible_controls(
        st.store, await st.store.pauses(active_only=True), token.tenant, admin=token.allows("admin")
    )
    return [views.record(p).dump() for p in found]


@router.post("/pauses", status_code=201, response_model=PauseView)
async def pause(body: bodies.ControlBody, request: Request, token: Govern) -> Any:
    """Stop dispatching new runs in a scope; running attempts finish."""
    st = state_of(request)
    target = await _allowed(st, token, body)
    made = await controls.pause(
        st.store, scope=body.scope, target=target, reason=body.reason, by=actor(token), wake=st.wake
    )
    return views.record(made).dump()


@router.post("/pauses/resume", response_model=list[PauseView])
async def resume(body: bodies.ResumeBody, request: Request, token: Govern) -> Any:
    """Lift every active pause of exactly this scope."""
    st = state_of(request)
    target = await _allowed(st, token, body)
    lifted = await controls.resume(
        st.store, scope=body.scope, target=target, by=actor(token), wake=st.wake
    )
    return [views.record(p).dump() for p in lifted]


@router.get("/approvals", response_model=list[ApprovalView])
async def approvals_list(
    request: Request, token: Approve, state: ApprovalState | None = None
) -> Any:
    """Approvals of the caller's tenant's jobs, oldest first."""
    found = await tenancy.approvals_of(
        state_of(request).store, token.tenant, state=state.value if state else None
    )
    return [views.record(a).dump() for a in found]


async def _decide(
    request: Request,
    token: ApiToken,
    approval_id: str,
    approve: bool,
    body: bodies.DecisionBody | None,
) -> Any:
    st = state_of(request)
    await tenancy.approval_of(st.store, approval_id, token.tenant)
    decided = await approvals.decide(
        st.store,
        st.config,
        approval_id,
        approve=approve,
        by=actor(token),
        wake=st.wake,
        note=(body or bodies.DecisionBody()).note,
    )
    return views.record(decided).dump()


@router.post("/approvals/{approval_id}/approve", response_model=ApprovalView)
async def approve(
    approval_id: str, request: Request, token: Approve, body: bodies.DecisionBody | None = None
) -> Any:
    """Approve: the run is released (or the tool call allowed); recorded as the token's."""
    return await _decide(request, token, approval_id, True, body)


@router.post("/approvals/{approval_id}/deny", response_model=ApprovalView)
async def deny(
    approval_id: str, request: Request, token: Approve, body: bodies.DecisionBody | None = None
) -> Any:
    """Deny: the job is denied (or the tool call refused); recorded as the token's."""
    return await _decide(request, token, approval_id, False, body)
