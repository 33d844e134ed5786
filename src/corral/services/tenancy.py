"""A tenant's view of the jobs, for the edges that serve several tenants (the HTTP API): a job
of another tenant is "not found" exactly as a missing one is, so that its existence does not
leak; a job is named by its whole id (a prefix could match another tenant's job)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

from corral.core.ports import JobGovernance, JobQuery, JobStore
from corral.domain.errors import InvalidRequest, NotFound, NotPermitted
from corral.domain.governance import Approval, ScopeKind
from corral.domain.models import Job
from corral.domain.states import JobState
from corral.services import approvals


class Scoped(Protocol):
    """A control with a scope: a kill switch or a pause."""

    @property
    def scope(self) -> ScopeKind: ...

    @property
    def target(self) -> str | None: ...


C = TypeVar("C", bound=Scoped)
SCAN_CAP = 10_000  # records a tenant's incidents, runs or `purge all` read at most (newest first)


def missing(ref: str) -> NotFound:
    return NotFound(f"no job {ref}")


async def job_of(store: JobStore, ref: str, tenant: str) -> Job:
    """The job whose whole id is `ref`, when it is `tenant`'s; NotFound otherwise."""
    try:
        job = await store.get_job(ref)
    except (NotFound, InvalidRequest):  # a short or ambiguous reference: no whole id either
        raise missing(ref) from None
    if job.id != ref or job.tenant != tenant:
        raise missing(ref)
    return job


def tenant_for_submission(token_tenant: str, asked: str | None, *, admin: bool) -> str:
    """The tenant a submission runs under: the token's; another only for an admin token."""
    if asked is None or asked == token_tenant:
        return token_tenant
    if not admin:
        raise NotPermitted(
            f"this token submits for tenant {token_tenant!r} only; naming "
            f"tenant {asked!r} needs the admin scope"
        )
    return asked


@dataclass(frozen=True, slots=True)
class Page:
    """A page of jobs, newest first, and the cursor of the next page (None: the last one)."""

    jobs: list[Job]
    next_cursor: str | None


async def jobs_of(
    store: JobStore,
    tenant: str,
    *,
    state: JobState | None = None,
    role: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
    dead_lettered: bool = False,
    ref: str | None = None,
) -> Page:
    """`tenant`'s jobs (newest first) older than the job `cursor` names (None: from the newest),
    a page read by the store itself (the tenant and the cursor are part of its query)."""
    found = await store.list_jobs(
        JobQuery(
            state=state,
            role=role,
            limit=limit + 1,  # one more: whether a next page exists
            dead_lettered_unresolved=dead_lettered,
            tenant=tenant,
            before=cursor,
            ref=ref,
        )
    )
    page = found[:limit]
    return Page(page, page[-1].id if len(found) > limit else None)


async def dead_letters_to_purge(
    store: JobStore, tenant: str, refs: list[str], *, every: bool
) -> list[str]:
    """The ids of `tenant`'s jobs to purge from the dead-letter queue: those named (each must
    be the tenant's) and, with `every`, every dead-lettered one of the tenant's."""
    if not refs and not every:
        raise InvalidRequest("name the jobs to purge, or pass all")
    chosen = [(await job_of(store, r, tenant)).id for r in refs]
    if every:
        chosen += [
            j.id for j in (await jobs_of(store, tenant, limit=SCAN_CAP, dead_lettered=True)).jobs
        ]
    return list(dict.fromkeys(chosen))


# ---- governance for a tenant ------------------------------------------------------------------


async def scope_allowed(
    store: JobStore, tenant: str, scope: ScopeKind, target: str | None, *, admin: bool
) -> None:
    """Whether a caller of `tenant` may set a control in this scope: an admin any; otherwise
    its own tenant, or one of its tenant's jobs (whole id). Global and role controls reach
    every tenant: NotPermitted."""
    if admin:
        return
    if scope is ScopeKind.TENANT and target == tenant:
        return
    if scope is ScopeKind.JOB and target:
        await job_of(store, target, tenant)
        return
    raise NotPermitted(
        f"a control in scope {scope.value}"
        f"{' ' + target if target else ''} reaches beyond tenant {tenant!r}: "
        "it needs the admin scope"
    )


async def visible_controls(
    store: JobStore, records: list[C], tenant: str, *, admin: bool
) -> list[C]:
    """The controls a caller of `tenant` sees: every global and role one (they apply to it),
    its tenant's and its jobs' (an admin sees all)."""
    out = []
    for r in records:
        try:
            if admin or r.scope in (ScopeKind.GLOBAL, ScopeKind.ROLE):
                out.append(r)
            else:
                await scope_allowed(store, tenant, r.scope, r.target, admin=False)
                out.append(r)
        except (NotFound, NotPermitted):
            continue
    return out


async def approvals_of(store: JobGovernance, tenant: str, *, state: str | None) -> list[Approval]:
    """The approvals of `tenant`'s jobs, oldest first."""
    found = await approvals.list_approvals(store, state=state, job=None)
    tenants = {j: (await store.get_job(j)).tenant for j in {a.job_id for a in found}}
    return [a for a in found if tenants[a.job_id] == tenant]


async def approval_of(store: JobGovernance, approval_id: str, tenant: str) -> Approval:
    """The approval with this id when its job is `tenant`'s; NotFound otherwise."""
    try:
        found = await store.approval(approval_id)
        await job_of(store, found.job_id, tenant)
    except (NotFound, InvalidRequest):  # a short or ambiguous reference too
        raise NotFound(f"no approval {approval_id}") from None
    if found.id != approval_id:
        raise NotFound(f"no approval {approval_id}")
    return found
