"""The permit gate: the only issuer of permits, and the ledger of the slots they hold.

No worker process starts without a live permit from this gate (seed 004 §2.2): permits carry an
HMAC seal made with a key that never leaves the gate, and `validate` checks the seal and that the
permit has not been released. tests/unit/test_permits.py forges, replays and releases permits.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

from corral.domain.errors import PermitError
from corral.domain.ids import new_id
from corral.domain.models import Job, Permit
from corral.domain.settings import Settings


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejected:
    """A permit request refused, with a machine reason (seed 004 §5.2) and a line for people."""

    reason: str
    message: str


# Machine reasons a permit request can be refused with.
BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"
DUPLICATE_PERMIT = "DUPLICATE_PERMIT"


class PermitGate:
    """Issues, validates and releases permits; counts the concurrency slots they hold."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._key = os.urandom(32)
        self._live: dict[str, Permit] = {}
        self._by_job: dict[str, str] = {}
        self._held: Counter[tuple[str, str]] = Counter()

    # ---- accounting ----------------------------------------------------------------------

    def _caps(self, job: Job) -> list[tuple[tuple[str, str], int]]:
        role = self.settings.roles.get(job.role)
        env = self.settings.environments.get(job.env_name)
        return [(("role", job.role), role.concurrency if role else 1),
                (("env", job.env_name), env.max_inflight if env else 1)]

    def held(self, scope: str, name: str) -> int:
        return self._held[(scope, name)]

    def full(self) -> tuple[frozenset[str], frozenset[str]]:
        """Roles and environments with no free slot, so the dispatcher can skip their jobs."""
        roles = {n for (s, n), c in self._held.items()
                 if s == "role" and c >= self._cap("role", n)}
        envs = {n for (s, n), c in self._held.items() if s == "env" and c >= self._cap("env", n)}
        return frozenset(roles), frozenset(envs)

    def _cap(self, scope: str, name: str) -> int:
        if scope == "role":
            role = self.settings.roles.get(name)
            return role.concurrency if role else 1
        env = self.settings.environments.get(name)
        return env.max_inflight if env else 1

    @property
    def live(self) -> int:
        return len(self._live)

    # ---- issuing -------------------------------------------------------------------------

    def _seal(self, p: Permit) -> str:
        msg = f"{p.id}|{p.job_id}|{p.attempt_index}|{p.deadline_at!r}".encode()
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    def request(self, job: Job, attempt_index: int, now: float) -> Permit | Rejected:
        """Grant a permit for the job's next attempt, or say why not."""
        if job.id in self._by_job:
            return Rejected(reason=DUPLICATE_PERMIT,
                            message=f"job {job.id} already holds permit {self._by_job[job.id]}")
        for slot, cap in self._caps(job):
            if self._held[slot] >= cap:
                return Rejected(reason=BUDGET_EXHAUSTED,
                                message=f"{slot[0]} {slot[1]} is at its concurrency cap {cap}")
        return self._issue(job, attempt_index, now, now + job.limits.timeout_s, new_id())

    def adopt(self, job: Job, attempt_index: int, permit_id: str, deadline_at: float,
              now: float) -> Permit:
        """Re-register the permit of an attempt that survived an engine restart.

        Its slots are counted even past a cap: the process already exists."""
        return self._issue(job, attempt_index, now, deadline_at, permit_id)

    def _issue(self, job: Job, attempt_index: int, now: float, deadline_at: float,
               permit_id: str) -> Permit:
        granted: Mapping[str, str] = {"role": job.role, "env": job.env_name,
                                      "worker": job.worker, "tenant": job.tenant}
        unsealed = Permit(id=permit_id, job_id=job.id, attempt_index=attempt_index,
                          issued_at=now, deadline_at=deadline_at, grace_s=job.limits.grace_s,
                          granted=granted, breaker="CLOSED", seal="")
        permit = replace(unsealed, seal=self._seal(unsealed))
        self._live[permit.id] = permit
        self._by_job[job.id] = permit.id
        for slot, _ in self._caps(job):
            self._held[slot] += 1
        return permit

    def validate(self, permit: Permit) -> None:
        """Raise PermitError unless the permit was issued here and is still live."""
        if not hmac.compare_digest(permit.seal, self._seal(permit)):
            raise PermitError(f"permit {permit.id} is forged or altered")
        if self._live.get(permit.id) != permit:
            raise PermitError(f"permit {permit.id} is not live (released or never issued)")

    def release(self, permit: Permit) -> None:
        """Give the permit's slots back; releasing twice is harmless."""
        if self._live.pop(permit.id, None) is None:
            return
        self._by_job.pop(permit.job_id, None)
        for key in (("role", permit.granted["role"]), ("env", permit.granted["env"])):
            self._held[key] -= 1
            if self._held[key] <= 0:
                del self._held[key]
