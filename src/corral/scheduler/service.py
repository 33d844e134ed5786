"""Turning requests into jobs: validation against the configuration, then one store call."""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from enum import StrEnum

from corral.core.ports import Admission, Store
from corral.domain import bounds
from corral.domain.agents import PolicyEvaluation
from corral.domain.errors import Backpressure, Conflict, InvalidRequest
from corral.domain.governance import Approval, ApprovalState
from corral.domain.ids import new_id
from corral.domain.models import (
    PRIORITY_BACKLOG,
    PRIORITY_CRITICAL,
    Job,
    JobOptions,
    JobSpec,
    Limits,
    SubmitResult,
)
from corral.domain.settings import RoleSpec, Settings, WorkspacePolicy
from corral.domain.states import JobState
from corral.scheduler.queue import sort_key

RUN_SUBJECT = "run"  # an approval's subject when it gates a whole run (policy/prerun.py)
# The pre-run policy at submit: the evaluation of a would-be job (its verdict decides the state).
PrerunCheck = Callable[[Job, float], Awaitable[PolicyEvaluation]]
# A job as the store may keep it: its secrets redacted from the command, the environment and the
# prompt, their real values sealed with a key kept outside the store (workers/sealing.py).
Conceal = Callable[[Job], Job]

MAX_ATTEMPTS_CEILING = bounds.MAX_ATTEMPTS
RETRY_AFTER_CEILING_S = 3600.0


def retry_after_s(*, started: int, window_s: float, fallback_s: float) -> float:
    """Seconds until a full queue has room again, estimated from how fast it drained lately.

    A queue at its bound has room once one waiting job starts; `started` jobs started in the
    bound's scope in the last `window_s` seconds, so that takes about window_s / started
    (whole seconds, as HTTP's Retry-After; at least 1). Nothing started lately (no engine, a
    stalled one, or every slot held by long jobs) gives no estimate: the configured fallback.
    """
    if started <= 0 or window_s <= 0:
        return fallback_s
    return float(min(max(math.ceil(window_s / started), 1), RETRY_AFTER_CEILING_S))


class Seat(StrEnum):
    """Where a new job stands on its workspace (see `workspace_seat`)."""

    TAKE = "take"  # it takes the workspace's lock at submission
    QUEUE = "queue"  # queued; it takes the lock when it starts, in queue order
    WAIT = "wait"  # queued behind the holder: its lock wait starts now
    JOIN = "join"  # coalesced: the submission returns the occupant


def workspace_seat(job: Job, policy: WorkspacePolicy, occupant: Job | None,
                   held: bool) -> Seat:
    """A workspace policy decision.

    `occupant` is the job the workspace belongs to now: its lock holder (`held`), else the first
    active job naming it. `reject` and `coalesce` take the lock at submission, so that "is anybody
    on this workspace?" is answered atomically with the insert (the lock table's primary key);
    `serialize` takes it when the job starts, so that jobs on one workspace run in queue order.
    """
    if occupant is None:
        return Seat.QUEUE if policy is WorkspacePolicy.SERIALIZE else Seat.TAKE
    if occupant.cancel_requested is not None:
        # It is stopping (e.g. superseded by this very job, latest-wins): neither refuse nor
        # coalesce into a job that is going away; queue behind it until it has let go.
        return Seat.WAIT if held else Seat.QUEUE
    if policy is WorkspacePolicy.REJECT:
        raise Conflict(f"workspace {job.workspace} is held by job {occupant.id} "
                       f"({occupant.state.value}); role {job.role} has workspace_policy reject")
    if policy is WorkspacePolicy.COALESCE:
        return Seat.JOIN
    return Seat.WAIT if held else Seat.QUEUE


def queue_full(*, queued: int, bound: int, env: str | None, started: int,
               admission: Admission) -> Backpressure:
    """The refusal of a submission past a queue bound: one line naming the bound and its key."""
    after = retry_after_s(started=started, window_s=admission.rate_window_s,
                          fallback_s=admission.retry_after_s)
    where, key = ((f" in environment {env}", f"environments.{env}.max_queued") if env
                  else ("", "scheduler.max_queued"))
    return Backpressure(f"queue full: {queued} jobs queued{where} (max {bound}, {key}); "
                        f"retry after {after:g} s", after)


def _within_budget(limits: Limits, role: RoleSpec) -> None:
    """Limits the core would refuse every permit for are refused at once, naming the bound."""
    excess = role.retry_budget.excess(limits)
    if excess is not None:
        raise InvalidRequest(f"{excess[0]} {excess[1]} of role {role.name}")


def _options(spec: JobSpec, role: RoleSpec) -> JobOptions:
    """The job's options; a child of a detached role is marked so (its parent's cancel does not
    reach it: store `request_cancel`). Only the role decides, never the submitter."""
    return spec.options.with_(detached=bool(spec.parent_id and role.detached))


def _names(names: Iterable[str]) -> str:
    return ", ".join(sorted(names))


