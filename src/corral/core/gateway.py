"""Worker delegation (seed 004 §5.4, §6): permits in, processes out, results back."""

from __future__ import annotations

from collections.abc import Mapping

from corral.core.permits import PermitGate, Rejected
from corral.core.ports import AttemptHandle, WorkerAdapter
from corral.domain.errors import WorkerError
from corral.domain.models import Attempt, AttemptResult, Claimed, Job, Permit


class Core:
    """Holds the authority to permit and to start work; everything else asks it."""

    def __init__(self, gate: PermitGate, workers: Mapping[str, WorkerAdapter]) -> None:
        self.gate = gate
        self.workers = dict(workers)

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(self.workers)

    def request_permit(self, job: Job, attempt_index: int, now: float) -> Permit | Rejected:
        return self.gate.request(job, attempt_index, now)

    def launch(self, claimed: Claimed) -> AttemptHandle:
        """Start a claimed attempt. The permit is checked here and again by the adapter."""
        self.gate.validate(claimed.permit)
        worker = self.workers.get(claimed.job.worker)
        if worker is None:
            raise WorkerError(f"no worker adapter for kind {claimed.job.worker!r}")
        return worker.start(claimed.permit, claimed.job, claimed.attempt)

    def adopt(self, job: Job, attempt: Attempt,
              now: float) -> tuple[Permit, AttemptHandle | AttemptResult]:
        """Re-admit an attempt found in flight after a restart (its permit is re-registered)."""
        permit = self.gate.adopt(job, attempt.index, attempt.permit_id, attempt.deadline_at, now)
        worker = self.workers.get(job.worker)
        if worker is None:
            self.gate.release(permit)
            raise WorkerError(f"no worker adapter for kind {job.worker!r}")
        return permit, worker.adopt(job, attempt)

    def release(self, permit: Permit) -> None:
        """Give back a permit whose attempt never started (a lost claim)."""
        self.gate.release(permit)

    def complete(self, permit: Permit, job: Job, result: AttemptResult) -> None:
        """An attempt ended: release its permit (every terminal path comes through here)."""
        self.gate.release(permit)
