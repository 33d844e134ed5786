"""What `corral … --json` prints (and what the HTTP API will answer with), one model per shape.

Times are ISO 8601 UTC strings with milliseconds (`iso_time`), as docs/reference/cli.md says.
A model whose name matches a domain value has `of(value)` to build it; `dump` gives the JSON
object. The models forbid unknown fields, so the published JSON Schema
(docs/reference/schemas/) is exactly what is printed: tests/acceptance/test_json_schemas.py
runs every `--json` command and validates its output against it."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, create_model

from corral.domain import agents as da
from corral.domain import governance as dg
from corral.domain import models as dm
from corral.domain import tokens as dt_
from corral.domain.states import AttemptState, DedupMode, JobState

from . import plain
from .plain import iso_time as iso_time  # re-exported: the other schemas' times

IsoTime = Annotated[str, Field(json_schema_extra={"format": "date-time"})]


class View(BaseModel):
    """A JSON shape at the edge: unknown fields are an error, the dump is JSON-ready."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)

    def dump(self) -> dict[str, Any]:
        """The JSON object (field aliases such as `from`, enum values as strings)."""
        return self.model_dump(mode="json", by_alias=True)


# ---- jobs ----------------------------------------------------------------------------------


class Job(View):
    """A job in a list (`jobs`, `dlq list`, `wait`)."""

    id: str
    state: JobState
    role: str
    priority: int
    attempts: int = Field(description="How many attempts it has had.")
    worker: str
    env: str
    tenant: str
    command: list[str]
    key: str | None
    created_at: IsoTime | None
    updated_at: IsoTime | None
    exit_code: int | None
    last_error: str | None
    limit_hit: str | None

    @classmethod
    def fields_of(cls, j: dm.Job) -> dict[str, Any]:
        return plain.job(j)

    @classmethod
    def of(cls, j: dm.Job) -> Self:
        return cls(**cls.fields_of(j))


class JobDetail(Job):
    """A job with its limits, dependencies, cancel fields and agent options."""

    max_attempts: int
    timeout_s: float
    grace_s: float
    dedup: DedupMode
    after: list[str]
    cwd: str | None
    retry_at: IsoTime | None
    cancel_requested: str | None
    stop_kind: str | None
    requeued_from: str | None
    dlq_resolution: str | None
    parent_id: str | None
    depth: int
    workspace: str | None
    deps_pending: int
    prompt: str | None
    max_tool_calls: int
    token_budget_in: int
    token_budget_out: int
    resume_from: str | None
    secret_env: list[str]
    detached: bool
    # a notebook job: the notebook, its parameters, kernel and copyback directory
    notebook: dict[str, Any] | None = None
    # a training job: its method, script, model, dataset and what it is compared to
    training: dict[str, Any] | None = None

    @classmethod
    def fields_of(cls, j: dm.Job) -> dict[str, Any]:
        return plain.job_detail(j)


class Attempt(View):
    """One attempt of a job."""

    index: int
    id: str
    state: AttemptState
    exit_code: int | None
    signal: int | None
    outcome: str | None
    started: IsoTime | None
    ended: IsoTime | None
    pid: int | None
    error: str | None
    limit_hit: str | None
    permit_id: str
    deadline_at: IsoTime | None
    log_dir: str

    @classmethod
    def of(cls, a: dm.Attempt) -> Attempt:
        return cls(**plain.attempt(a))


class JobEvent(View):
    """One line of a job's timeline."""

    at: IsoTime | None
    kind: str
    from_: str | None = Field(alias="from")
    to: str | None
    attempt: int | None
    message: str
    data: dict[str, Any]

    @classmethod
    def of(cls, e: dm.JobEvent) -> JobEvent:
        return cls(**plain.job_event(e))


class ToolCall(View):
    """One tool call of an agent attempt."""

    tool: str
    input: dict[str, Any]
    output: str | None
    duration_ms: int | None
    denied: bool
    reason: str | None
    call_id: str | None


