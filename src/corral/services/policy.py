"""`policy check`'s question: would a job of this role be dispatched now? The pure pre-run
decision (policy/prerun.py) over the snapshot the engine's gate would read (runtime/gate.py);
nothing is recorded."""

from __future__ import annotations

import time
from collections.abc import Callable

from corral.config import Config
from corral.core.ports import JobGovernance, Operations
from corral.domain import bounds
from corral.domain.errors import InvalidRequest
from corral.domain.settings import Settings
from corral.policy import prerun
from corral.runtime.published import active_config

CHECK_JOB_ID = "(would-be job)"  # no job-scoped switch can match a job that does not exist


def _estimate(cfg: Config, role: str, given: float | None) -> float:
    spec = cfg.settings.roles.get(role)
    if spec is None:
        raise InvalidRequest(
            f"unknown role {role!r} (configured: {', '.join(sorted(cfg.settings.roles)) or 'none'})"
        )
    if given is None:
        return spec.cost_estimate_usd
    return bounds.usd("--estimate-usd", given)


async def _check_input(
    st: JobGovernance, settings: Settings, job: prerun.JobRef, estimate: float, now: float
) -> prerun.PrerunInput:
    """The snapshot the engine's gate would read for this job (runtime/gate.py), with the
    approval a role with `requires_approval` asks for at submission (step 6)."""
    tenant = settings.tenants.get(job.tenant)
    limit = tenant.max_parallel_runs if tenant else None
    states = []
    for c in await st.budgets():
        if job.matches(c.scope, c.target):
            status = await st.budget_status(c.scope, c.target, prerun.period_start(c.period, now))
            states.append(
                prerun.BudgetState(ceiling=c, spent_usd=status.spent, reserved_usd=status.reserved)
            )
    return prerun.PrerunInput(
        job=job,
        kill_switches=await st.kill_switches(active_at=now),
        pauses=await st.pauses(active_only=True),
        budgets=states,
        estimate_usd=estimate,
        active_job_ids=frozenset(await st.active_runs(job.tenant) if limit is not None else ()),
        max_parallel_runs=limit,
        dark_launch=await st.dark_launch(job.workflow) if job.workflow else None,
        approval_roles=frozenset(name for name, r in settings.roles.items() if r.requires_approval),
    )


async def check(
    store: Operations,
    local: Config,
    *,
    role: str,
    tenant: str,
    workflow: str | None,
    estimate_usd: float | None,
    clock: Callable[[], float] = time.time,
) -> prerun.PrerunDecision:
    """The pre-run decision for a would-be job of `role` now, against the roles the engine runs
    (`estimate_usd` None: the role's cost_estimate_usd)."""
    job = prerun.JobRef(id=CHECK_JOB_ID, role=role, tenant=tenant, workflow=workflow or None)
    now = clock()
    active, _ = await active_config(store, local)
    inp = await _check_input(
        store, active.settings, job, _estimate(active, role, estimate_usd), now
    )
    return prerun.decide(inp, now)
