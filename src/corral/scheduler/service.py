"""Turning requests into jobs: validation against the configuration, then one store call."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from corral.core.ports import Store
from corral.domain.errors import InvalidRequest
from corral.domain.ids import new_id
from corral.domain.models import (
    PRIORITY_BACKLOG,
    PRIORITY_CRITICAL,
    Job,
    JobSpec,
    Limits,
    SubmitResult,
)
from corral.domain.settings import Settings
from corral.domain.states import JobState
from corral.scheduler.queue import sort_key

MAX_ATTEMPTS_CEILING = 100


def _names(names: Iterable[str]) -> str:
    return ", ".join(sorted(names))


class Submissions:
    """Validates submissions and stop requests, then hands them to the store."""

    def __init__(self, store: Store, settings: Settings, clock: Callable[[], float],
                 workers: frozenset[str]) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.workers = workers

    def build(self, spec: JobSpec, now: float) -> Job:
        """A QUEUED job from a spec, or InvalidRequest saying which field is wrong and why."""
        s = self.settings
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
        if not PRIORITY_CRITICAL <= spec.priority <= PRIORITY_BACKLOG:
            raise InvalidRequest(
                f"priority must be 0 (critical) … 4 (backlog), got {spec.priority}")
        worker = spec.worker or ("command" if spec.command else role.worker)
        if worker not in self.workers:
            raise InvalidRequest(f"worker kind {worker!r} is not available "
                                 f"(available: {', '.join(sorted(self.workers))})")
        if worker == "command" and not (spec.command and spec.command[0]):
            raise InvalidRequest("empty command: give the program to run after `--`")
        limits = spec.limits or role.limits
        self._check_limits(limits)
        if spec.cwd is not None and not os.path.isdir(spec.cwd):
            raise InvalidRequest(f"working directory does not exist: {spec.cwd}")
        return Job(
            id=new_id(int(now * 1000)), state=JobState.QUEUED, role=role.name, worker=worker,
            env_name=env.name, priority=spec.priority, tenant=spec.tenant,
            command=tuple(spec.command), prompt=spec.prompt, cwd=spec.cwd, env=dict(spec.env),
            options=dict(spec.options), limits=limits, key=spec.key or None, dedup=spec.dedup,
            workspace=spec.workspace, parent_id=spec.parent_id, depth=spec.depth,
            created_at=now, updated_at=now,
            sort_at=sort_key(now, spec.priority, s.scheduler.aging_s),
            after=tuple(dict.fromkeys(spec.after)),
        )

    @staticmethod
    def _check_limits(limits: Limits) -> None:
        if not 1 <= limits.max_attempts <= MAX_ATTEMPTS_CEILING:
            raise InvalidRequest(
                f"max attempts must be 1 … {MAX_ATTEMPTS_CEILING}, got {limits.max_attempts}")
        if limits.timeout_s <= 0:
            raise InvalidRequest(f"timeout must be positive, got {limits.timeout_s}")
        if limits.grace_s < 0:
            raise InvalidRequest(f"grace must not be negative, got {limits.grace_s}")

    async def submit(self, spec: JobSpec) -> SubmitResult:
        now = self.clock()
        job = self.build(spec, now)
        return await self.store.submit(job, now=now, aging_s=self.settings.scheduler.aging_s)

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
        return await self.store.dlq_requeue(old.id, fresh, now=now)

    async def dlq_purge(self, ref: str) -> Job:
        old = await self.store.get_job(ref)
        return await self.store.dlq_purge(old.id, now=self.clock())
