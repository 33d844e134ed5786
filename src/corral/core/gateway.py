"""Worker delegation: permits in, processes out, results back.

The `Core` is the one place the mechanism lives: the permit gate and its
budgets, circuit breakers, the watchdog and escalation. It is driven only by the engine's calls
— `request_permit`, `launch`, `adopt`, `release`, `complete` for every attempt, `tick` every
~0.5 s, and the `note_*` / `report_metric` reports — each with the time it happens, and it tells
what it decided through `CoreEvent`s and `snapshot()`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from corral.core import attempts
from corral.core.attempts import AttemptLedger, JobAttempts
from corral.core.breakers import CLOSED, OPEN, BreakerBoard, breaker_names
from corral.core.budgets import CostLedger, RateLimits
from corral.core.checks import Passed, PermitChecks
from corral.core.escalation import GLOBAL, WORKER_KIND, Escalation, Escalations
from corral.core.events import (
    CRITICAL,
    INFO,
    PERMIT,
    REJECTION,
    WARNING,
    CoreEvent,
    Emitter,
    EventSink,
)
from corral.core.permits import FATAL_MODE, Grant, PermitGate, Rejected
from corral.core.ports import AttemptHandle, QueueFilter, WorkerAdapter
from corral.core.state import CoreState
from corral.core.watchdog import (
    CANCEL_LATENCY,
    ESCALATE,
    OPEN_BREAKERS,
    POINT_GAUGES,
    THROTTLE,
    StageChange,
    Watchdog,
)
from corral.domain.errors import InvalidRequest, NotFound, WorkerError
from corral.domain.models import Attempt, AttemptResult, Claimed, Job, Permit
from corral.domain.settings import EnvSpec, RetryBudget
from corral.domain.states import Fault, Outcome

CLUSTER_UNREACHABLE = "cluster_unreachable"  # why the health probe opened an env's breaker


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreOptions:
    """How much the core remembers, and where it starts from."""

    state: CoreState | None = None  # a previous core's state to resume (see `restore`)
    history: int = 20  # transitions kept per breaker for `snapshot`
    recent_jobs: int = 4096  # ended attempts remembered (job → worker kind) for ghost reports
    state_attempts: int = 1000  # per-job attempt counts handed on in `state()` (most recent)
    # asks a Ray environment's cluster whether it answers: None when it does, else why not
    # (runtime/engine.py gives workers/rayhealth.reachable; core/server.py calls it)
    cluster_probe: Callable[[EnvSpec], str | None] | None = None


@dataclass(slots=True)
class _Live:
    permit: Permit
    job: Job
    worker: str
    breakers: tuple[str, ...]
    stop_at: float | None = None
    adopted: bool = False  # found in flight after a restart, not started by this core
    reported_usd: float = 0.0  # cost reported over the protocol while it ran (`report_cost`)


class Core:
    """Holds the authority to permit and to start work; everything else asks it."""

    def __init__(
        self,
        gate: PermitGate,
        workers: Mapping[str, WorkerAdapter],
        options: CoreOptions | None = None,
        *,
        on_event: EventSink | None = None,
    ) -> None:
        self.gate = gate
        self.workers = dict(workers)
        self.options = options or CoreOptions()
        self.emit = Emitter(on_event)
        s = gate.settings
        self.breakers = BreakerBoard(s.breakers, self.emit, self.options.history)
        self.rates = RateLimits(s)
        self.costs = CostLedger(s.tenants)
        self.watchdog = Watchdog(s.watchdog, self.emit)
        self.escalations = Escalations(s.escalation, self.emit)
        self.attempts = AttemptLedger()
        self.checks = PermitChecks(
            gate=gate,
            breakers=self.breakers,
            rates=self.rates,
            costs=self.costs,
            watchdog=self.watchdog,
            escalations=self.escalations,
            kinds=lambda: self.workers,
            ledger=self.attempts,
        )
        self._live: dict[str, _Live] = {}  # by permit id
        self._recent: OrderedDict[str, str] = OrderedDict()  # job id → worker kind
        self._tenants: OrderedDict[str, str] = OrderedDict()  # job id → tenant (ended too)
        self._announced: set[str] = set()
        self._watchdog_opened: set[str] = set()
        self._now = 0.0
        if self.options.state is not None:
            self.restore(self.options.state)

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(self.workers)

    # ---- permits -------------------------------------------------------------------------

    def request_permit(self, job: Job, attempt_index: int, now: float) -> Permit | Rejected:
        """A permit for the job's next attempt, or a machine reason."""
        if attempt_index < 1:
            raise InvalidRequest(f"attempt index must be 1 or more, got {attempt_index}")
        self._now = max(self._now, now)
        decision = self.checks.decide(job, attempt_index, now)
        if isinstance(decision, Rejected):
            self._rejected(job, attempt_index, decision, now)
            return decision
        return self._issue(job, attempt_index, now, decision)

    def _issue(self, job: Job, attempt_index: int, now: float, adm: Passed) -> Permit:
        usage = self.gate.usage(job, adm.worker)
        tokens = self.rates.take(job, adm.worker, now)
        extra = {
            "slots": usage,
            "breakers": ",".join(f"{n}={self.breakers.state(n)}" for n in adm.breakers),
        }
        if tokens:
            extra["rate_tokens"] = ",".join(f"{n}={left:g}" for n, left in tokens.items())
        left = self.costs.remaining(job.tenant, now)
        if left is not None:
            extra["allowance_usd"] = f"{left:.6g}"
        if adm.worker != job.worker:
            extra["requested_worker"] = job.worker
        budget, seen = self.checks.budget(job), self.attempts.get(job.id)
        if budget.window_s is not None or budget.cost_usd is not None:
            extra["retry_budget"] = _budget_left(budget, seen, now)
        grant = Grant(
            worker=adm.worker,
            breaker=adm.breaker_state(self.breakers),
            extra=extra,
            deadline_at=attempts.deadline(job, seen, budget, now),
        )
        permit = self.gate.issue(job, attempt_index, now, grant)
        self.breakers.begin(adm.breakers, permit.id)
        self._track(permit, job, adm.worker, adm.breakers, now)
        return permit

    def _track(
        self,
        permit: Permit,
        job: Job,
        worker: str,
        breakers: tuple[str, ...],
        now: float,
        *,
        adopted: bool = False,
    ) -> None:
        self._live[permit.id] = _Live(
            permit=permit, job=job, worker=worker, breakers=breakers, adopted=adopted
        )
        self.watchdog.started(job.id, worker, now)

    def _rejected(self, job: Job, attempt_index: int, r: Rejected, now: float) -> None:
        self.emit(
            CoreEvent(
                kind=REJECTION,
                at=now,
                scope="job",
                name=job.id,
                state="rejected",
                severity=WARNING if r.reason == FATAL_MODE else INFO,
                reason=r.reason,
                message=r.message,
                data={
                    "job_id": job.id,
                    "attempt": attempt_index,
                    "role": job.role,
                    "worker": job.worker,
                    "tenant": job.tenant,
                    "priority": job.priority,
                    "retry_after_s": r.retry_after_s,
                    "final": r.final,
                },
            )
        )

    def ready(self, claimed: Claimed) -> None:
        """The blocking checks of the worker kind that will start the claimed attempt (see
        WorkerAdapter.ready); a caller with an event loop runs this in a thread."""
        worker = self.workers.get(claimed.permit.granted.get("worker", claimed.job.worker))
        if worker is not None:
            worker.ready()

    def launch(self, claimed: Claimed, now: float | None = None) -> AttemptHandle:
        """Start a claimed attempt with the worker kind its permit grants (a fallback kind when
        the job's own kind has an open breaker). The permit is used up here (PermitError with
        its reason when it does not authorise exactly this attempt) and checked again by the
        adapter. `now` defaults to the last time the core was told."""
        at = self._now if now is None else max(self._now, now)
        self._now = at
        self.gate.consume(claimed.permit, claimed.job, claimed.attempt, at)
        self.attempts.started(claimed.job.id, claimed.attempt.index, at)
        kind = claimed.permit.granted.get("worker", claimed.job.worker)
        worker = self.workers.get(kind)
        if worker is None:
            raise WorkerError(f"no worker adapter for kind {kind!r}")
        job = claimed.job if kind == claimed.job.worker else claimed.job.with_(worker=kind)
        return worker.start(claimed.permit, job, claimed.attempt)

    def adopt(
        self, job: Job, attempt: Attempt, now: float, *, worker: str | None = None
    ) -> tuple[Permit, AttemptHandle | AttemptResult]:
        """Re-admit an attempt found in flight after a restart (its permit is re-registered).

        `worker`: the kind the attempt ran as, when a fallback ran it (default: the job's)."""
        kind = worker or job.worker
        permit = self.gate.adopt(
            job, attempt.index, attempt.permit_id, attempt.deadline_at, now, worker=kind
        )
        adapter = self.workers.get(kind)
        if adapter is None:
            self.gate.release(permit)
            raise WorkerError(f"no worker adapter for kind {kind!r}")
        self._track(
            permit,
            job,
            kind,
            tuple(breaker_names(job, kind, self.checks.remote_envs)),
            now,
            adopted=True,
        )
        self.attempts.started(job.id, attempt.index, min(now, attempt.created_at))
        return permit, adapter.adopt(job if kind == job.worker else job.with_(worker=kind), attempt)

    def release(self, permit: Permit) -> None:
        """Give back a permit whose attempt never started (a lost claim)."""
        self.gate.release(permit)
        live = self._live.pop(permit.id, None)
        if live is not None:
            self.breakers.abandon(live.breakers, permit.id)
            self._forget(live)

    def complete(
        self, permit: Permit, job: Job, result: AttemptResult, now: float | None = None
    ) -> AttemptResult:
        """An attempt ended: release its permit and feed breakers, watchdog, escalation and
        cost (every terminal path comes through here; a second call for one permit is a no-op).
        Returns the result with its whole cost: the worker's plus what was reported for it.

        `now` defaults to the result's `ended_at`, else the last time the core was told."""
        at = self._time(now, result)
        self.gate.release(permit)
        live = self._live.pop(permit.id, None)
        if live is None:
            return result
        self._forget(live)
        if result.cost_usd:
            self.costs.add(job.tenant, result.cost_usd, at)
            self.attempts.charge(job.id, result.cost_usd)
        if live.reported_usd:
            result = replace(result, cost_usd=(result.cost_usd or 0.0) + live.reported_usd)
        if live.adopted and result.outcome is Outcome.LOST:
            # Lost while the control plane itself was down: our crash, not the worker's. It
            # must not open breakers or count as a crash loop (bench/ W3 found this).
            self.breakers.abandon(live.breakers, permit.id)
            return result
        stopped = live.stop_at is not None
        self.breakers.record(live.breakers, permit.id, result, at, stop_requested=stopped)
        self.watchdog.result(live.worker, result.outcome is Outcome.TIMED_OUT, at)
        self._cancel_latency(live, result, at)
        if _is_crash(result, stopped):
            self.escalations.crash(live.worker, at, result.describe())
        return result

    def report_cost(self, job_id: str, usd: float, now: float) -> dict[str, Any]:
        """Cost a scheduler (or the job, through it) reports for the job's attempt: charged at
        once to the tenant's allowance and the job's retry budget, like an agent's cost.

        NotFound when the core knows no attempt of that job; InvalidRequest for a cost that is
        not a finite number ≥ 0."""
        if not math.isfinite(usd) or usd < 0:
            raise InvalidRequest(f"cost must be a finite number of USD ≥ 0, got {usd!r}")
        self._now = max(self._now, now)
        live = self._live_of(job_id)
        seen = self.attempts.get(job_id)
        if live is None and seen is None:
            raise NotFound(f"no attempt of job {job_id} is known to this core")
        tenant = live.job.tenant if live is not None else self._tenants.get(job_id)
        if live is not None:
            live.reported_usd += usd
        if tenant is not None and usd:
            self.costs.add(tenant, usd, now)
        self.attempts.charge(job_id, usd)
        after = self.attempts.get(job_id)
        return {
            "job_id": job_id,
            "charged_usd": usd,
            "job_cost_usd": after.cost_usd if after else usd,
            "tenant": tenant,
            "tenant_remaining_usd": None if tenant is None else self.costs.remaining(tenant, now),
        }

    def _time(self, now: float | None, result: AttemptResult) -> float:
        at = now if now is not None else result.ended_at if result.ended_at else self._now
        self._now = max(self._now, at)
        return at

    def _forget(self, live: _Live) -> None:
        self.watchdog.ended(live.job.id)
        for memo, value in ((self._recent, live.worker), (self._tenants, live.job.tenant)):
            memo[live.job.id] = value
            memo.move_to_end(live.job.id)
            while len(memo) > self.options.recent_jobs:
                memo.popitem(last=False)

    def _cancel_latency(self, live: _Live, result: AttemptResult, at: float) -> None:
        asked = live.stop_at
        if asked is None and result.outcome is Outcome.TIMED_OUT:
            asked = live.permit.deadline_at  # the deadline is the core's own stop request
        if asked is not None:
            ended = result.ended_at if result.ended_at is not None else at
            self.watchdog.sample(CANCEL_LATENCY, max(0.0, ended - asked) * 1000.0, at, live.worker)

    def queue_filter(self) -> QueueFilter:
        """Roles, environments and worker kinds with no free slot (throttle included)."""
        roles, envs = self.gate.full()
        return QueueFilter(
            exclude_roles=roles, exclude_envs=envs, exclude_workers=self.gate.full_workers()
        )

    # ---- reports from the engine -----------------------------------------------------------

    def _live_of(self, job_id: str) -> _Live | None:
        permit_id = self.gate.holder(job_id)
        return None if permit_id is None else self._live.get(permit_id)

    def note_activity(self, job_id: str, now: float) -> None:
        """The attempt of this job produced output or events (resets its stall clock)."""
        self._now = max(self._now, now)
        self.watchdog.activity(job_id, now)

    def note_stop_requested(self, job_id: str, now: float) -> None:
        """A stop (cancel, kill, latest-wins) was sent to the job's attempt; the first counts."""
        live = self._live_of(job_id)
        if live is not None and live.stop_at is None:
            live.stop_at = now

    def report_metric(
        self, name: str, value: float, now: float, *, worker: str | None = None
    ) -> None:
        """A gauge sample measured outside the core (e.g. `workspace_lock_wait_ms`)."""
        if name not in POINT_GAUGES:
            raise InvalidRequest(f"unknown metric {name!r}; known: {sorted(POINT_GAUGES)}")
        self.watchdog.sample(name, float(value), now, worker)

    def note_cluster(self, env: str, error: str | None, now: float) -> None:
        """The health probe's finding on a Ray environment's cluster (`error` None: it answers).
        An unreachable cluster opens the environment's breaker and holds it open, so its jobs
        wait in the queue instead of failing against it; the watchdog records it. When the
        cluster answers again, the breaker this opened closes."""
        self._now = max(self._now, now)
        self.watchdog.cluster(env, error, now)
        name = f"env:{env}"
        if error is not None:
            self.breakers.held.add(name)
            self.breakers.force_open(name, now, CLUSTER_UNREACHABLE, {"env": env, "error": error})
            return
        if name not in self.breakers.held:
            return
        self.breakers.held.discard(name)
        b = self.breakers.get(name)
        if b.state != CLOSED and b.reason == CLUSTER_UNREACHABLE:
            self.breakers.reset(name, now, "cluster_reachable")

    def note_ghosts(self, job_id: str, pids: Iterable[int], now: float) -> Escalation | None:
        """Processes of this job survived its cancel and grace: FATAL."""
        live = self._live_of(job_id)
        kind = live.worker if live is not None else self._recent.get(job_id)
        return self.escalations.ghosts(job_id, kind, pids, now)

    def note_superseded(self, workspace: str, now: float) -> Escalation | None:
        """A latest-wins submission superseded running work on this workspace."""
        return self.escalations.superseded(workspace, now)

    # ---- time ----------------------------------------------------------------------------

    def tick(self, now: float) -> list[str]:
        """Periodic work: stalls, the defense stage and its actions. Returns the job ids the
        engine must stop now (a global safe stop with `safe_stop: cancel`), each once."""
        self._now = max(self._now, now)
        self.lapse(now)
        self.watchdog.scan_stalls(now)
        change = self.watchdog.evaluate(now)
        self._defend(change, now)
        return self._announce_cancels()

    def lapse(self, now: float) -> list[Permit]:
        """Unused permits past their deadline lapse: their slots are freed and each is recorded
        as a `permit` event; a lapsed permit starts nothing (PERMIT_EXPIRED)."""
        due = self.gate.due(now)
        for permit in due:
            live = self._live.pop(permit.id, None)
            self.gate.release(permit, expired=True)
            if live is not None:
                self.breakers.abandon(live.breakers, permit.id)
                self._forget(live)
            self.emit(
                CoreEvent(
                    kind=PERMIT,
                    at=now,
                    scope="job",
                    name=permit.job_id,
                    state="expired",
                    severity=WARNING,
                    reason="permit_expired",
                    message=f"permit {permit.id} for attempt {permit.attempt_index} of job "
                    f"{permit.job_id} lapsed unused at its deadline; its slots are free",
                    data={
                        "permit_id": permit.id,
                        "job_id": permit.job_id,
                        "attempt": permit.attempt_index,
                        "deadline_at": permit.deadline_at,
                        "granted": dict(permit.granted),
                    },
                )
            )
        return due

    def _defend(self, change: StageChange | None, now: float) -> None:
        stage = self.watchdog.stage
        self.gate.cap_factor = (
            self.gate.settings.watchdog.throttle_factor if stage >= THROTTLE else 1.0
        )
        if stage >= OPEN_BREAKERS:
            for kind in self.watchdog.involved(now, OPEN_BREAKERS):
                name = f"worker:{kind}"
                if name not in self._watchdog_opened:
                    self._watchdog_opened.add(name)
                    self.breakers.force_open(
                        name, now, "watchdog_open", {"gauge": self.watchdog.cause, "worker": kind}
                    )
        elif self._watchdog_opened:
            for name in sorted(self._watchdog_opened):  # undo what the stage did, nothing else
                b = self.breakers.get(name)
                if b.state == OPEN and b.reason == "watchdog_open":
                    self.breakers.reset(name, now, "watchdog_recovered")
            self._watchdog_opened.clear()
        if change is not None and change.after == ESCALATE > change.before:
            self._escalate_stage(now)

    def _escalate_stage(self, now: float) -> None:
        cause = self.watchdog.cause
        data = {"gauge": cause, "gauges": self.watchdog.values(now)}
        kinds = self.watchdog.involved(now, ESCALATE)
        for kind in kinds:
            self.escalations.open(
                WORKER_KIND,
                kind,
                "watchdog_escalate",
                now,
                f"watchdog: {cause} at escalation level for {kind}",
                data,
                severity=CRITICAL,
            )
        if not kinds:
            self.escalations.open(
                GLOBAL,
                "*",
                "watchdog_escalate",
                now,
                f"watchdog: {cause} at escalation level",
                data,
                severity=CRITICAL,
            )

    def safe_stop_cancels(self) -> list[str]:
        """Job ids of live attempts a global safe stop with `safe_stop: cancel` must stop."""
        if (
            self.escalations.safe_stop is None
            or self.gate.settings.escalation.safe_stop != "cancel"
        ):
            return []
        return sorted({v.job.id for v in self._live.values()})

    def _announce_cancels(self) -> list[str]:
        due = self.safe_stop_cancels()
        if not due:
            self._announced.clear()
            return []
        fresh = [j for j in due if j not in self._announced]
        self._announced.update(fresh)
        return fresh

    # ---- operators -----------------------------------------------------------------------

    def reset_breaker(self, name: str, now: float) -> None:
        """An operator closes a breaker (`worker:codex`, `provider:openai` or a bare kind)."""
        b = self.breakers.reset(name, now)
        self._watchdog_opened.discard(b.name)

    def escalate(
        self, scope: str, target: str, reason: str, message: str, now: float
    ) -> Escalation | None:
        """Open an escalation from outside (an operator, the supervisor's crash-loop check)."""
        return self.escalations.open(scope, target, reason, now, message, {})

    def clear_escalation(self, escalation_id: str, now: float) -> Escalation:
        """An operator ends an escalation (NotFound if it is not active)."""
        return self.escalations.clear(escalation_id, now)

    # ---- state ---------------------------------------------------------------------------

    def state(self) -> CoreState:
        keep = self.options.state_attempts
        return CoreState(
            breakers=tuple(self.breakers.export()),
            escalations=tuple(self.escalations.export()),
            costs=tuple(self.costs.export()),
            attempts=tuple(self.attempts.export()[-keep:] if keep else ()),
        )

    def restore(self, state: CoreState) -> None:
        """Resume a previous core's open breakers, active escalations and cost spent."""
        self.breakers.restore(state.breakers)
        self.escalations.restore(state.escalations)
        self.costs.restore(state.costs)
        self.attempts.restore(state.attempts)

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """Everything the mechanism holds, JSON-serialisable (for `corral breakers` & co)."""
        at = self._now if now is None else now
        roles, envs = self.gate.full()
        stop = self.escalations.safe_stop
        return {
            "at": at,
            "permits": {
                "live": self.gate.live,
                "unused": self.gate.unused,
                "full_roles": sorted(roles),
                "full_envs": sorted(envs),
                "cap_factor": self.gate.cap_factor,
            },
            "breakers": self.breakers.snapshot(at),
            "watchdog": self.watchdog.snapshot(at, self.workers),
            "escalations": self.escalations.snapshot(),
            "safe_stop": None
            if stop is None
            else {
                "escalation": stop.id,
                "mode": self.gate.settings.escalation.safe_stop,
                "cancels": self.safe_stop_cancels(),
            },
            "budgets": {"rates": self.rates.snapshot(at), "costs": self.costs.snapshot(at)},
            "events": dict(sorted(self.emit.counts.items())),
        }


def _budget_left(budget: RetryBudget, seen: JobAttempts | None, now: float) -> str:
    """The job's retry budget as a permit records it: `window_end=…,cost=spent/limit`."""
    parts = []
    if budget.window_s is not None:
        start = seen.first_at if seen is not None else now
        parts.append(f"window_end={start + budget.window_s:.3f}")
    if budget.cost_usd is not None:
        parts.append(f"cost={seen.cost_usd if seen else 0.0:.6g}/{budget.cost_usd:g}")
    return ",".join(parts)


def _is_crash(result: AttemptResult, stop_requested: bool) -> bool:
    """LOST, SPAWN_ERROR, or a signal death we did not ask for — of the worker itself: a job's
    own command that dies of a signal (or names no program) is the job's failure, and must not
    isolate the worker kind every other job runs on."""
    if result.fault not in (Fault.WORKER, Fault.CONFIG):
        return False
    if result.outcome in (Outcome.LOST, Outcome.SPAWN_ERROR):
        return True
    return result.outcome is Outcome.EXITED and result.signal is not None and not stop_requested
