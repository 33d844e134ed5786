"""`/api/v1` governance records: incidents, the unified runs, the policy log (the caller's
tenant's, `jobs:read`) and the audit check (`admin`: it covers every tenant). Each calls the
service `corral incidents|runs|policy log|audit verify` calls."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from corral.schemas import views
from corral.services import audit, queries, tenancy

from .auth import Admin, JobsRead
from .state import state_of

router = APIRouter(prefix="/api/v1", tags=["records"])
IncidentView: Any = views.Incident
RunView: Any = views.UnifiedRun  # both generated from their domain dataclasses
Limit = Annotated[int, Query(ge=1, le=1000)]


@router.get("/incidents", response_model=list[IncidentView])
async def incidents(
    request: Request,
    token: JobsRead,
    job: str | None = None,
    open_only: bool = False,
    limit: Limit = 50,
) -> Any:
    """Incidents of the tenant's jobs (of one job when given), newest first."""
    st = state_of(request)
    if job is not None:
        await tenancy.job_of(st.store, job, token.tenant)
    found = await queries.incidents(
        st.store, job=job, open_only=open_only, limit=limit, tenant=token.tenant
    )
    return [views.record(i).dump() for i in found.incidents]


@router.get("/runs", response_model=list[RunView])
async def runs(
    request: Request, token: JobsRead, state: str | None = None, limit: Limit = 50
) -> Any:
    """The unified read model of the tenant's jobs, newest first."""
    found = await queries.runs(
        state_of(request).store, limit=limit, state=state, tenant=token.tenant
    )
    return [RunView(**dataclasses.asdict(r)).dump() for r in found.runs]


@router.get("/policy-log", response_model=list[views.PolicyEvaluation])
async def policy_log(
    request: Request,
    token: JobsRead,
    job: str | None = None,
    stage: str | None = None,
    verdict: str | None = None,
    since_s: Annotated[float | None, Query(ge=0, le=1e9)] = None,
    limit: Limit = 50,
) -> Any:
    """Policy evaluations of the tenant's jobs, oldest first (the latest `limit`)."""
    st = state_of(request)
    if job is not None:
        await tenancy.job_of(st.store, job, token.tenant)
    f = queries.policy_filter(stage=stage, verdict=verdict, limit=limit, since_s=since_s)
    found = await queries.policy_log(st.store, f, job=job, tenant=token.tenant)
    return [views.PolicyEvaluation.of(e).dump() for e in found]


@router.get("/audit/verify", response_model=views.AuditReport)
async def audit_verify(request: Request, token: Admin) -> Any:
    """Every audit chain checked against the audit key and the signed checkpoints, and every
    append-only trigger in place (as `corral audit verify --json`)."""
    st = state_of(request)
    return views.AuditReport(**dataclasses.asdict(await audit.verify(st.store, st.config))).dump()
