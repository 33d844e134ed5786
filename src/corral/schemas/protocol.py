"""The domain values the core protocol carries (docs/reference/core-protocol.md): a job (with
its limits), an attempt, a permit and an attempt's result. Times are epoch seconds.

A job and an attempt travel as a part of their fields (`ProtocolJob`, `ProtocolAttempt`: `of`
gives the model of a domain value, `value` the value back); a permit, a result and a job's
limits travel whole, so their dataclasses are their schema (`PERMIT`, `RESULT`). A reader is
tolerant: a field it does not know is ignored, so an older core reads a newer scheduler's
message. core/protocol.py encodes and decodes with these and nothing else."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from corral.domain import models as dm
from corral.domain.states import AttemptState, DedupMode, JobState

# A permit and a result travel whole: the domain's dataclasses are their schema
PERMIT: TypeAdapter[dm.Permit] = TypeAdapter(dm.Permit)
RESULT: TypeAdapter[dm.AttemptResult] = TypeAdapter(dm.AttemptResult)


class _Wire(BaseModel):
    # a number where a string is expected is read as its text, as the protocol always did
    model_config = ConfigDict(extra="ignore", frozen=True, coerce_numbers_to_str=True)


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
    limits: dm.Limits = Field(description="A field the sender left out keeps its default.")
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
                   limits=j.limits, key=j.key, dedup=j.dedup,
                   workspace=j.workspace, parent_id=j.parent_id, depth=j.depth,
                   created_at=j.created_at, updated_at=j.updated_at, sort_at=j.sort_at,
                   attempts=j.attempts, cancel_requested=j.cancel_requested,
                   stop_kind=j.stop_kind)

    def value(self) -> dm.Job:
        return dm.Job(
            id=self.id, state=self.state, role=self.role, worker=self.worker,
            env_name=self.env_name, priority=self.priority, tenant=self.tenant,
            command=tuple(self.command), prompt=self.prompt, cwd=self.cwd, env=dict(self.env),
            options=dm.JobOptions.from_json(self.options), limits=self.limits,
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
