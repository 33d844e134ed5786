"""The domain values the core protocol carries (docs/reference/core-protocol.md), one model
each: a job, its limits, an attempt, a permit and an attempt's result. Times are epoch seconds.

A reader is tolerant (a field it does not know is ignored, so an older core reads a newer
scheduler's message); `of` gives the model of a domain value and `value` the value back, so
core/protocol.py encodes and decodes with these and nothing else."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from corral.domain import models as dm
from corral.domain.states import AttemptState, DedupMode, Fault, JobState, Outcome

_DEFAULT = dm.Limits()


class _Wire(BaseModel):
    # a number where a string is expected is read as its text, as the protocol always did
    model_config = ConfigDict(extra="ignore", frozen=True, coerce_numbers_to_str=True)


class ProtocolLimits(_Wire):
    """A job's bounds; a field the sender left out keeps its default."""

    max_attempts: int = _DEFAULT.max_attempts
    timeout_s: float = _DEFAULT.timeout_s
    grace_s: float = _DEFAULT.grace_s
    max_tool_calls: int = _DEFAULT.max_tool_calls
    token_budget_in: int = _DEFAULT.token_budget_in
    token_budget_out: int = _DEFAULT.token_budget_out

    @classmethod
    def of(cls, limits: dm.Limits) -> ProtocolLimits:
        return cls(max_attempts=limits.max_attempts, timeout_s=limits.timeout_s,
                   grace_s=limits.grace_s, max_tool_calls=limits.max_tool_calls,
                   token_budget_in=limits.token_budget_in,
                   token_budget_out=limits.token_budget_out)

    def value(self) -> dm.Limits:
        return dm.Limits(**self.model_dump())


class ProtocolJob(_Wire):
    """A job as the scheduler hands it to the core: what decides what runs and what it is
    charged to, and the bookkeeping the core's checks read."""

    id: str
    state: JobState
    role: str
    worker: str
    env_name: str
    priority: int
    tenant: str
    command: list[str]
    prompt: str | None = None
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    options: dict[str, Any] = Field(
        default_factory=dict, description="The job's options (domain/models.py JobOptions): "
        "only those that are set; keys a reader does not know are kept as they are.")
    limits: ProtocolLimits
    key: str | None = None
    dedup: DedupMode = DedupMode.COALESCE
    workspace: str | None = None
    parent_id: str | None = None
    depth: int = 0
    created_at: float
    updated_at: float
    sort_at: float
    attempts: int = 0
    cancel_requested: str | None = None
    stop_kind: str | None = None

    @classmethod
    def of(cls, j: dm.Job) -> ProtocolJob:
        return cls(id=j.id, state=j.state, role=j.role, worker=j.worker, env_name=j.env_name,
                   priority=j.priority, tenant=j.tenant, command=list(j.command),
                   prompt=j.prompt, cwd=j.cwd, env=dict(j.env), options=j.options.to_json(),
                   limits=ProtocolLimits.of(j.limits), key=j.key, dedup=j.dedup,
                   workspace=j.workspace, parent_id=j.parent_id, depth=j.depth,
                   created_at=j.created_at, updated_at=j.updated_at, sort_at=j.sort_at,
                   attempts=j.attempts, cancel_requested=j.cancel_requested,
                   stop_kind=j.stop_kind)

    def value(self) -> dm.Job:
        return dm.Job(
            id=self.id, state=self.state, role=self.role, worker=self.worker,
            env_name=self.env_name, priority=self.priority, tenant=self.tenant,
            command=tuple(self.command), prompt=self.prompt, cwd=self.cwd, env=dict(self.env),
            options=dm.JobOptions.from_json(self.options), limits=self.limits.value(),
            key=self.key, dedup=self.dedup, workspace=self.workspace, parent_id=self.parent_id,
            depth=self.depth, created_at=self.created_at, updated_at=self.updated_at,
            sort_at=self.sort_at, attempts=self.attempts,
            cancel_requested=self.cancel_requested, stop_kind=self.stop_kind)


class ProtocolAttempt(_Wire):
    """An attempt as the scheduler created it, before it runs."""

    id: str
    job_id: str
    index: int
    state: AttemptState
    permit_id: str
    deadline_at: float
    created_at: float
    dir: str
    engine_id: str
    pid: int | None = None

    @classmethod
    def of(cls, a: dm.Attempt) -> ProtocolAttempt:
        return cls(id=a.id, job_id=a.job_id, index=a.index, state=a.state,
                   permit_id=a.permit_id, deadline_at=a.deadline_at, created_at=a.created_at,
                   dir=a.dir, engine_id=a.engine_id, pid=a.pid)

    def value(self) -> dm.Attempt:
        return dm.Attempt(**dict(self))


class ProtocolPermit(_Wire):
    """The core's authorisation for one attempt, sealed by the core."""

    id: str
    job_id: str
    attempt_index: int
    issued_at: float
    deadline_at: float
    grace_s: float
    granted: dict[str, str]
    breaker: str
    seal: str

    @classmethod
    def of(cls, p: dm.Permit) -> ProtocolPermit:
        return cls(id=p.id, job_id=p.job_id, attempt_index=p.attempt_index,
                   issued_at=p.issued_at, deadline_at=p.deadline_at, grace_s=p.grace_s,
                   granted=dict(p.granted), breaker=p.breaker, seal=p.seal)

    def value(self) -> dm.Permit:
        return dm.Permit(**dict(self))


class ProtocolResult(_Wire):
    """How an attempt ended, as the core reports it."""

    outcome: Outcome
    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None
    limit_hit: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    cost_usd: float | None = None
    fault: Fault | None = None

    @classmethod
    def of(cls, r: dm.AttemptResult) -> ProtocolResult:
        return cls(outcome=r.outcome, exit_code=r.exit_code, signal=r.signal, error=r.error,
                   limit_hit=r.limit_hit, started_at=r.started_at, ended_at=r.ended_at,
                   cost_usd=r.cost_usd, fault=r.fault)

    def value(self) -> dm.AttemptResult:
        return dm.AttemptResult(**dict(self))