class Submissions:
    """Validates submissions and stop requests, then hands them to the store."""

    def __init__(self, store: Store, settings: Settings, clock: Callable[[], float],
                 workers: frozenset[str],
                 command_workers: frozenset[str] = frozenset({"command"}),
                 prerun: PrerunCheck | None = None, conceal: Conceal | None = None) -> None:
        self.store = store
        # the job as the store may keep it: secrets redacted, their real values sealed
        self.conceal = conceal
        self.prerun = prerun  # the pre-run policy (runtime/gate.py): SUBMITTED → DENIED | …
        self.settings = settings
        self.command_workers = command_workers  # kinds that run a job's command
        self.clock = clock
        self.workers = workers

    def build(self, spec: JobSpec, now: float) -> Job:
        """A QUEUED job from a spec, or InvalidRequest saying which field is wrong and why."""
        s = self.settings
        bounds.text("role", spec.role)
        bounds.text("environment", spec.env_name)
        bounds.text("tenant", spec.tenant)
        role = s.roles.get(spec.role)
        if role is None:
            raise InvalidRequest(f"unknown role {spec.role!r} (configured: {_names(s.roles)})")
        env = s.environments.get(spec.env_name)
        if env is None:
            raise InvalidRequest(f"unknown environment {spec.env_name!r} "
                                 f"(configured: {_names(s.environments)})")
        if env.kind != "local":
            raise InvalidRequest(f"environment {env.name!r} is a {env.kind} cluster; this build "
                                 "runs attempts on `local` environments only")
        if (isinstance(spec.priority, bool) or not isinstance(spec.priority, int)
                or not PRIORITY_CRITICAL <= spec.priority <= PRIORITY_BACKLOG):
            raise InvalidRequest(
                f"priority must be 0 (critical) … 4 (backlog), got {spec.priority!r}")
        worker = spec.worker or self._default_worker(spec, role.worker)
        if worker not in self.workers:
            raise InvalidRequest(f"worker kind {worker!r} is not available "
                                 f"(available: {', '.join(sorted(self.workers))})")
        if worker == "command" and not (spec.command and spec.command[0]):
            raise InvalidRequest("empty command: give the program to run after `--`")
        if worker not in self.command_workers and not (spec.prompt and spec.prompt.strip()):
            raise InvalidRequest(f"worker kind {worker!r} runs an agent: give it a prompt "
                                 "(--prompt)")
        if spec.prompt is not None and len(spec.prompt.encode()) > bounds.MAX_PROMPT_BYTES:
            raise InvalidRequest(f"prompt of {len(spec.prompt.encode())} bytes is over the "
                                 f"{bounds.MAX_PROMPT_BYTES}-byte limit")
        limits = bounds.check_limits(spec.limits or role.limits)
        _within_budget(limits, role)
        if spec.cwd is not None and not os.path.isdir(spec.cwd):
            raise InvalidRequest(f"working directory does not exist: {spec.cwd}")
        workspace = self._workspace(spec.workspace)
        return Job(
            id=new_id(int(now * 1000)), state=JobState.QUEUED, role=role.name, worker=worker,
            env_name=env.name, priority=spec.priority, tenant=spec.tenant,
            command=tuple(spec.command), prompt=spec.prompt, cwd=spec.cwd, env=dict(spec.env),
            options=_options(spec, role), limits=limits, key=spec.key or None, dedup=spec.dedup,
            workspace=workspace, parent_id=spec.parent_id, depth=spec.depth,
            created_at=now, updated_at=now,
            sort_at=sort_key(now, spec.priority, s.scheduler.aging_s),
            after=tuple(dict.fromkeys(spec.after)),
        )

    @staticmethod
    def _workspace(name: str | None) -> str | None:
        """A workspace is an exact name: by convention the absolute path of a repository root.

        Lock granularity is the whole name: /repo and /repo/sub are different
        workspaces. Absolute paths are normalised (no trailing slash, no `..`) so that one
        directory written two ways is still one workspace.
        """
        if name is None:
            return None
        if not name.strip():
            raise InvalidRequest("workspace must not be empty")
        return os.path.normpath(name) if os.path.isabs(name) else name

    def admission(self, job: Job) -> Admission:
        """The bounds and workspace policy the store applies to this job's submission."""
        s = self.settings
        env = s.environments.get(job.env_name)
        role = s.roles.get(job.role)
        return Admission(
            max_queued=s.scheduler.max_queued,
            env_max_queued=env.max_queued if env else None,
            workspace_policy=role.workspace_policy if role else WorkspacePolicy.SERIALIZE,
            retry_after_s=s.scheduler.backpressure_retry_after_s)

    def _default_worker(self, spec: JobSpec, role_worker: str) -> str:
        """A command job runs on its role's kind when that kind runs commands, else `command`;
        a prompt job runs on its role's kind."""
        if not spec.command:
            return role_worker
        return role_worker if role_worker in self.command_workers else "command"

    async def submit(self, spec: JobSpec) -> SubmitResult:
        """Persist a job; Backpressure past a queue bound, Conflict on a rejected workspace."""
        now = self.clock()
        if spec.parent_id:
            spec = await self._nested(spec)
        if spec.options.resume_from:
            spec = await self._resuming(spec)
        job = self.build(spec, now)
        if self.conceal is not None:  # before anything else sees it: evaluations, events …
            job = self.conceal(job)
        role = self.settings.roles.get(job.role)
        verdict = await self.prerun(job, now) if self.prerun is not None else None
        gated = role is not None and role.requires_approval
        if verdict is not None and verdict.verdict == "deny":  # never queued, never run
            job = job.with_(state=JobState.DENIED, last_error=f"{verdict.reason}: "
                            f"{verdict.message}")
            gated = False
        elif gated:  # pre-run step 6: the run waits for a human
            job = job.with_(state=JobState.AWAITING_APPROVAL)
        result = await self.store.submit(job, now=now, aging_s=self.settings.scheduler.aging_s,
                                         admission=self.admission(job))
        if result.created and verdict is not None and not gated:
            await self.store.append_policy_evaluations([verdict])
        if gated and result.created:
            await self._request_run_approval(job, now)
        return result

    async def _request_run_approval(self, job: Job, now: float) -> None:
        subject = RUN_SUBJECT
        await self.store.request_approval(Approval(
            id=new_id(int(now * 1000)), job_id=job.id, subject=subject,
            digest=hashlib.sha256(subject.encode()).hexdigest(),
            reason="role_requires_approval", requested_at=now,
            expires_at=now + self.settings.approval_ttl_s))
        await self.store.append_policy_evaluations([PolicyEvaluation(
            at=now, job_id=job.id, attempt=None, stage="pre_run", subject="approval",
            verdict="require_approval", reason="approval_required",
            message=f"role {job.role} requires a human's approval before every run",
            inputs={"role": job.role, "ttl_s": self.settings.approval_ttl_s})])

    async def _nested(self, spec: JobSpec) -> JobSpec:
        """A job submitted from inside another: one level deeper than its parent, refused past
        the role's max_recursion_depth (a chain of agents spawning agents is bounded)."""
        parent = await self.store.get_job(spec.parent_id or "")
        depth = parent.depth + 1
        role = self.settings.roles.get(spec.role)
        limit = role.max_recursion_depth if role else 0
        if depth > limit:
            raise InvalidRequest(
                f"recursion depth {depth} exceeds max_recursion_depth {limit} of role "
                f"{spec.role!r} (parent {parent.id} is at depth {parent.depth})")
        return replace(spec, parent_id=parent.id, depth=depth)

    async def _resuming(self, spec: JobSpec) -> JobSpec:
        """A job that continues an earlier agent job's session:
        same worker kind, same session lineage (the CLI's state lives with its root job)."""
        earlier = await self.store.get_job(spec.options.resume_from or "")
        role = self.settings.roles.get(spec.role)
        worker = spec.worker or (role.worker if role else None)
        if worker != earlier.worker:
            raise InvalidRequest(f"--resume-from {earlier.id}: that job ran on {earlier.worker!r};"
                                 f" a session continues on the same worker kind, not {worker!r}")
        root = earlier.options.session_root or earlier.id
        return replace(spec, worker=worker, options=spec.options.with_(resume_from=earlier.id,
                                                                       session_root=root))

    async def decide_approval(self, approval_id: str, approve: bool, *, by: str,
                              note: str = "") -> Approval:
        """A human's decision; a run approval releases the job to the queue or denies it."""
        now = self.clock()
        a = await self.store.decide_approval(
            approval_id, ApprovalState.APPROVED if approve else ApprovalState.DENIED, at=now,
            by=by, note=note)
        if a.subject == RUN_SUBJECT:
            if approve:
                await self.store.release_approved(a.job_id, now=now,
                                                  aging_s=self.settings.scheduler.aging_s)
            else:
                await self.store.request_cancel(a.job_id, reason=f"approval_rejected: {a.id}"
                                                f" denied by {by}", kind="deny", now=now)
        return a

    async def cancel(self, ref: str, reason: str, *, kind: str = "cancel") -> Job:
        job = await self.store.get_job(ref)
        return await self.store.request_cancel(job.id, reason=reason, kind=kind, now=self.clock())

    async def dlq_requeue(self, ref: str) -> Job:
        """A fresh job with the dead-lettered one's spec and a fresh attempt budget."""
        old = await self.store.get_job(ref)
        now = self.clock()
        fresh = old.with_(
            id=new_id(int(now * 1000)), state=JobState.QUEUED, created_at=now, updated_at=now,
            sort_at=sort_key(now, old.priority, self.settings.scheduler.aging_s), retry_at=None,
            attempts=0, deps_pending=0, after=(), last_error=None, exit_code=None,
            limit_hit=None, cancel_requested=None, stop_kind=None, requeued_from=old.id,
            dlq_resolution=None)
        return await self.store.dlq_requeue(old.id, fresh, now=now,
                                            admission=self.admission(fresh))

    async def dlq_purge(self, ref: str) -> Job:
        old = await self.store.get_job(ref)
        return await self.store.dlq_purge(old.id, now=self.clock())