class AgentEvent(View):
    """The trace of one agent attempt, written once when it ends."""

    event_id: str
    job_id: str
    attempt: int
    at: IsoTime | None
    role: str
    worker: str
    tenant: str
    session_id: str | None
    cli_version: str | None
    model: str | None
    tool_calls: list[ToolCall]
    tokens_in: int
    tokens_out: int
    cost_usd: float | None
    exit_code: int | None
    outcome: str | None
    limit_hit: str | None
    retry_count: int
    checkpoint_count: int
    duration_ms: int | None
    final_text: str | None
    error: str | None
    model_calls: dict[str, Any] | None

    @classmethod
    def of(cls, e: da.AgentEvent) -> AgentEvent:
        return cls(**plain.agent_event(e))


class PolicyEvaluation(View):
    """One policy check and its verdict, with the inputs it used."""

    id: int | None
    at: IsoTime | None
    job: str
    attempt: int | None
    stage: str
    subject: str
    verdict: da.Verdict
    reason: str
    message: str
    inputs: dict[str, Any]

    @classmethod
    def of(cls, e: da.PolicyEvaluation) -> PolicyEvaluation:
        return cls(
            id=e.id,
            at=iso_time(e.at),
            job=e.job_id,
            attempt=e.attempt,
            stage=e.stage,
            subject=e.subject,
            verdict=e.verdict,
            reason=e.reason,
            message=e.message,
            inputs=dict(e.inputs),
        )


class TrainingRun(View):
    """One attempt's W&B run of a training job: what the runner recorded (the run id, the model
    it pushed) and what the offline run file holds (tags, config, summary, the loss curve as
    [step, value] pairs); `error` says why the file could not be read."""

    attempt: int | None
    run_id: str | None
    method: str | None
    wandb_mode: str | None
    run_file: str | None
    repo_id: str | None
    revision: str | None
    exit_code: int | None
    tags: list[str]
    config: dict[str, Any]
    summary: dict[str, Any]
    loss_metric: str | None
    loss: list[tuple[float, float]]
    error: str | None


class TrainingRuns(View):
    """`GET /api/v1/jobs/{id}/runs`: a training job's runs, one per attempt that ran."""

    job_id: str
    runs: list[TrainingRun]


class JobShow(JobDetail):
    """`show`: the job with its attempts (a list here, not a count), timeline and traces."""

    attempts: list[Attempt]  # type: ignore[assignment]
    timeline: list[JobEvent]
    agent_events: list[AgentEvent]
    trace_id: str = Field(
        description="the OpenTelemetry trace (32 hex digits) of the job's spans, submit to result"
    )
    # a training job's W&B runs (services/runs.py)
    runs: list[TrainingRun] = Field(default_factory=list)


class Trace(View):
    """`trace`: an agent job's traces and the policy decisions taken on the way."""

    job: str
    state: JobState
    worker: str
    agent_events: list[AgentEvent]
    policy_evaluations: list[PolicyEvaluation]


class Submitted(View):
    """`submit`: the job a submission resolved to."""

    id: str
    created: bool
    coalesced_on: str | None
    superseded: str | None
    state: JobState
    engine_serving: bool


class Cancelled(View):
    """`cancel`: the job and the reason its stop was recorded with."""

    id: str
    state: JobState
    cancel_requested: str | None


class Workspace(View):
    """`workspaces`: a workspace and the job that holds it."""

    workspace: str
    job: str
    acquired_at: IsoTime | None


class Requeued(View):
    """`dlq requeue`: the new job."""

    id: str
    requeued_from: str | None
    state: JobState


class Purged(View):
    """`dlq purge`: the jobs purged."""

    purged: list[str]


class Version(View):
    """`version`."""

    version: str


# ---- API tokens ----------------------------------------------------------------------------


class Token(View):
    """`token list`: an HTTP API token's record (never its secret nor its hash)."""

    id: str
    name: str
    tenant: str
    scopes: list[str]
    created_at: IsoTime | None
    created_by: str
    expires_at: IsoTime | None
    revoked_at: IsoTime | None
    revoked_by: str | None

    @classmethod
    def fields_of(cls, t: dt_.ApiToken) -> dict[str, Any]:
        return {
            "id": t.id,
            "name": t.name,
            "tenant": t.tenant,
            "scopes": list(t.scopes),
            "created_at": iso_time(t.created_at),
            "created_by": t.created_by,
            "expires_at": iso_time(t.expires_at),
            "revoked_at": iso_time(t.revoked_at),
            "revoked_by": t.revoked_by,
        }

    @classmethod
    def of(cls, t: dt_.ApiToken) -> Token:
        return cls(**cls.fields_of(t))


