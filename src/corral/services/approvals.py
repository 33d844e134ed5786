"""Actions waiting for a human: list them, approve or deny one (recording who decided)."""

from __future__ import annotations

from corral.config import Config
from corral.core.ports import JobGovernance, Operations
from corral.domain.errors import InvalidRequest
from corral.domain.governance import Approval, ApprovalState
from corral.services import Wake
from corral.services.submissions import active_submissions


async def list_approvals(
    store: JobGovernance, *, state: str | None, job: str | None
) -> list[Approval]:
    """Approvals, oldest first; `state` one of ApprovalState's values (None: every state),
    `job` a job id or a unique prefix or suffix of one."""
    job_id = (await store.get_job(job)).id if job else None
    try:
        wanted = ApprovalState(state) if state else None
    except ValueError:
        raise InvalidRequest(f"unknown approval state {state!r}") from None
    return await store.approvals(job_id=job_id, state=wanted)


async def decide(
    store: Operations,
    local: Config,
    approval_id: str,
    *,
    approve: bool,
    by: str,
    wake: Wake,
    note: str = "",
) -> Approval:
    """`by`'s decision on an approval, against the engine's roles and scheduler settings: a run
    approval releases its job to the queue or denies it; a waiting agent learns it when the
    engine looks."""
    svc, _ = await active_submissions(store, local)
    decided = await svc.decide_approval(approval_id, approve, by=by, note=note)
    wake("wake")
    return decided
