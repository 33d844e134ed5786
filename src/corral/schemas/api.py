"""The JSON shapes only the HTTP API exchanges (src/corral/api/): request bodies and the pages
and envelopes around the views of schemas/views.py. FastAPI publishes them in the OpenAPI
document (`/openapi.json`); docs/reference/http-api.md describes them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from corral.domain import bounds
from corral.domain.governance import ScopeKind
from corral.domain.states import DedupMode

from .views import JobDetail, View


class Body(BaseModel):
    """A request body: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)


Name = Annotated[str, Field(min_length=1, max_length=200)]


class TrainingBody(Body):
    """A training job (`corral submit --training`): `script` (absolute, or relative to the
    body's `cwd`) run by TRL's method; `args` go to the script; `compare_to` a baseline job whose
    final metrics this run's are compared with (`watch`: NAME or NAME:max)."""

    method: Literal["sft", "dpo", "grpo"]
    script: str = Field(min_length=1, max_length=4096)
    model: str | None = Field(None, min_length=1, max_length=500)
    dataset: str | None = Field(None, min_length=1, max_length=500)
    args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list, max_length=1000
    )
    compare_to: Name | None = None
    watch: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=20
    )
    threshold: float | None = Field(None, ge=0, le=100)
    wandb_project: str | None = Field(None, min_length=1, max_length=200)


class JobCreate(Body):
    """`POST /api/v1/jobs`: what `corral submit` takes. Give `command` (an argv list),
    `prompt` (for an agent worker) or `training` (a training script). Fields left out take the
    role's defaults."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["command"], "properties": {"command": {"minItems": 1}}},
                {
                    "required": ["prompt"],
                    "properties": {"prompt": {"type": "string", "minLength": 1}},
                },
                {"required": ["training"]},
            ]
        }
    )

    command: list[Annotated[str, Field(max_length=bounds.MAX_PROMPT_BYTES)]] = Field(
        default_factory=list, max_length=10_000
    )
    prompt: str | None = Field(None, min_length=1, max_length=bounds.MAX_PROMPT_BYTES)
    role: Name | None = None
    env_name: Name | None = Field(None, description="The environment to run in.")
    priority: int = Field(2, ge=bounds.MIN_PRIORITY, le=bounds.MAX_PRIORITY)
    tenant: Name | None = Field(None, description="Another tenant than the token's: admin only.")
    dedup: DedupMode = DedupMode.COALESCE
    env: dict[
        Annotated[str, Field(min_length=1, max_length=1000)],
        Annotated[str, Field(max_length=1 << 16)],
    ] = Field(default_factory=dict, max_length=1000)
    timeout_s: float | None = Field(None, gt=0, le=bounds.MAX_TIMEOUT_S)
    max_attempts: int | None = Field(None, ge=1, le=bounds.MAX_ATTEMPTS)
    after: list[Name] = Field(default_factory=list, max_length=1000)
    cwd: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    worker: Name | None = None
    resume_from: Name | None = None
    training: TrainingBody | None = None


class JobCreated(View):
    """The job a submission resolved to: a new one (201) or the one its key or workspace
    coalesced into (200)."""

    created: bool
    coalesced_on: str | None
    superseded: str | None
    engine_serving: bool
    job: JobDetail


class JobPage(View):
    """A page of jobs, newest first; `next_cursor` fetches the next (None: the last page)."""

    jobs: list[JobDetail]
    next_cursor: str | None


class EpicBody(Body):
    """`POST /api/v1/epics`: an epic to start (docs/how-to/epics.md)."""

    repo: str = Field(
        min_length=1,
        max_length=4096,
        description="The target git repository on the engine's "
        "host: an absolute path under one of the configuration's api.epic_repos.",
    )
    base: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="The commit the epic branch starts from (default: the repository's HEAD).",
    )
    epic: dict[str, Any] | str = Field(
        description="The epic: its file's YAML text (at most 256 KiB), or the same as a JSON "
        "object."
    )

    @field_validator("epic")
    @classmethod
    def _bounded(cls, v: dict[str, Any] | str) -> dict[str, Any] | str:
        if isinstance(v, str) and len(v) > 256 * 1024:
            raise ValueError("the epic's YAML text is over 256 KiB")
        return v


class CancelBody(Body):
    reason: str = Field("cancelled through the HTTP API", min_length=1, max_length=1000)


class PromoteBody(Body):
    """A human's approval of a pending learning; `note` is kept in its history."""

    note: str = Field("", max_length=1000)


