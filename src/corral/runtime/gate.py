"""The pre-run gate: the seven-step pre-run policy (policy/prerun.py) applied where runs begin,
and the kill switch applied to what already runs.

Before the dispatcher asks the core for a permit, each job passes the gate: a kill switch in its
scope denies it for good (DENIED, `kill_switch_active`), a pause leaves it queued, a dark launch
that excludes its workflow denies it; the rest goes on. Every decision is appended as a policy
evaluation (stage `pre_run`) with the inputs it used — once per attempt and decision: a job that
waits out a long pause, or is allowed but waits for a permit (an open breaker), is recorded again
only when the decision changes, not on every dispatch round. Running attempts in the scope of
an active kill switch are stopped (KILLED): the dispatcher asks on every round and on every poke,
so `corral kill-switch on` reaches them within a second.

Switches and pauses are read from the store at most every `REFRESH_S`, or at once after a poke.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from corral.core.ports import JobGovernance
from corral.domain.agents import PolicyEvaluation
from corral.domain.governance import (
    BudgetCeiling,
    KillSwitch,
    Pause,
    PrerunVerdict,
    Reason,
    ScopeKind,
)
from corral.domain.models import AttemptResult, Job
from corral.domain.settings import Settings
from corral.policy import prerun
from corral.policy.guardrails import Guardrails, GuardVerdict
from corral.policy.redact import Redactor

REFRESH_S = 0.5
REMEMBERED = 20_000  # waiting jobs whose last recorded decision is kept (then the oldest go)


@dataclass(frozen=True, slots=True)
class Admission:
    verdict: PrerunVerdict
    reason: str
    message: str


# The job as it really runs (its sealed secrets back in) and a redactor of those secrets.
Reveal = Callable[[Job], tuple[Job, Redactor]]


class PrerunGate:
    def __init__(
        self,
        store: JobGovernance,
        settings: Settings | None = None,
        guardrails: Guardrails | None = None,
        clock: Callable[[], float] = time.time,
        reveal: Reveal | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.guardrails = guardrails
        self.clock = clock
        # Guardrails judge the command that will run, not the redacted one the store keeps (a
        # secret's value may be shell syntax); what they record is redacted again.
        self.reveal = reveal
        self._switches: list[KillSwitch] = []
        self._pauses: list[Pause] = []
        self._ceilings: list[BudgetCeiling] = []
        self._read_at = float("-inf")
        # job id → (attempt, verdict, reason) last recorded, while the job waits
        self._recorded: dict[str, tuple[int, str, str]] = {}
        self._allowed: list[PolicyEvaluation] = []  # admit's allows, for the attempts' write

    def stale(self) -> None:
        """Something may have changed (a poke): read again on the next look."""
        self._read_at = float("-inf")

    async def _refresh(self, now: float) -> None:
        if now - self._read_at < REFRESH_S:
            return
        self._switches = await self.store.kill_switches(active_at=now)
        self._pauses = await self.store.pauses(active_only=True)
        self._ceilings = await self.store.budgets()
        self._read_at = now

    def _ceilings_of(self, job: Job) -> list[BudgetCeiling]:
        return [
            c
            for c in self._ceilings
            if (c.scope is ScopeKind.TENANT and c.target == job.tenant)
            or (c.scope is ScopeKind.ROLE and c.target == job.role)
        ]

    def estimate(self, job: Job) -> float:
        """What an attempt of the job is expected to cost: its reservation."""
        role = self.settings.roles.get(job.role) if self.settings else None
        return role.cost_estimate_usd if role else 0.0

    async def _budgets(self, job: Job, now: float) -> list[prerun.BudgetState]:
        states = []
        for c in self._ceilings_of(job):
            status = await self.store.budget_status(
                c.scope, c.target, prerun.period_start(c.period, now)
            )
            states.append(
                prerun.BudgetState(ceiling=c, spent_usd=status.spent, reserved_usd=status.reserved)
            )
        return states

    async def _reserve(self, job: Job, now: float) -> bool:
        """Hold the job's estimate on each of its ceilings, atomically with the check: parallel
        runs cannot overshoot. All or nothing."""
        held = False
        for c in self._ceilings_of(job):
            if not await self.store.reserve_budget(
                c.scope,
                c.target,
                prerun.period_start(c.period, now),
                self.estimate(job),
                job.id,
                at=now,
            ):
                if held:
                    await self.store.commit_budget(job.id, 0.0, at=now)  # give back the others
                return False
            held = True
        return True

    async def settle(self, job: Job, result: AttemptResult) -> None:
        """An attempt ended: its reservations become its actual cost."""
        if self._ceilings_of(job):  # no ceiling, no reservation: no write on the hot path
            await self.store.commit_budget(job.id, result.cost_usd or 0.0, at=self.clock())

    async def overrun(self, job: Job, cost_so_far: float, now: float) -> bool:
        """Would the running attempt's cost so far cross one of its ceilings?"""
        await self._refresh(now)
        for state in await self._budgets(job, now):
            own = self.estimate(job)
            if prerun.crossed(state, cost_so_far, own_reservation=own):
                return True
        return False

    async def _active_by_tenant(self, jobs: Iterable[Job]) -> dict[str, set[str]]:
        """Active runs of the tenants that have a parallel limit (only those are read)."""
        limited = {j.tenant for j in jobs if self._parallel_limit(j) is not None}
        if not limited:
            return {}
        return {t: set(await self.store.active_runs(t)) for t in limited}

    def _parallel_limit(self, job: Job) -> int | None:
        tenant = self.settings.tenants.get(job.tenant) if self.settings else None
        return tenant.max_parallel_runs if tenant else None

    async def admit(self, jobs: Iterable[Job], now: float) -> dict[str, Admission]:
        """The pre-run verdict of each job about to be dispatched. A deny or a hold is recorded
        here, before anything acts on it; an allow is kept for `take_allowed`: the dispatcher
        writes it in the transaction that starts the attempts it let in (one commit less per
        dispatch round on the way to RUNNING: bench/run.py LAT)."""
        await self._refresh(now)
        jobs = list(jobs)
        active = await self._active_by_tenant(jobs)
        out: dict[str, Admission] = {}
        records: list[PolicyEvaluation] = []
        for job in jobs:
            e = await self._evaluate(job, active, now)
            if e.verdict == "allow" and job.tenant in active:
                active[job.tenant].add(job.id)  # the batch's own admissions count too
            out[job.id] = Admission(
                verdict=PrerunVerdict(e.verdict), reason=e.reason, message=e.message
            )
            if self._changed(job.id, e):
                (self._allowed if e.verdict == "allow" else records).append(e)
        if records:
            await self.store.append_policy_evaluations(records)
        return out

    def take_allowed(self) -> list[PolicyEvaluation]:
        """The allows `admit` decided and nobody has written yet (then none)."""
        allowed, self._allowed = self._allowed, []
        return allowed

    async def record(self, evaluations: list[PolicyEvaluation]) -> None:
        """Write allows whose jobs start no attempt this round (no permit yet, no core)."""
        if not evaluations:
            return
        try:
            await self.store.append_policy_evaluations(evaluations)
        except BaseException:
            self.unwritten(evaluations)
            raise

    def unwritten(self, evaluations: Iterable[PolicyEvaluation]) -> None:
        """Their write failed: each is recorded again the next time its job is admitted."""
        for e in evaluations:
            self._recorded.pop(e.job_id, None)

    def _changed(self, job_id: str, e: PolicyEvaluation) -> bool:
        """Whether this decision differs from the last one recorded for the job's attempt."""
        key = (e.attempt or 0, e.verdict, e.reason)
        if self._recorded.get(job_id) == key:
            return False
        if e.verdict == PrerunVerdict.DENY.value:  # decided for good: nothing to remember
            self._recorded.pop(job_id, None)
            return True
        self._recorded[job_id] = key
        if len(self._recorded) > REMEMBERED:  # forget the oldest; worst case one more record
            for old in list(self._recorded)[: REMEMBERED // 4]:
                del self._recorded[old]
        return True

    def dispatched(self, job_ids: Iterable[str]) -> None:
        """These jobs' attempts started: nothing to remember until their next attempt waits."""
        for job_id in job_ids:
            self._recorded.pop(job_id, None)

    async def at_submit(self, job: Job, now: float) -> PolicyEvaluation:
        """The pre-run evaluation of a job being submitted: a deny stores it DENIED at once (it
        is never queued). Nothing is reserved yet: that happens when it is dispatched, where the
        same policy is applied again to what has changed meanwhile."""
        await self._refresh(now)
        active = await self._active_by_tenant([job])
        return await self._evaluate(job, active, now, reserve=False)

    async def _evaluate(
        self, job: Job, active: dict[str, set[str]], now: float, *, reserve: bool = True
    ) -> PolicyEvaluation:
        """The seven steps, then the guardrails at spawn, then the budget reservation."""
        ref = prerun.JobRef.of(job)
        launch = await self.store.dark_launch(ref.workflow) if ref.workflow else None
        d = prerun.decide(
            prerun.PrerunInput(
                job=ref,
                kill_switches=self._switches,
                pauses=self._pauses,
                budgets=await self._budgets(job, now),
                estimate_usd=self.estimate(job),
                active_job_ids=frozenset(active.get(job.tenant, ())),
                max_parallel_runs=self._parallel_limit(job),
                dark_launch=launch,
            ),
            now,
        )
        e = PolicyEvaluation(
            at=now,
            job_id=job.id,
            attempt=job.attempts + 1,
            stage=prerun.PRE_RUN_STAGE,
            subject=d.step.value,
            verdict=d.verdict.value,
            reason=d.reason.value,
            message=d.message,
            inputs=d.snapshot,
        )
        if e.verdict != "allow":
            return e
        guard = self._spawn_guardrails(job)
        if guard is not None:
            return replace(
                e,
                stage="guardrail",
                subject="spawn",
                verdict="deny",
                reason=guard.reason,
                message=guard.message,
                inputs={
                    **d.snapshot,
                    "guardrail": {
                        "rule": guard.rule_id,
                        "verdict": guard.verdict,
                        "command": guard.command,
                    },
                },
            )
        if reserve and not await self._reserve(job, now):  # another took the room meanwhile
            return replace(
                e,
                subject=prerun.Step.BUDGET.value,
                verdict="deny",
                reason=Reason.BUDGET_CEILING_EXCEEDED.value,
                message="budget ceiling reached while reserving this run",
            )
        return e

    def _spawn_guardrails(self, job: Job) -> GuardVerdict | None:
        """Guardrails at spawn: a command job's command is checked like an agent's tool call;
        the verdict when it is not allowed (a spawn cannot wait for an approval: its role can
        require one for every run instead)."""
        if self.guardrails is None or not job.command or job.prompt:
            return None
        real, redactor = self.reveal(job) if self.reveal else (job, Redactor())
        g = self.guardrails.spawn_check(job.role, real.command)  # as `corral guard check` does
        if g is None or g.verdict == "allow":
            return None
        g = replace(
            g,
            message=redactor.text(g.message),
            command=redactor.text(g.command) if g.command else g.command,
            approval_subject=(
                redactor.text(g.approval_subject) if g.approval_subject else g.approval_subject
            ),
        )
        if g.verdict == "require_approval":
            return replace(
                g,
                message=f"guardrail {g.rule_id}: `{g.approval_subject}` needs a "
                "human's approval; submit it in a role with requires_approval",
            )
        return replace(g, message=f"guardrail {g.rule_id}: {g.message}")

    async def to_kill(self, running: Iterable[Job], now: float) -> list[tuple[Job, KillSwitch]]:
        """Running jobs in the scope of an active kill switch, with the switch."""
        await self._refresh(now)
        if not self._switches:
            return []
        found = []
        for job in running:
            ref = prerun.JobRef.of(job)
            for switch in self._switches:
                if switch.active(now) and ref.matches(switch.scope, switch.target):
                    found.append((job, switch))
                    break
        return found

    def paused(self) -> list[Pause]:
        return list(self._pauses)

    async def holds_everything(self, now: float) -> bool:
        """Whether no queued job can be admitted, whichever it is: a global pause is in force
        and no kill switch (the one step before the pause) could deny a job instead."""
        await self._refresh(now)
        return not any(s.active(now) for s in self._switches) and any(
            p.active() and p.scope is ScopeKind.GLOBAL for p in self._pauses
        )
