"""The permit gate: the only issuer of permits, and the ledger of the slots they hold.

No worker process starts without a live permit from this gate: permits carry an
HMAC seal made with a key that never leaves the gate, and `validate` checks the seal and that the
permit has not been released. A permit authorises exactly one attempt — of the job and attempt
index it was issued for, once, before its deadline: `consume` checks that and marks it used, and
an unused permit lapses at its deadline (`due`). tests/unit/test_permits.py forges, replays,
misdirects and lets permits expire.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from corral.domain.errors import PermitError
from corral.domain.ids import new_id
from corral.domain.models import Attempt, Job, Permit
from corral.domain.settings import Settings


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejected:
    """A permit request refused, with a machine reason and a line for people.

    `retry_after_s`: when asking again makes sense (None: when a slot frees up). `final`: the
    job should fail instead of waiting (only a global safe stop configured to fail queued work).
    """

    reason: str
    message: str
    retry_after_s: float | None = None
    final: bool = False


# Machine reasons a permit request can be refused with.
QUEUE_STALL = "QUEUE_STALL"  # the watchdog sees stalled attempts and sheds/throttles for them
CIRCUIT_OPEN = "CIRCUIT_OPEN"  # the worker kind's (or provider's, model's) breaker is open
RATE_LIMIT = "RATE_LIMIT"  # a token bucket (role, worker kind, provider) is empty
GLOBAL_SHED = "GLOBAL_SHED"  # the watchdog sheds low-priority work
FATAL_MODE = "FATAL_MODE"  # an escalation isolates the kind, locks the workspace or stops all
DUPLICATE_PERMIT = "DUPLICATE_PERMIT"  # the job already holds a live permit
BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"  # a concurrency cap (maybe throttled) or cost allowance
# The attempt itself is past the core's bounds (core/attempts.py); final: asking again is futile.
MAX_ATTEMPTS = "MAX_ATTEMPTS"  # the index is past the job's max_attempts (or the role's ceiling)
ATTEMPT_REPEATED = "ATTEMPT_REPEATED"  # this core already started that attempt (or a later one)
TIMEOUT_TOO_LONG = "TIMEOUT_TOO_LONG"  # the per-attempt timeout is past the role's ceiling
RETRY_BUDGET_EXHAUSTED = "RETRY_BUDGET_EXHAUSTED"  # the job's attempts used its time or cost
REASONS = (
    QUEUE_STALL,
    CIRCUIT_OPEN,
    RATE_LIMIT,
    GLOBAL_SHED,
    FATAL_MODE,
    DUPLICATE_PERMIT,
    BUDGET_EXHAUSTED,
    MAX_ATTEMPTS,
    ATTEMPT_REPEATED,
    TIMEOUT_TOO_LONG,
    RETRY_BUDGET_EXHAUSTED,
)

# Why a permit does not authorise an attempt (`submit_job` is refused; nothing starts).
PERMIT_FORGED = "PERMIT_FORGED"  # its seal does not match: altered, or not issued by this core
PERMIT_RELEASED = "PERMIT_RELEASED"  # given back (`release`), or unknown to this core
PERMIT_USED = "PERMIT_USED"  # it already started an attempt: a permit is good for one
PERMIT_EXPIRED = "PERMIT_EXPIRED"  # its deadline passed before it was used
PERMIT_WRONG_JOB = "PERMIT_WRONG_JOB"  # issued for another job (another id, or the job changed)
PERMIT_WRONG_ATTEMPT = "PERMIT_WRONG_ATTEMPT"  # issued for another attempt index
PERMIT_REASONS = (
    PERMIT_FORGED,
    PERMIT_RELEASED,
    PERMIT_USED,
    PERMIT_EXPIRED,
    PERMIT_WRONG_JOB,
    PERMIT_WRONG_ATTEMPT,
)

SPENT_KEPT = 8192  # ended permits remembered, so a replay is told why it is refused

SLOT_SCOPES = ("role", "env", "worker", "tenant")


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """What a permit is issued for beyond its job: the worker kind (a fallback may differ from
    the job's), the breaker state at issue, and extra budget figures for `Permit.granted`."""

    worker: str
    breaker: str = "CLOSED"
    extra: Mapping[str, str] = field(default_factory=dict)
    deadline_at: float | None = None  # None: now + the job's timeout


def job_fingerprint(job: Job) -> tuple[Any, ...]:
    """What a permit is bound to besides the job's id: everything that decides what runs and what
    it is charged to, compared by value. Bookkeeping (state, attempts, times) is left out, and so
    is what the scheduler adds after the permit: the agent session (`resume_session`) and the
    learnings injected into the agent's system prompt (`knowledge`, runtime/flywheel.py)."""
    options = job.options.with_(resume_session=None, knowledge=None)
    return (
        job.id,
        job.role,
        job.worker,
        job.env_name,
        job.tenant,
        tuple(job.command),
        job.prompt,
        job.cwd,
        dict(job.env),
        options,
        job.workspace,
        job.limits,
    )


class PermitGate:
    """Issues, validates and releases permits; counts the concurrency slots they hold.

    Slots are counted per role, environment, worker kind and tenant. `cap_factor` scales every
    cap (never below 1) while the watchdog throttles."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cap_factor = 1.0
        self._key = os.urandom(32)
        self._live: dict[str, Permit] = {}
        self._unused: dict[str, Permit] = {}  # live and not yet used: these can lapse
        self._bound: dict[str, tuple[Any, ...]] = {}  # permit id → the job it is for
        self._spent: OrderedDict[str, str] = OrderedDict()  # ended permit id → how it ended
        self._by_job: dict[str, str] = {}
        self._held: Counter[tuple[str, str]] = Counter()

    # ---- accounting ----------------------------------------------------------------------

    def held(self, scope: str, name: str) -> int:
        return self._held[(scope, name)]

    def base_cap(self, scope: str, name: str) -> int | None:
        """The configured cap of one slot (None: unlimited). Unknown roles/envs get 1."""
        s = self.settings
        if scope == "role":
            role = s.roles.get(name)
            return role.concurrency if role else 1
        if scope == "env":
            env = s.environments.get(name)
            return env.max_inflight if env else 1
        spec = s.workers.get(name) if scope == "worker" else s.tenants.get(name)
        return spec.max_inflight if spec else None

    def cap(self, scope: str, name: str, factor: float | None = None) -> int | None:
        base = self.base_cap(scope, name)
        f = self.cap_factor if factor is None else factor
        return None if base is None else max(1, int(base * f))

    def _at_cap(self, scope: str) -> frozenset[str]:
        return frozenset(
            n
            for (s, n), c in self._held.items()
            if s == scope and (cap := self.cap(s, n)) is not None and c >= cap
        )

    def full(self) -> tuple[frozenset[str], frozenset[str]]:
        """Roles and environments with no free slot, so the dispatcher can skip their jobs."""
        return self._at_cap("role"), self._at_cap("env")

    def full_workers(self) -> frozenset[str]:
        """Worker kinds with no free slot."""
        return self._at_cap("worker")

    @property
    def live(self) -> int:
        return len(self._live)

    @property
    def unused(self) -> int:
        """Live permits that have not started their attempt yet."""
        return len(self._unused)

    def live_permits(self) -> list[Permit]:
        return list(self._live.values())

    # ---- issuing -------------------------------------------------------------------------

    def _seal(self, p: Permit) -> str:
        msg = f"{p.id}|{p.job_id}|{p.attempt_index}|{p.deadline_at!r}".encode()
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    def holder(self, job_id: str) -> str | None:
        """The live permit id a job holds, if any."""
        return self._by_job.get(job_id)

    def check(
        self, job: Job, worker: str | None = None, factor: float | None = None
    ) -> Rejected | None:
        """Why the job cannot have a permit now (a duplicate or a full slot), or None."""
        if job.id in self._by_job:
            return Rejected(
                reason=DUPLICATE_PERMIT,
                message=f"job {job.id} already holds permit {self._by_job[job.id]}",
            )
        for scope, name in _slots(job, worker or job.worker):
            cap = self.cap(scope, name, factor)
            if cap is not None and self._held[(scope, name)] >= cap:
                return Rejected(
                    reason=BUDGET_EXHAUSTED,
                    message=f"{scope} {name} is at its concurrency cap {cap}",
                )
        return None

    def usage(self, job: Job, worker: str) -> str:
        """Slots a permit for this job would hold, as `scope:name=held/cap` after issue."""
        parts = []
        for scope, name in _slots(job, worker):
            cap = self.cap(scope, name)
            parts.append(
                f"{scope}:{name}={self._held[(scope, name)] + 1}/{'-' if cap is None else cap}"
            )
        return ",".join(parts)

    def request(self, job: Job, attempt_index: int, now: float) -> Permit | Rejected:
        """Grant a permit for the job's next attempt, or say why not (slots only: the Core
        adds breakers, rates, costs and the watchdog on top)."""
        refused = self.check(job)
        if refused is not None:
            return refused
        return self.issue(job, attempt_index, now, Grant(worker=job.worker))

    def issue(self, job: Job, attempt_index: int, now: float, grant: Grant) -> Permit:
        """Seal and register a permit (the caller checked first) and take its slots."""
        deadline = (
            grant.deadline_at if grant.deadline_at is not None else now + job.limits.timeout_s
        )
        permit = self._issue(job, attempt_index, now, deadline, new_id(), grant)
        self._unused[permit.id] = permit
        return permit

    def adopt(
        self,
        job: Job,
        attempt_index: int,
        permit_id: str,
        deadline_at: float,
        now: float,
        *,
        worker: str | None = None,
    ) -> Permit:
        """Re-register the permit of an attempt that survived an engine restart (already used:
        its attempt runs).

        Its slots are counted even past a cap: the process already exists."""
        self._spent.pop(permit_id, None)
        return self._issue(
            job, attempt_index, now, deadline_at, permit_id, Grant(worker=worker or job.worker)
        )

    def _issue(
        self,
        job: Job,
        attempt_index: int,
        now: float,
        deadline_at: float,
        permit_id: str,
        grant: Grant,
    ) -> Permit:
        granted: dict[str, str] = {
            "role": job.role,
            "env": job.env_name,
            "worker": grant.worker,
            "tenant": job.tenant,
        }
        granted.update(grant.extra)
        unsealed = Permit(
            id=permit_id,
            job_id=job.id,
            attempt_index=attempt_index,
            issued_at=now,
            deadline_at=deadline_at,
            grace_s=job.limits.grace_s,
            granted=granted,
            breaker=grant.breaker,
            seal="",
        )
        permit = replace(unsealed, seal=self._seal(unsealed))
        self._live[permit.id] = permit
        self._bound[permit.id] = job_fingerprint(job)
        self._by_job[job.id] = permit.id
        for slot in _slots(job, grant.worker):
            self._held[slot] += 1
        return permit

    def validate(self, permit: Permit) -> None:
        """Raise PermitError unless the permit was issued here and is still live."""
        if not hmac.compare_digest(permit.seal, self._seal(permit)):
            raise PermitError(
                f"permit {permit.id} is forged, altered or not issued by this core", PERMIT_FORGED
            )
        if self._live.get(permit.id) != permit:
            ended = self._spent.get(permit.id)
            if ended == PERMIT_USED:
                raise PermitError(
                    f"permit {permit.id} is not live: it already ran its attempt "
                    "(a permit starts one attempt, once)",
                    PERMIT_USED,
                )
            if ended == PERMIT_EXPIRED:
                raise PermitError(
                    f"permit {permit.id} is not live: it expired unused at its "
                    f"deadline {permit.deadline_at:.3f}",
                    PERMIT_EXPIRED,
                )
            raise PermitError(
                f"permit {permit.id} is not live (released or never issued)", PERMIT_RELEASED
            )

    def consume(self, permit: Permit, job: Job, attempt: Attempt, now: float) -> None:
        """Use the permit for this attempt, or PermitError with the reason it does not authorise
        it: it must be live, unused, before its deadline, and issued for exactly this job and
        attempt index. On success the permit is used: it authorises nothing else, ever."""
        self.validate(permit)
        if permit.job_id != job.id or attempt.job_id != job.id:
            raise PermitError(
                f"permit {permit.id} was issued for job {permit.job_id}, not for job {job.id}",
                PERMIT_WRONG_JOB,
            )
        if self._bound.get(permit.id) != job_fingerprint(job):
            raise PermitError(
                f"permit {permit.id} was issued for job {job.id} as it was then; "
                "the job sent now differs (role, command, limits …)",
                PERMIT_WRONG_JOB,
            )
        if attempt.index != permit.attempt_index or attempt.permit_id != permit.id:
            raise PermitError(
                f"permit {permit.id} was issued for attempt "
                f"{permit.attempt_index} of job {job.id}, not for attempt "
                f"{attempt.index} (permit_id {attempt.permit_id})",
                PERMIT_WRONG_ATTEMPT,
            )
        if permit.id not in self._unused:
            raise PermitError(
                f"permit {permit.id} already started attempt "
                f"{permit.attempt_index} of job {job.id}",
                PERMIT_USED,
            )
        if now >= permit.deadline_at:
            raise PermitError(
                f"permit {permit.id} expired at its deadline "
                f"{permit.deadline_at:.3f} before it was used",
                PERMIT_EXPIRED,
            )
        del self._unused[permit.id]

    def due(self, now: float) -> list[Permit]:
        """Unused permits whose deadline has passed: they lapse (the caller releases them with
        `expired=True`)."""
        return [p for p in self._unused.values() if now >= p.deadline_at]

    def release(self, permit: Permit, *, expired: bool = False) -> bool:
        """Give the permit's slots back; False (and harmless) when it was not live."""
        live = self._live.pop(permit.id, None)
        if live is None:
            return False
        unused = self._unused.pop(permit.id, None) is not None
        self._bound.pop(permit.id, None)
        self._spent[permit.id] = (
            PERMIT_EXPIRED if expired else (PERMIT_RELEASED if unused else PERMIT_USED)
        )
        while len(self._spent) > SPENT_KEPT:
            self._spent.popitem(last=False)
        self._by_job.pop(live.job_id, None)
        for scope in SLOT_SCOPES:
            key = (scope, live.granted.get(scope, ""))
            self._held[key] -= 1
            if self._held[key] <= 0:
                del self._held[key]
        return True


def _slots(job: Job, worker: str) -> list[tuple[str, str]]:
    return [("role", job.role), ("env", job.env_name), ("worker", worker), ("tenant", job.tenant)]