class RetireBody(Body):
    """Why a learning is retired (kept in its history)."""

    reason: str = Field(min_length=1, max_length=1000)


class LogRange(View):
    """A byte range of an attempt's stdout or stderr (`data` as UTF-8, undecodable bytes
    replaced); read on from `next_offset`."""

    attempt: int | None
    stream: str
    offset: int
    next_offset: int
    complete: bool
    data: str


class Health(View):
    status: str
    store: str | None = None
    engine: str | None = None


class PurgeBody(Body):
    """`POST /api/v1/dlq/purge`: the jobs to purge, or `all` of the tenant's."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["jobs"], "properties": {"jobs": {"minItems": 1}}},
                {"required": ["all"], "properties": {"all": {"const": True}}},
            ]
        }
    )

    jobs: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(
        default_factory=list, max_length=10_000
    )
    all: bool = False


class ControlBody(Body):
    """A kill switch or a pause: its scope (`global`, `tenant`, `role`, `job`) and target."""

    scope: ScopeKind = ScopeKind.TENANT
    target: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    reason: str = Field(min_length=1, max_length=1000)


class KillSwitchBody(ControlBody):
    expires_in_s: float | None = Field(None, gt=0, le=bounds.MAX_EXPIRES_S)


class ResumeBody(Body):
    scope: ScopeKind = ScopeKind.TENANT
    target: Annotated[str, Field(min_length=1, max_length=200)] | None = None


class DecisionBody(Body):
    note: str = Field("", max_length=1000)


class Problem(BaseModel):
    """An error, RFC 9457 problem details (`application/problem+json`); `code` is the error's
    machine code (src/corral/api/problems.py maps it to the status)."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    code: str


class TokenCreate(Body):
    """`POST /api/v1/tokens` (admin): a token for `tenant` (default: the caller's)."""

    tenant: Name | None = None
    scopes: list[Annotated[str, Field(min_length=1, max_length=50)]] = Field(
        min_length=1, max_length=20
    )
    name: Annotated[str, Field(max_length=200)] | None = None
    expires_in_s: float | None = Field(None, gt=0, le=10 * 366 * 24 * 3600.0)


class BudgetBody(Body):
    """`POST /api/v1/budgets`: a ceiling for a tenant (the token's by default) or a role."""

    scope: Annotated[str, Field(pattern="^(tenant|role)$")] = "tenant"
    target: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    period: Annotated[str, Field(pattern="^(daily|monthly|rolling_30d)$")] = "monthly"
    ceiling_usd: float = Field(ge=0, le=bounds.MAX_USD)


class DarkLaunchBody(Body):
    """`POST /api/v1/dark-launches/{workflow}`: enable at `percentage`, or disable
    (`enabled: false`, the percentage kept)."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["percentage"], "properties": {"percentage": {"type": "integer"}}},
                {"required": ["enabled"], "properties": {"enabled": {"const": False}}},
            ]
        }
    )

    enabled: bool = True
    percentage: int | None = Field(None, ge=0, le=100)

    @model_validator(mode="after")
    def _percentage_to_enable(self) -> DarkLaunchBody:
        if self.enabled and self.percentage is None:
            raise ValueError("enabling a dark launch needs its percentage")
        return self


class IntentCreate(JobCreate):
    """`POST /agentops/intents`: a job's body; or a notebook's `{source, environment}`: the
    notebook (an absolute path, or one relative to `cwd`) run with papermill on that environment
    (a Ray environment runs it as a Ray job), with `parameters` and copied back to `copyback`."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["command"], "properties": {"command": {"minItems": 1}}},
                {
                    "required": ["prompt"],
                    "properties": {"prompt": {"type": "string", "minLength": 1}},
                },
                {"required": ["source"]},
                {"required": ["training"]},
            ]
        }
    )

    source: str | None = Field(None, min_length=1, max_length=4096)
    environment: Name | None = Field(None, description="The environment to run the notebook in.")
    parameters: dict[Annotated[str, Field(min_length=1, max_length=200)], Any] = Field(
        default_factory=dict, max_length=100
    )
    copyback: Annotated[str, Field(min_length=1, max_length=4096)] | None = None


class IntentAccepted(View):
    intent_id: str
    queue_position: int
    estimated_start_s: float


class IntentStatus(View):
    status: str
    checkpoint: dict[str, Any] | None
    tool_call_count: int
    duration_ms: int | None