class TokenCreated(Token):
    """`token create`: the new token's record and its text, shown this once."""

    token: str = Field(description="What to send as `Authorization: Bearer …`; not stored.")

    @classmethod
    def created(cls, t: dt_.ApiToken, text: str) -> TokenCreated:
        return cls(**cls.fields_of(t), token=text)


# ---- governance records --------------------------------------------------------------------


def _is_time(name: str) -> bool:
    return name == "at" or name.endswith("_at")


def dataclass_model(cls: type[Any], doc: str | None, *, iso_times: bool) -> type[View]:
    """The view of a frozen dataclass of the domain: its fields, with the times (`at`, `*_at`)
    as ISO 8601 strings when `iso_times`. Built from the dataclass, so the two cannot
    disagree."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        time_field = iso_times and _is_time(f.name)
        fields[f.name] = (IsoTime | None if time_field else hints[f.name], ...)
    return create_model(cls.__name__, __base__=View, __doc__=doc, **fields)


def record_model(cls: type[Any]) -> type[View]:
    """The view of a governance record: its times as ISO 8601 strings."""
    return dataclass_model(cls, cls.__doc__, iso_times=True)


KillSwitch = record_model(dg.KillSwitch)
Pause = record_model(dg.Pause)
Approval = record_model(dg.Approval)
Incident = record_model(dg.Incident)
RunReportRecord = record_model(dg.RunReport)
RECORDS: Mapping[type, type[View]] = {
    dg.KillSwitch: KillSwitch,
    dg.Pause: Pause,
    dg.Approval: Approval,
    dg.Incident: Incident,
    dg.RunReport: RunReportRecord,
}


def record(value: Any) -> View:
    """The view of a governance record."""
    data = dataclasses.asdict(value)
    for key, v in data.items():
        if _is_time(key) and isinstance(v, int | float | None):
            data[key] = iso_time(v)
    return RECORDS[type(value)].model_validate(data)


class RunReport(RunReportRecord):  # type: ignore[misc,valid-type]
    """`report`: the run report with its incidents."""

    incidents: list[Incident]  # type: ignore[valid-type]


class NoReport(View):
    """`report` of a job that has none yet, and why."""

    job: str
    report: None
    reason: str


UnifiedRun = dataclass_model(
    dg.UnifiedRun,
    "`runs`: one row of the unified read model (times as epoch seconds, as stored).",
    iso_times=False,
)


class AuditReport(View):
    """`audit verify`: every append-only chain, checked."""

    ok: bool
    checked: int
    prechain: int
    checkpoints: int
    archived: int = Field(0, description="records checked in retention's archive files")
    archives_missing: int = Field(
        0, description="archive files the store names that were not found (not checked)"
    )
    first_bad: tuple[str, str, str] | None = Field(description="(table, row id, why)")
    problems: list[tuple[str, str, str]]


class GcReport(View):
    """`gc`: what retention removed (or, with --dry-run, would remove)."""

    dry_run: bool
    jobs: int = Field(description="terminal jobs archived and removed (or that would be)")
    held: int = Field(
        description="jobs past retention that must stay for now: a chain record of theirs"
        " comes after a job that is kept, or an event sink has not published it yet"
    )
    attempt_dirs: int = Field(description="attempt directories (with their logs) removed")
    batches: int
    archives: list[str] = Field(description="archive files written (JSON Lines)")
    job_ids: list[str] = Field(description="--dry-run: the jobs that would go")
    records: dict[str, int] = Field(description="per chain, the records archived")


class BudgetCeiling(View):
    """A budget ceiling."""

    scope: dg.ScopeKind
    target: str
    period: dg.Period
    ceiling_usd: float


class Budget(BudgetCeiling):
    """`budget status`: a ceiling and its period's spend now."""

    period_start: IsoTime | None
    resets_at: IsoTime | None
    spent_usd: float
    reserved_usd: float
    headroom_usd: float


class BudgetSet(Budget):
    """`budget set`: the new ceiling's status and the ceiling it replaced."""

    previous: BudgetCeiling | None


