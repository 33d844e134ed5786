"""Turning requests into jobs: validation against the configuration, then one store call.

The service every edge submits through (the CLI today; an HTTP API and a dashboard next): it
builds a job from a spec, applies the pre-run policy, and hands it to the store with the
admission bounds (scheduler/service.py has the pure rules the store applies). It also decides
run approvals, cancels and requeues or purges dead-lettered jobs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from corral.config import Config, guardrails_of
from corral.core.ports import Admission, JobGovernance, Operations
from corral.domain import bounds
from corral.domain.agents import PolicyEvaluation
from corral.domain.errors import Backpressure, InvalidRequest
from corral.domain.governance import Approval, ApprovalState
from corral.domain.ids import new_id
from corral.domain.models import (
    DEFAULT_PRIORITY,
    PRIORITY_BACKLOG,
    PRIORITY_CRITICAL,
    Job,
    JobOptions,
    JobSpec,
    Limits,
    SubmitResult,
)
from corral.domain.settings import RoleSpec, Settings, WorkspacePolicy
from corral.domain.states import DedupMode, JobState
from corral.policy.prerun import RUN_SUBJECT
from corral.runtime.assembly import agent_kinds, worker_kinds
from corral.runtime.gate import PrerunGate
from corral.runtime.published import active_config
from corral.runtime.watch import engine_serving
from corral.scheduler.queue import sort_key
from corral.services import Notify, Wake
from corral.workers.sealing import Keeper, revealer
from corral.world import throttle

T = TypeVar("T")

# The pre-run policy at submit: the evaluation of a would-be job (its verdict decides the state).
PrerunCheck = Callable[[Job, float], Awaitable[PolicyEvaluation]]
# A job as the store may keep it: its secrets redacted from the command, the environment and the
# prompt, their real values sealed with a key kept outside the store (workers/sealing.py).
Conceal = Callable[[Job], Job]


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

    def __init__(
        self,
        store: JobGovernance,
        settings: Settings,
        clock: Callable[[], float],
        workers: frozenset[str],
        command_workers: frozenset[str] = frozenset({"command"}),
        prerun: PrerunCheck | None = None,
        conceal: Conceal | None = None,
    ) -> None:
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
            raise InvalidRequest(
                f"unknown environment {spec.env_name!r} (configured: {_names(s.environments)})"
            )
        if (
            isinstance(spec.priority, bool)
            or not isinstance(spec.priority, int)
            or not PRIORITY_CRITICAL <= spec.priority <= PRIORITY_BACKLOG
        ):
            raise InvalidRequest(
                f"priority must be 0 (critical) … 4 (backlog), got {spec.priority!r}"
            )
        worker = spec.worker or self._default_worker(spec, role.worker)
        if worker not in self.workers:
            raise InvalidRequest(
                f"worker kind {worker!r} is not available "
                f"(available: {', '.join(sorted(self.workers))})"
            )
        if env.kind == "ray" and worker not in self.command_workers:
            raise InvalidRequest(
                f"environment {env.name!r} is a Ray cluster: it runs commands (and notebooks) "
                f"as Ray jobs, not the agent worker {worker!r}"
            )
        if worker == "command" and not (spec.command and spec.command[0]):
            raise InvalidRequest("empty command: give the program to run after `--`")
        if worker not in self.command_workers and not (spec.prompt and spec.prompt.strip()):
            raise InvalidRequest(
                f"worker kind {worker!r} runs an agent: give it a prompt (--prompt)"
            )
        if spec.prompt is not None and len(spec.prompt.encode()) > bounds.MAX_PROMPT_BYTES:
            raise InvalidRequest(
                f"prompt of {len(spec.prompt.encode())} bytes is over the "
                f"{bounds.MAX_PROMPT_BYTES}-byte limit"
            )
        limits = bounds.check_limits(spec.limits or role.limits)
        _within_budget(limits, role)
        if spec.cwd is not None and not os.path.isdir(spec.cwd):
            raise InvalidRequest(f"working directory does not exist: {spec.cwd}")
        workspace = self._workspace(spec.workspace)
        return Job(
            id=new_id(int(now * 1000)),
            state=JobState.QUEUED,
            role=role.name,
            worker=worker,
            env_name=env.name,
            priority=spec.priority,
            tenant=spec.tenant,
            command=tuple(spec.command),
            prompt=spec.prompt,
            cwd=spec.cwd,
            env=dict(spec.env),
            options=_options(spec, role),
            limits=limits,
            key=spec.key or None,
            dedup=spec.dedup,
            workspace=workspace,
            parent_id=spec.parent_id,
            depth=spec.depth,
            created_at=now,
            updated_at=now,
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
            retry_after_s=s.scheduler.backpressure_retry_after_s,
        )

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
            job = job.with_(
                state=JobState.DENIED, last_error=f"{verdict.reason}: {verdict.message}"
            )
            gated = False
        elif gated:  # pre-run step 6: the run waits for a human
            job = job.with_(state=JobState.AWAITING_APPROVAL)
        if job.state is JobState.QUEUED:  # it would join its environment's queue
            await self._throttle(job, now)
        result = await self.store.submit(
            job,
            now=now,
            aging_s=self.settings.scheduler.aging_s,
            admission=self.admission(job),
            # with the job, or not at all: a crash cannot leave a job without its evaluation
            evaluations=[verdict] if verdict is not None and not gated else (),
        )
        if gated and result.created:
            await self._request_run_approval(job, now)
        return result

    async def _throttle(self, job: Job, now: float) -> None:
        """Predictive throttling (corral.world.throttle) of an environment that asks for it:
        Backpressure while its queue is forecast to fill. Every decision that starts, keeps or
        releases a throttle, or lets priority 0 through one, is a policy evaluation of stage
        `throttle` with its inputs (a refused submission's under the id its job would have had)."""
        env = self.settings.environments.get(job.env_name)
        if env is None or env.throttle is None:
            return
        spec = env.throttle
        cap = env.max_queued or self.settings.scheduler.max_queued
        subject = f"env:{env.name}"
        depth, arrivals, starts = await self.store.queue_reading(
            env.name, since=now - spec.window_s
        )
        decision = throttle.decide(
            throttle.Reading(now=now, depth=depth, arrivals=arrivals, starts=starts),
            spec,
            cap=cap,
            priority=job.priority,
            throttled=await self.store.throttle_state(subject),
            fallback_s=self.settings.scheduler.backpressure_retry_after_s,
        )
        if not decision.changed:
            return
        f = decision.forecast
        message = (
            f"environment {env.name}: {f.predicted:.0f} jobs forecast to wait in "
            f"{spec.horizon_s:g} s ({f.depth} now, {f.trend_per_s:+.2f}/s), "
            f"cap {cap}, throttle at {f.throttle_at:g}, release below {f.release_below:g}"
        )
        if decision.refuse:
            message = (
                f"throttled: {message}; retry after {decision.retry_after_s:g} s "
                f"(environments.{env.name}.throttle)"
            )
        await self.store.append_policy_evaluations(
            [
                PolicyEvaluation(
                    at=now,
                    job_id=job.id,
                    attempt=None,
                    stage="throttle",
                    subject=subject,
                    verdict="deny" if decision.refuse else "allow",
                    reason=decision.reason,
                    message=message,
                    inputs=decision.inputs(spec) | {"priority": job.priority},
                )
            ]
        )
        if decision.refuse:
            assert decision.retry_after_s is not None
            raise Backpressure(message, decision.retry_after_s)

    async def _request_run_approval(self, job: Job, now: float) -> None:
        subject = RUN_SUBJECT
        await self.store.request_approval(
            Approval.asked(
                id=new_id(int(now * 1000)),
                job_id=job.id,
                subject=subject,
                reason="role_requires_approval",
                now=now,
                ttl_s=self.settings.approval_ttl_s,
            )
        )
        await self.store.append_policy_evaluations(
            [
                PolicyEvaluation(
                    at=now,
                    job_id=job.id,
                    attempt=None,
                    stage="pre_run",
                    subject="approval",
                    verdict="require_approval",
                    reason="approval_required",
                    message=f"role {job.role} requires a human's approval before every run",
                    inputs={"role": job.role, "ttl_s": self.settings.approval_ttl_s},
                )
            ]
        )

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
                f"{spec.role!r} (parent {parent.id} is at depth {parent.depth})"
            )
        return replace(spec, parent_id=parent.id, depth=depth)

    async def _resuming(self, spec: JobSpec) -> JobSpec:
        """A job that continues an earlier agent job's session:
        same worker kind, same session lineage (the CLI's state lives with its root job)."""
        earlier = await self.store.get_job(spec.options.resume_from or "")
        role = self.settings.roles.get(spec.role)
        worker = spec.worker or (role.worker if role else None)
        if worker != earlier.worker:
            raise InvalidRequest(
                f"--resume-from {earlier.id}: that job ran on {earlier.worker!r};"
                f" a session continues on the same worker kind, not {worker!r}"
            )
        root = earlier.options.session_root or earlier.id
        return replace(
            spec,
            worker=worker,
            options=spec.options.with_(resume_from=earlier.id, session_root=root),
        )

    async def decide_approval(
        self, approval_id: str, approve: bool, *, by: str, note: str = ""
    ) -> Approval:
        """A human's decision; a run approval releases the job to the queue or denies it."""
        now = self.clock()
        a = await self.store.decide_approval(
            approval_id,
            ApprovalState.APPROVED if approve else ApprovalState.DENIED,
            at=now,
            by=by,
            note=note,
        )
        if a.subject == RUN_SUBJECT:
            if approve:
                await self.store.release_approved(
                    a.job_id, now=now, aging_s=self.settings.scheduler.aging_s
                )
            else:
                await self.store.request_cancel(
                    a.job_id,
                    reason=f"approval_rejected: {a.id} denied by {by}",
                    kind="deny",
                    now=now,
                )
        return a

    async def cancel(self, ref: str, reason: str, *, kind: str = "cancel") -> Job:
        job = await self.store.get_job(ref)
        return await self.store.request_cancel(job.id, reason=reason, kind=kind, now=self.clock())

    async def dlq_requeue(self, ref: str) -> Job:
        """A fresh job with the dead-lettered one's spec and a fresh attempt budget."""
        old = await self.store.get_job(ref)
        now = self.clock()
        fresh = old.with_(
            id=new_id(int(now * 1000)),
            state=JobState.QUEUED,
            created_at=now,
            updated_at=now,
            sort_at=sort_key(now, old.priority, self.settings.scheduler.aging_s),
            retry_at=None,
            attempts=0,
            deps_pending=0,
            after=(),
            last_error=None,
            exit_code=None,
            limit_hit=None,
            cancel_requested=None,
            stop_kind=None,
            requeued_from=old.id,
            dlq_resolution=None,
        )
        return await self.store.dlq_requeue(old.id, fresh, now=now, admission=self.admission(fresh))

    async def dlq_purge(self, ref: str) -> Job:
        old = await self.store.get_job(ref)
        return await self.store.dlq_purge(old.id, now=self.clock())


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitChoices:
    """The limits a caller gave; each one left out (None) is the role's."""

    max_attempts: int | None = None
    timeout_s: float | None = None
    grace_s: float | None = None
    max_tool_calls: int | None = None
    token_budget_in: int | None = None
    token_budget_out: int | None = None

    def over(self, base: Limits) -> Limits:
        """These choices over the role's limits."""
        return Limits(
            **{f.name: _or(getattr(self, f.name), getattr(base, f.name)) for f in fields(Limits)}
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitRequest:
    """What an edge asks to run, before the configuration the engine runs fills in its
    defaults: the role (`default_role`), the environment (`default_env`) and the role's limits."""

    command: tuple[str, ...] = ()
    prompt: str | None = None
    role: str | None = None
    env_name: str | None = None
    priority: int = DEFAULT_PRIORITY
    tenant: str = "default"
    key: str | None = None
    dedup: DedupMode = DedupMode.COALESCE
    limits: LimitChoices = LimitChoices()
    after: tuple[str, ...] = ()
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    worker: str | None = None
    parent_id: str | None = None
    workspace: str | None = None
    resume_from: str | None = None
    secret_env: tuple[str, ...] = ()
    by: str | None = None  # who submits (the first line of the job's timeline says it)
    # a notebook job: what it runs and with which parameters, recorded on the job
    # (services/notebooks.py builds the command)
    notebook: Mapping[str, Any] | None = None
    # a training job: the method, script, model, W&B settings and what it is compared to
    # (services/training.py builds the command)
    training: Mapping[str, Any] | None = None


def spec_for(request: SubmitRequest, settings: Settings) -> JobSpec:
    """The spec of a request, with the defaults of `settings` (the configuration the engine
    runs): a limit the caller left out is the role's."""
    role_name = request.role if request.role is not None else settings.default_role
    role = settings.roles.get(role_name)
    env_name = request.env_name if request.env_name is not None else settings.default_env
    env = settings.environments.get(env_name)
    # the secrets the role and the environment declare, with the submission's own
    declared = (*(role.secret_env if role else ()), *(env.secret_env if env else ()))
    extra: dict[str, Any] = {"notebook": dict(request.notebook)} if request.notebook else {}
    if request.training:
        extra["training"] = dict(request.training)
    options = JobOptions(
        resume_from=request.resume_from or None,
        secret_env=tuple(sorted({*request.secret_env, *declared})),
        submitted_by=request.by or None,
        extra=extra,
    )
    return JobSpec(
        command=request.command,
        prompt=request.prompt,
        options=options,
        role=role_name,
        env_name=env_name,
        priority=request.priority,
        tenant=request.tenant,
        key=request.key,
        dedup=request.dedup,
        limits=request.limits.over(role.limits if role else Limits()),
        after=request.after,
        cwd=request.cwd,
        env=dict(request.env),
        worker=request.worker,
        parent_id=request.parent_id,
        workspace=request.workspace,
    )


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


@dataclass(frozen=True, slots=True)
class Submitted:
    """A submission's outcome, and whether an engine serves the data directory to run it."""

    result: SubmitResult
    engine_serving: bool


def submissions(store: JobGovernance, config: Config) -> Submissions:
    """The submission service over `config`: its worker kinds, the pre-run gate and the key
    that seals secrets."""
    return _built(store, config)[0]


def _built(store: JobGovernance, config: Config) -> tuple[Submissions, PrerunGate]:
    kinds = worker_kinds(config)
    keeper = Keeper(config.secrets_key)
    gate = PrerunGate(
        store, config.settings, guardrails_of(config.settings), reveal=revealer(keeper)
    )
    svc = Submissions(
        store,
        config.settings,
        time.time,
        kinds,
        command_workers=kinds - agent_kinds(config),
        prerun=gate.at_submit,
        conceal=keeper.conceal,
    )
    return svc, gate


# Gives the submission service over a store and a configuration (`submissions`, or a kept one).
Services = Callable[[JobGovernance, Config], Submissions]


class KeptSubmissions:
    """The submission service of a long-lived edge (the HTTP API), built once per store and
    configuration instead of for every request. Its pre-run gate then keeps what it read of the
    kill switches, pauses and budget ceilings for `gate.REFRESH_S`, as the dispatcher's does:
    built anew, every API submission read all three and made a gate and a sealing key, a
    seventh of the engine's CPU for it (bench/api.py). `heard` hears the engine's wake-ups
    (the edge's own changes, and the CLI's pokes): after any but a submission's, the next
    submission reads them again."""

    def __init__(self) -> None:
        self._store: JobGovernance | None = None  # what the service was built over (the
        self._config: Config | None = None  # same objects: no comparison on every request)
        self._service: Submissions | None = None
        self._gate: PrerunGate | None = None

    def __call__(self, store: JobGovernance, config: Config) -> Submissions:
        if self._service is None or store is not self._store or config is not self._config:
            self._service, self._gate = _built(store, config)
            self._store, self._config = store, config
        return self._service

    def stale(self) -> None:
        if self._gate is not None:
            self._gate.stale()

    def heard(self, op: str) -> None:
        """An engine's wake-up (`Wake`'s op): anything but a submission's may have changed what
        the gate read (a kill switch, a pause, a budget: their commands all poke "wake")."""
        if op != "submitted":
            self.stale()


async def active_submissions(
    store: Operations,
    local: Config,
    notify: Notify | None = None,
    services: Services = submissions,
) -> tuple[Submissions, Config]:
    """The submission service over the configuration the engine runs (runtime/published.py);
    `notify` hears a note when the local configuration is not that one."""
    cfg, note = await active_config(store, local)
    if note and notify is not None:
        notify(note)
    return services(store, cfg), cfg


async def submit(
    store: Operations,
    local: Config,
    request: SubmitRequest,
    wake: Wake,
    notify: Notify | None = None,
    services: Services = submissions,
) -> Submitted:
    """Submit against the engine's configuration, wake the engine, and say whether one serves
    the data directory (it does when the wake-up was answered). `services`: where the
    submission service comes from (a long-lived edge keeps one: KeptSubmissions)."""
    svc, cfg = await active_submissions(store, local, notify, services)
    result = await svc.submit(spec_for(request, cfg.settings))
    # A submission that ended a job (its own, denied or failed on a dependency at once, or the
    # one it superseded) is a "wake": the engine looks at its running jobs and writes the
    # reports due; any other needs only a dispatch.
    ended = result.superseded is not None or result.job.state.terminal
    # An answer is an engine's (its socket, or the engine itself for an edge inside it): one
    # serves, so the slower checks (/proc/locks, a ping, the heartbeats) are for no answer.
    answered = wake("wake" if ended else "submitted") is not None
    return Submitted(result, answered or await engine_serving(cfg, store, time.time()))
