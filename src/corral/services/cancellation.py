"""Stopping a job: who may, then the store's stop request (which reaches the jobs it submitted
unless their role is detached: store/cascade.py)."""

from __future__ import annotations

from dataclasses import dataclass

from corral.config import Config
from corral.core.ports import JobGovernance, JobStore
from corral.domain.errors import NotPermitted
from corral.domain.models import Job
from corral.services import Wake
from corral.services.submissions import submissions


@dataclass(frozen=True, slots=True)
class Cancelled:
    """The job after the stop request, and whether a running engine heard of it (else the
    next engine to start stops it)."""

    job: Job
    engine_answered: bool


async def cancel(
    store: JobGovernance, config: Config, ref: str, *, reason: str, caller: str | None, wake: Wake
) -> Cancelled:
    """Cancel a job (Conflict when it has already ended). One of the engine's jobs (`caller`)
    may cancel itself and the jobs it submitted (its descendants), not anyone else's:
    NotPermitted. `caller` None: the operator, who may cancel any job."""
    if caller is not None:
        await _check_descendant(store, ref, caller)
    job = await submissions(store, config).cancel(ref, reason)
    return Cancelled(job, wake("wake") is not None)


async def _check_descendant(store: JobStore, ref: str, caller: str) -> None:
    target = await store.get_job(ref)
    seen, cursor = set(), target
    while cursor.id != caller and cursor.parent_id and cursor.id not in seen:
        seen.add(cursor.id)
        cursor = await store.get_job(cursor.parent_id)
    if cursor.id != caller:
        raise NotPermitted(
            f"refused: job {caller} may cancel itself and the jobs it "
            f"submitted, not job {target.id}"
        )
