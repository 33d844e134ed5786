"""The ports the inner rooms talk through: the store and the worker adapters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from corral.domain.models import (
    Attempt,
    AttemptResult,
    Claimed,
    Job,
    JobEvent,
    Permit,
    SubmitResult,
)
from corral.domain.settings import WorkspacePolicy
from corral.domain.states import JobState


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueFilter:
    """Which queued jobs a dispatcher may take now (roles/environments at a cap are skipped)."""

    exclude_roles: frozenset[str] = frozenset()
    exclude_envs: frozenset[str] = frozenset()
    exclude_workers: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class Finish:
    """How to close an attempt and move its job (decided by policy, applied atomically)."""

    attempt: Attempt
    result: AttemptResult
    job_state: JobState
    retry_at: float | None = None
    error: str | None = None
    events: Sequence[JobEvent] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobQuery:
    state: JobState | None = None
    role: str | None = None
    limit: int = 100
    dead_lettered_unresolved: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    """What a submission must pass besides its idempotency key, checked atomically with the insert.

    Queue bounds count the jobs waiting to run: QUEUED or RETRY_WAIT (seed 000 backpressure).
    The workspace policy applies when another active job already holds the job's workspace.
    """

    max_queued: int | None = None  # over all environments (None: unbounded)
    env_max_queued: int | None = None  # in the job's environment
    workspace_policy: WorkspacePolicy = WorkspacePolicy.SERIALIZE
    retry_after_s: float = 5.0  # a refusal's retry-after when nothing started lately
    rate_window_s: float = 60.0  # how far back the start rate behind that estimate looks


UNBOUNDED = Admission()


class Store(Protocol):
    """Domain operations on durable state. Every state change is a compare-and-set."""

    async def open(self) -> None:
        """Connect and migrate to the current schema."""

    async def close(self) -> None: ...

    async def submit(self, job: Job, *, now: float, aging_s: float,
                     admission: Admission = UNBOUNDED) -> SubmitResult:
        """Persist a new job, applying its idempotency key, workspace policy, queue bounds and
        dependencies atomically; Backpressure past a bound, Conflict for a rejected workspace."""

    async def reserve(
        self, *, engine_id: str, now: float, limit: int, where: QueueFilter
    ) -> list[Job]:
        """Queued, runnable jobs in queue order, leased to this engine for a few seconds.

        A job whose workspace is held by another job, or that is not the first runnable job on
        its free workspace, is not runnable (serialize: one at a time, in queue order)."""

    async def start_attempts(self, claims: Sequence[Claimed], *, now: float) -> list[Claimed]:
        """QUEUED → STARTING with a new attempt row, per claim; returns the ones that won.

        A job with a workspace takes its lock here (or holds it already); a claim whose workspace
        another job holds loses."""

    async def mark_running(self, started: Sequence[tuple[Attempt, int]], *, now: float) -> int:
        """STARTING → RUNNING for each (attempt, pid) whose process now exists."""

    async def finish(self, finishes: Sequence[Finish], *, now: float) -> list[Job]:
        """Close attempts and move their jobs; releases keys and settles dependents.

        Returns the jobs that moved; an attempt already closed by another path is skipped."""

    async def request_cancel(
        self, job_id: str, *, reason: str, kind: str, now: float
    ) -> Job:
        """Persist a stop request; queued jobs are cancelled at once, running ones flagged."""

    async def promote_retries(self, *, now: float, aging_s: float) -> int:
        """RETRY_WAIT → QUEUED for every job whose backoff has passed."""

    async def next_retry_at(self) -> float | None: ...

    async def inflight(self) -> list[tuple[Job, Attempt]]:
        """Every job with a live attempt (STARTING or RUNNING), for recovery and cancels."""

    async def get_job(self, ref: str) -> Job:
        """A job by id or unique id prefix; NotFound otherwise."""

    async def list_jobs(self, query: JobQuery) -> list[Job]: ...

    async def attempts(self, job_id: str) -> list[Attempt]: ...

    async def events(self, job_id: str, *, after_id: int = 0) -> list[tuple[int, JobEvent]]: ...

    async def append_events(self, events: Sequence[JobEvent]) -> None: ...

    async def append_core_events(self, events: Sequence[Mapping[str, Any]]) -> None:
        """Record the core's decisions (breaker transitions, defense stages, escalations)."""

    async def core_events(self, *, kind: str | None = None,
                          limit: int = 100) -> list[dict[str, Any]]:
        """The latest recorded core decisions, oldest first."""

    async def counts(self) -> dict[str, int]:
        """Jobs per state."""

    async def dlq_requeue(self, job_id: str, new_job: Job, *, now: float,
                          admission: Admission = UNBOUNDED) -> Job:
        """Resolve a dead-lettered job by submitting a fresh copy with a fresh attempt budget."""

    async def dlq_purge(self, job_id: str, *, now: float) -> Job:
        """Resolve a dead-lettered job by dropping it from the queue view (the record stays)."""

    async def workspaces(self) -> list[tuple[str, str, float]]:
        """Held workspaces: (workspace, holder job id, acquired at), by workspace."""

    async def workspace_lock_waits(self, since: float) -> list[float]:
        """Milliseconds each job waited for its workspace, of the locks taken since `since`
        (only jobs that found their workspace held; oldest first)."""

    async def register_engine(self, engine_id: str, *, pid: int, host: str, now: float) -> None: ...

    async def heartbeat_engine(self, engine_id: str, *, now: float) -> None: ...

    async def stale_engines(self, *, before: float, exclude: str) -> list[str]:
        """Engines whose last heartbeat is older than `before` (their attempts need a home)."""


class AttemptHandle(Protocol):
    """A running attempt, as a worker adapter supervises it."""

    @property
    def pid(self) -> int: ...

    async def wait(self) -> AttemptResult:
        """Block until the attempt's process tree is gone; the result it left."""

    def stop(self, *, now_kill: bool = False) -> None:
        """Ask the attempt to stop: graceful signal, then the whole tree after the grace."""


class WorkerAdapter(Protocol):
    """Runs attempts of one worker kind (DESIGN.md §Vocabulary: start, events, cancel, result)."""

    kind: str

    def start(self, permit: Permit, job: Job, attempt: Attempt) -> AttemptHandle:
        """Start the attempt's process; refuses (PermitError) without a live permit."""

    def adopt(self, job: Job, attempt: Attempt) -> AttemptHandle | AttemptResult:
        """After an engine restart: a handle if the attempt still runs, else how it ended."""