class DarkLaunch(View):
    """`dark-launch enable|disable|status`: a workflow's setting and md5 position."""

    workflow: str
    set: bool
    enabled: bool
    percentage: int | None
    position: int
    in_window: bool | None
    runs: bool


class PolicyCheck(View):
    """`policy check`: what the pre-run policy would say now."""

    verdict: dg.PrerunVerdict
    reason: dg.Reason
    step: str
    message: str
    snapshot: dict[str, Any]


class PolicyCount(View):
    stage: str
    verdict: str
    reason: str
    count: int


class PolicyStats(View):
    """`policy stats`: evaluations counted by stage, verdict and reason."""

    since: IsoTime | None
    total: int
    capped: bool
    counts: list[PolicyCount]


class LocalConfig(View):
    source: str | None
    hash: str
    same: bool


class ConfigShown(View):
    """`config show`: the configuration the engine serves (secrets redacted)."""

    active: bool
    engine: str | None
    since: IsoTime | None
    source: str | None
    hash: str
    text: str
    local: LocalConfig


class ConfigChecked(View):
    """`config check`: every problem of the configuration file, as `where: what`."""

    source: str | None  # None: no file, the built-in defaults
    ok: bool
    problems: list[str]


# ---- the engine's live mechanism: the core's own snapshot, open to new fields ---------------


class _Open(View):
    model_config = ConfigDict(extra="allow", frozen=True)


class EngineStatus(_Open):
    """`status`: the core's snapshot (permits, watchdog, store, breakers, escalations)."""


class ClusterHealth(View):
    """A Ray environment's cluster, asked now: nodes, CPUs and GPUs, its jobs by status."""

    env: str
    address: str
    reachable: bool
    error: str | None
    nodes_alive: int
    nodes_dead: int
    cpus_total: float
    cpus_used: float
    gpus_total: float
    gpus_used: float
    jobs: dict[str, int]
    corral_jobs: dict[str, int]


class Environment(View):
    """`GET /api/v1/environments`: an environment, its caps and (Ray) its cluster's health."""

    name: str
    kind: str
    address: str | None
    max_inflight: int
    max_queued: int | None
    cluster: ClusterHealth | None


class Breaker(_Open):
    """`breakers`: one circuit breaker."""

    name: str
    state: str


class BreakerReset(View):
    """`breakers reset`."""

    breaker: str
    state: str


class Escalation(_Open):
    """`escalations list`: one active escalation."""

    id: str


class CoreEvent(_Open):
    """`events`: one recorded core decision."""


class PublishedBody(_Open):
    """What a sink carries of one record: a committed row of an outbox table (`source` names
    it; its columns, JSON columns as values) or an AgentEvent (`intent_id`, the job)."""

    event_id: str = Field(
        description="the dedup id: `<table>:<seq>` for a record, the AgentEvent's own id"
    )
    source: str | None = Field(None, description="the outbox table of a record")
    intent_id: str | None = Field(None, description="an AgentEvent's job")


class TailedEvent(View):
    """`events tail --json`: one line (JSON Lines) per event published to the sink."""

    event_id: str = Field(description="the dedup id (JetStream Nats-Msg-Id)")
    subject: str = Field(
        description="mp.agent.events, corral.jobs.<state>, corral.jobs.event.<kind> or"
        " corral.governance.<kind>"
    )
    body: PublishedBody


class EscalationCleared(View):
    """`escalations clear`: the escalation ended, and (a core crash loop) the core's state."""

    escalation: str | None
    cleared: bool
    core: dict[str, Any] | None = None


class GuardCheck(View):
    """`guard check`: the engine's decision on one tool call, command or SQL of a role."""

    role: str
    stage: str
    tool: str
    verdict: str
    reason: str
    rule_id: str | None
    decided_by: str
    scope_rule: str | None = Field(
        default=None,
        description="Only for a tool call: the scope rule that decided, if the scope did.",
    )
    command: str | None
    message: str
    approval_subject: str | None
    approval_digest: str | None
    shell: str | None = Field(
        default=None, description="Only for a tool call: the shell its command is read as."
    )
    cwd: str | None = Field(
        default=None, description="Only for a tool call: the directory it runs in."
    )


