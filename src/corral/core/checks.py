"""The permit decision: every check a request passes, in order, before anything is taken.

Order (first refusal wins, so the reason names the most fundamental obstacle):
0. the attempt itself (core/attempts.py, all final): MAX_ATTEMPTS, ATTEMPT_REPEATED,
   TIMEOUT_TOO_LONG, RETRY_BUDGET_EXHAUSTED (time window, then cost);
1. DUPLICATE_PERMIT — the job already holds a live permit;
2. FATAL_MODE — a global safe stop, or the job's workspace is locked;
3. GLOBAL_SHED / QUEUE_STALL — the watchdog sheds jobs of priority ≥ `shed_min_priority`;
4. worker kind — the job's kind if it is neither isolated (FATAL_MODE) nor behind an open
   breaker (CIRCUIT_OPEN), else the first of its role's `fallback_workers` that the core runs,
   is not isolated and whose breaker is CLOSED; then the provider and model breakers;
5. BUDGET_EXHAUSTED — concurrency of role, environment, worker kind, tenant (throttled caps
   while the watchdog throttles: QUEUE_STALL when stalls drive it);
6. RATE_LIMIT — token buckets of role, worker kind, provider;
7. BUDGET_EXHAUSTED — the tenant's cost allowance for the period.
Nothing is taken until every check passed (tokens, slots and half-open probes are taken on issue).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from corral.core import attempts
from corral.core.attempts import AttemptLedger
from corral.core.breakers import CLOSED, HALF_OPEN, BreakerBoard, breaker_names, remote_envs
from corral.core.budgets import CostLedger, RateLimits
from corral.core.escalation import Escalations
from corral.core.permits import (
    BUDGET_EXHAUSTED,
    CIRCUIT_OPEN,
    DUPLICATE_PERMIT,
    FATAL_MODE,
    GLOBAL_SHED,
    QUEUE_STALL,
    RATE_LIMIT,
    PermitGate,
    Rejected,
)
from corral.core.watchdog import QUEUE_LAG, SHED, Watchdog
from corral.domain.models import Job
from corral.domain.settings import RetryBudget


@dataclass(frozen=True, slots=True, kw_only=True)
class Passed:
    """A request that passed every check: the kind it runs as and the breakers it answers to."""

    worker: str
    breakers: tuple[str, ...]

    def breaker_state(self, board: BreakerBoard) -> str:
        """HALF_OPEN when this permit will be a probe, else CLOSED."""
        states = [board.state(n) for n in self.breakers]
        return HALF_OPEN if HALF_OPEN in states else CLOSED


def queue_lag_ms(job: Job, now: float) -> float:
    """How long the job has waited for this attempt (attempt 1: since submission; later: since
    it was queued again, which is the job's last update)."""
    since = job.created_at if job.attempts == 0 else job.updated_at
    return max(0.0, (now - since) * 1000.0)


class PermitChecks:
    """Runs the checks against the core's mechanism; takes nothing."""

    def __init__(
        self,
        *,
        gate: PermitGate,
        breakers: BreakerBoard,
        rates: RateLimits,
        costs: CostLedger,
        watchdog: Watchdog,
        escalations: Escalations,
        kinds: Callable[[], Collection[str]],
        ledger: AttemptLedger,
    ) -> None:
        self.gate = gate
        self.ledger = ledger
        self.breakers = breakers
        self.rates = rates
        self.costs = costs
        self.watchdog = watchdog
        self.escalations = escalations
        self.kinds = kinds
        self.settings = gate.settings
        self.remote_envs = remote_envs(gate.settings)

    def budget(self, job: Job) -> RetryBudget:
        """The role's retry budget (an unknown role has none beyond the job's own limits)."""
        role = self.settings.roles.get(job.role)
        return role.retry_budget if role else RetryBudget()

    def decide(self, job: Job, index: int, now: float) -> Passed | Rejected:
        early = (
            attempts.decide(job, index, self.ledger.get(job.id), self.budget(job), now)
            or self._duplicate(job)
            or self._fatal(job)
            or self._shed(job)
        )
        if early is not None:
            return early
        self.watchdog.sample(QUEUE_LAG, queue_lag_ms(job, now), now, job.worker)
        picked = self._pick(job, now)
        if isinstance(picked, Rejected):
            return picked
        refused = (
            self._slots(job, picked.worker)
            or self._rate(job, picked.worker, now)
            or self._cost(job, now)
        )
        return refused or picked

    # ---- the checks ----------------------------------------------------------------------

    def _duplicate(self, job: Job) -> Rejected | None:
        holder = self.gate.holder(job.id)
        if holder is None:
            return None
        return Rejected(
            reason=DUPLICATE_PERMIT, message=f"job {job.id} already holds permit {holder}"
        )

    def _fatal(self, job: Job) -> Rejected | None:
        stop = self.escalations.safe_stop
        if stop is not None:
            final = self.settings.escalation.safe_stop_queued == "fail"
            return Rejected(
                reason=FATAL_MODE,
                final=final,
                message=f"safe stop: escalation {stop.id} ({stop.reason})",
            )
        locked = self.escalations.locked(job.workspace)
        if locked is not None:
            return Rejected(
                reason=FATAL_MODE,
                message=f"workspace {job.workspace} is locked by escalation "
                f"{locked.id} ({locked.reason})",
            )
        return None

    def _shed(self, job: Job) -> Rejected | None:
        spec = self.settings.watchdog
        if self.watchdog.stage < SHED or job.priority < spec.shed_min_priority:
            return None
        reason = QUEUE_STALL if self.watchdog.stall_driven else GLOBAL_SHED
        return Rejected(
            reason=reason,
            retry_after_s=spec.recover_s,
            message=f"shedding priority ≥ {spec.shed_min_priority} while "
            f"{self.watchdog.cause} is high",
        )

    def _candidates(self, job: Job) -> list[str]:
        role = self.settings.roles.get(job.role)
        fallbacks = role.fallback_workers if role else ()
        runnable = self.kinds()
        return [job.worker] + [k for k in fallbacks if k != job.worker and k in runnable]

    def _usable(self, kind: str, primary: bool, now: float) -> bool:
        if self.escalations.isolated(kind) is not None:
            return False
        name = f"worker:{kind}"
        if primary:  # the job's own kind may be the half-open probe
            return self.breakers.admits(name, now)
        return self.breakers.state(name) == CLOSED

    def _pick(self, job: Job, now: float) -> Passed | Rejected:
        kind = next(
            (k for i, k in enumerate(self._candidates(job)) if self._usable(k, i == 0, now)), None
        )
        if kind is None:
            return self._no_worker(job, now)
        names = tuple(breaker_names(job, kind, self.remote_envs))
        # environment, provider and model breakers: no fallback can avoid them
        for name in (n for n in names if n != f"worker:{kind}"):
            if not self.breakers.admits(name, now):
                b = self.breakers.get(name)
                return Rejected(
                    reason=CIRCUIT_OPEN,
                    retry_after_s=b.retry_after(now),
                    message=f"breaker {name} is {b.state}",
                )
        return Passed(worker=kind, breakers=names)

    def _no_worker(self, job: Job, now: float) -> Rejected:
        isolated = self.escalations.isolated(job.worker)
        if isolated is not None:
            return Rejected(
                reason=FATAL_MODE,
                message=f"worker kind {job.worker} is isolated by escalation "
                f"{isolated.id} ({isolated.reason})",
            )
        b = self.breakers.get(f"worker:{job.worker}")
        why = "a probe is in flight" if b.state == HALF_OPEN else f"since {b.reason}"
        return Rejected(
            reason=CIRCUIT_OPEN,
            retry_after_s=b.retry_after(now),
            message=f"breaker {b.name} is {b.state} ({why}); no fallback available",
        )

    def _slots(self, job: Job, kind: str) -> Rejected | None:
        refused = self.gate.check(job, kind)
        if refused is None or self.gate.cap_factor >= 1.0:
            return refused
        if self.gate.check(job, kind, factor=1.0) is not None:
            return refused  # full even without the throttle
        reason = QUEUE_STALL if self.watchdog.stall_driven else BUDGET_EXHAUSTED
        return Rejected(
            reason=reason, message=f"throttled ×{self.gate.cap_factor:g}: {refused.message}"
        )

    def _rate(self, job: Job, kind: str, now: float) -> Rejected | None:
        wait, empty = self.rates.check(job, kind, now)
        if not empty:
            return None
        return Rejected(
            reason=RATE_LIMIT,
            retry_after_s=round(wait, 6),
            message=f"rate limit: {', '.join(empty)} out of tokens",
        )

    def _cost(self, job: Job, now: float) -> Rejected | None:
        left = self.costs.remaining(job.tenant, now)
        if left is None or left > 0:
            return None
        spec = self.settings.tenants[job.tenant]
        return Rejected(
            reason=BUDGET_EXHAUSTED,
            retry_after_s=round(self.costs.retry_after(job.tenant, now), 3),
            message=f"tenant {job.tenant} spent its {spec.period.value} allowance "
            f"of ${spec.cost_allowance_usd:g}",
        )