# ---- the world model ---------------------------------------------------------------------------


class WorldAgent(View):
    """A running attempt in the world model, keyed by its job's id."""

    role: str
    status: JobState
    attempt: int
    worker: str
    env: str
    tenant: str
    started_at: IsoTime | None
    tool_call_count: int = Field(description="Tool calls so far, as its latest checkpoint says.")
    current_tool: str | None = Field(description="The tool of its latest checkpoint.")
    session_id: str | None


class WorldEnvironment(View):
    """One environment's user plane, keyed by its name."""

    kind: str
    jobs_in_flight: int
    cap: int = Field(description="Attempts it runs at once at most (its max_inflight).")
    queue_depth: int = Field(description="Jobs waiting for it: QUEUED or RETRY_WAIT.")
    cluster_status: str | None = Field(description="What a cluster reports; null when local.")
    gpu_utilisation: float | None = Field(description="What a cluster reports; else null.")


WorldRelationship = typing.Literal["spawned_by", "blocked_by", "waits_for", "waits_for_slot"]


class WorldEdge(View):
    """An execution-topology edge: `job_id` was spawned by, or waits for, `related_job_id`."""

    job_id: str
    related_job_id: str
    relationship: WorldRelationship
    slot: str | None = Field(
        description="waits_for_slot: the full slot, `role:NAME` or `env:NAME`; else null."
    )


class UserPlaneJob(View):
    """What a job started outside Corral's own processes; null until an environment records
    it."""

    ray_submission_id: str | None
    notebook: str | None
    wandb_run: str | None


class WorldCause(View):
    """A causal-graph link: root intent → job → user-plane job → outcome."""

    control_plane_intent_id: str
    root_intent_id: str
    parent_intent_id: str | None
    role: str
    state: JobState
    user_plane_job: UserPlaneJob
    outcome: str | None = Field(description="The job's final state once it ended; else null.")
    exit_code: int | None


class WorldDeadlock(View):
    """A cycle of waits: `jobs` in order, `cycle[i]` the edge from `jobs[i]` to the next."""

    jobs: list[str]
    cycle: list[WorldEdge]
    message: str


class WorldModel(View):
    """`world`, and `GET /agentops/world-model`: the fleet as the store shows it now."""

    at: IsoTime | None
    agents: dict[str, WorldAgent]
    user_plane: dict[str, WorldEnvironment]
    execution_topology: list[WorldEdge]
    causal_graph: list[WorldCause]
    deadlocks: list[WorldDeadlock]


class Baseline(View):
    """`world baselines`: one rolling baseline of the anomaly detector."""

    role: str
    kind: str = Field(description="The jobs' workflow, else their worker kind.")
    metric: str = Field(description="tool_calls, tokens, duration_s or cost_usd, per attempt.")
    samples: int = Field(description="How many finished attempts it holds (the latest).")
    median: float | None
    ready: bool = Field(description="Whether it has enough samples to flag anything.")
    updated_at: IsoTime | None

    @classmethod
    def of(cls, b: dm.Baseline) -> Self:
        return cls(
            role=b.role,
            kind=b.kind,
            metric=b.metric,
            samples=len(b.samples),
            median=b.median,
            ready=b.ready,
            updated_at=iso_time(b.updated_at),
        )


class ReplayJob(View):
    """A job of a replayed chain."""

    id: str
    parent_id: str | None
    depth: int
    role: str
    state: JobState
    created_at: IsoTime | None


class ReplayStep(View):
    """One step of a replay, in time order."""

    at: IsoTime | None
    job_id: str
    kind: typing.Literal["event", "tool_call", "policy"]
    attempt: int | None
    subject: str = Field(description="An event's kind, a tool's name, or a policy stage.")
    detail: str


class Replay(View):
    """`replay`: the control-plane chain behind a job and whether its records are intact."""

    job_id: str
    root_intent_id: str
    attempt: int | None = Field(
        default=None,
        description="The attempt a Ray submission id or W&B run id named (else null).",
    )
    jobs: list[ReplayJob]
    steps: list[ReplayStep]
    audit: AuditReport
    cut: bool = Field(description="Whether the tree had more jobs than a replay follows.")
