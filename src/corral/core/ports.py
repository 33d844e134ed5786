"""The ports the inner rooms talk through: the store, split by concern, and the worker adapters."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from corral.core.jobquery import JobQuery as JobQuery  # re-exported: a port's query
from corral.domain.agents import AgentEvent, Checkpoint, PolicyEvaluation
from corral.domain.epics import EpicRecord, EpicState, TaskRecord, TaskState, WaveRecord
from corral.domain.governance import (
    Approval,
    ApprovalState,
    BudgetCeiling,
    DarkLaunch,
    Incident,
    KillSwitch,
    Pause,
    RunReport,
    ScopeKind,
    UnifiedRun,
)
from corral.domain.knowledge import (
    ArmStats,
    Citation,
    KnowledgeRun,
    Learning,
    LearningChange,
    LearningKind,
    LearningStatus,
    LearningUpdate,
    Tier,
)
from corral.domain.models import (
    Attempt,
    AttemptResult,
    AttemptSketch,
    Baseline,
    Claimed,
    EngineInfo,
    Job,
    JobEvent,
    JobSketch,
    Permit,
    SubmitResult,
)
from corral.domain.settings import RetentionSpec, WorkspacePolicy
from corral.domain.states import JobState
from corral.domain.tokens import ApiToken, TokenEvent


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
class Admission:
    """What a submission must pass besides its idempotency key, checked atomically with the insert.

    Queue bounds count the jobs waiting to run: QUEUED or RETRY_WAIT.
    The workspace policy applies when another active job already holds the job's workspace.
    """

    max_queued: int | None = None  # over all environments (None: unbounded)
    env_max_queued: int | None = None  # in the job's environment
    workspace_policy: WorkspacePolicy = WorkspacePolicy.SERIALIZE
    retry_after_s: float = 5.0  # a refusal's retry-after when nothing started lately
    rate_window_s: float = 60.0  # how far back the start rate behind that estimate looks


UNBOUNDED = Admission()


class AuditKey(Protocol):
    """Where the audit chain's key comes from (workers/sealing.py KeyFile: `audit.key`)."""

    def get(self, *, create: bool) -> bytes | None:
        """The key (created first when `create`), or None when there is none."""


@dataclass(frozen=True, slots=True)
class ChainHead:
    """A chain's tip as the store records it; `keyed_from`: its first keyed seq."""

    seq: int
    hash: str
    keyed_from: int | None = None


@dataclass(frozen=True, slots=True)
class ChainMark:
    """A signed checkpoint of one chain's head, read from outside the database."""

    chain: str
    seq: int
    hash: str
    at: float
    keyed_from: int | None = None

    @property
    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.at))


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditReport:
    """What `verify_audit` found: every append-only table's hash chain, row by row.

    `first_bad` is (table, row id, why) of the first row that breaks its chain; `problems` lists
    every one found (a tampered row breaks only itself: the next row still links to its hash).
    `prechain`: job events written before the timeline was chained (migration 0012)."""

    ok: bool
    checked: int
    prechain: int = 0
    checkpoints: int = 0
    archived: int = 0  # records checked in retention's archive files
    archives_missing: int = 0  # archive files the store names that are not on disk
    first_bad: tuple[str, str, str] | None = None
    problems: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetStatus:
    """A budget scope's spend in the window since `period_start` (reservations not yet committed
    count as `reserved`); `remaining` is None without a ceiling."""

    scope: ScopeKind
    target: str
    period_start: float
    ceiling: BudgetCeiling | None
    spent: float
    reserved: float

    @property
    def remaining(self) -> float | None:
        if self.ceiling is None:
            return None
        return self.ceiling.ceiling_usd - self.spent - self.reserved


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """The configuration an engine serves with, as it recorded it when it started: the file's
    text with secret-looking values redacted, and that text's sha256 (`hash`)."""

    engine_id: str
    at: float
    hash: str
    source: str | None  # the file it read (None: the built-in defaults)
    text: str


class Tally(NamedTuple):
    """One aggregate the store counted: its label values (in the order the field documents) and
    the figure."""

    labels: tuple[str, ...]
    value: float


class Distribution(NamedTuple):
    """Observations of one labelled series bucketed when read: `cumulative[i]` observations are
    ≤ the i-th bound asked for, `observed` is all of them and `total` their sum (a Prometheus
    histogram's buckets, _count and _sum)."""

    labels: tuple[str, ...]
    cumulative: tuple[int, ...]
    observed: int
    total: float


# The histograms' bucket upper bounds (seconds) of attempt run time and submit → running
# latency: the metrics (trace/metrics.py) and retention, which carries the histograms of the jobs
# it archives forward (runtime/retention.py).
METRIC_BOUNDS: tuple[float, ...] = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetFigures:
    """What every engine sharing the store has done, aggregated in the store when asked (so any
    engine reports the fleet's figures, and a restart loses nothing): what trace/metrics.py
    exposes. Label orders:

    - `jobs`: (role, environment, priority, state), jobs;
    - `dlq`: (role,), dead-lettered jobs not resolved (requeued or purged) yet;
    - `inflight`: (role, environment, worker), attempts STARTING or RUNNING;
    - `attempts`: (role,), every attempt; `retries`: (role,), attempts after the first;
    - `attempt_seconds`: (role,), ended attempts' run time (started → ended);
    - `start_seconds`: (role,), submit → running of each job's first attempt;
    - `tool_calls`: (verdict, reason), the tool-call policy evaluations;
    - `usage`: (role, tenant, worker) with values tokens in, tokens out, cost in USD;
    - `removed`: (role, environment, priority, state), jobs retention removed from the store
      (what finished counts keep of them; `tool_calls` and `usage` include theirs)."""

    jobs: tuple[Tally, ...] = ()
    dlq: tuple[Tally, ...] = ()
    inflight: tuple[Tally, ...] = ()
    attempts: tuple[Tally, ...] = ()
    retries: tuple[Tally, ...] = ()
    attempt_seconds: tuple[Distribution, ...] = ()
    start_seconds: tuple[Distribution, ...] = ()
    tool_calls: tuple[Tally, ...] = ()
    usage: tuple[tuple[tuple[str, ...], int, int, float], ...] = ()
    removed: tuple[Tally, ...] = ()


# Policy-evaluation stages of tool calls (policy/toolcall.py); a guardrail row about the spawn
# itself (subject "spawn", runtime/gate.py) is a pre-run decision, not a tool call.
TOOL_CALL_STAGES = ("tool_call", "guardrail")


class StoreLifecycle(Protocol):
    """Opening and closing the store (an engine or a command holds it open while it works)."""

    async def open(self) -> None:
        """Connect and migrate to the current schema."""

    async def close(self) -> None: ...


class JobStore(Protocol):
    """Jobs and their attempts: submission with its admission, the dispatch cycle (reserve, start,
    run, finish), stops and retries, the dead-letter queue, workspaces held, and the reads of jobs,
    attempts and their timeline. Every state change is a compare-and-set."""

    async def submit(
        self,
        job: Job,
        *,
        now: float,
        aging_s: float,
        admission: Admission = UNBOUNDED,
        evaluations: Sequence[PolicyEvaluation] = (),
    ) -> SubmitResult:
        """Persist a new job, applying its idempotency key, workspace policy, queue bounds and
        dependencies atomically; Backpressure past a bound, Conflict for a rejected workspace.
        `evaluations` (the pre-run policy's of the job) are appended in the same transaction
        when the job is created, and not at all when it coalesces into another."""

    async def reserve(
        self, *, engine_id: str, now: float, limit: int, where: QueueFilter
    ) -> list[Job]:
        """Queued, runnable jobs in queue order, leased to this engine for a few seconds.

        A job whose workspace is held by another job, or that is not the first runnable job on
        its free workspace, is not runnable (serialize: one at a time, in queue order)."""

    async def start_attempts(
        self,
        claims: Sequence[Claimed],
        *,
        now: float,
        evaluations: Sequence[PolicyEvaluation] = (),
    ) -> list[Claimed]:
        """QUEUED → STARTING with a new attempt row, per claim; returns the ones that won.

        A job with a workspace takes its lock here (or holds it already); a claim whose workspace
        another job holds loses. `evaluations` (the pre-run policy's that let the jobs in) are
        appended in the same transaction, whichever claims win."""

    async def mark_running(
        self, started: Sequence[tuple[Attempt, AttemptRef]], *, now: float
    ) -> int:
        """STARTING → RUNNING for each (attempt, where it runs) that now exists."""

    async def finish(self, finishes: Sequence[Finish], *, now: float) -> list[Job]:
        """Close attempts and move their jobs; releases keys and settles dependents.

        Returns the jobs that moved; an attempt already closed by another path is skipped."""

    async def request_cancel(self, job_id: str, *, reason: str, kind: str, now: float) -> Job:
        """Persist a stop request; queued jobs are cancelled at once, running ones flagged."""

    async def release_approved(self, job_id: str, *, now: float, aging_s: float) -> Job:
        """AWAITING_APPROVAL → QUEUED, once a human approved the run (StaleState otherwise)."""

    async def promote_retries(self, *, now: float, aging_s: float) -> int:
        """RETRY_WAIT → QUEUED for every job whose backoff has passed."""

    async def next_retry_at(self) -> float | None: ...

    async def active_runs(self, tenant: str) -> list[str]:
        """Ids of the tenant's jobs with a live attempt (STARTING or RUNNING)."""

    async def inflight(self) -> list[tuple[Job, Attempt]]:
        """Every job with a live attempt (STARTING or RUNNING), for recovery and cancels."""

    async def get_job(self, ref: str) -> Job:
        """A job by id or a unique prefix or suffix of its id (domain.ids.resolve); NotFound,
        or InvalidRequest naming the candidates when the reference is ambiguous."""

    async def short_ids(self, ids: Sequence[str]) -> dict[str, str]:
        """Each job id's shortest suffix (domain.ids.SHORT_MIN or more characters) that no
        other job's id ends or begins with: what tables print."""

    async def queued_ahead(self, job: Job) -> int:
        """How many runnable QUEUED jobs come before this one in queue order."""

    async def list_jobs(self, query: JobQuery) -> list[Job]: ...

    async def attempts(self, job_id: str) -> list[Attempt]: ...

    async def events(self, job_id: str, *, after_id: int = 0) -> list[tuple[int, JobEvent]]: ...

    async def append_events(self, events: Sequence[JobEvent]) -> None: ...

    async def counts(self, tenant: str | None = None) -> dict[str, int]:
        """Jobs per state (of one tenant when given)."""

    async def lane_counts(self) -> dict[tuple[str, str, str], int]:
        """Jobs waiting (QUEUED, RETRY_WAIT) or running (STARTING, RUNNING) per (role,
        environment, state)."""

    async def dlq_requeue(
        self, job_id: str, new_job: Job, *, now: float, admission: Admission = UNBOUNDED
    ) -> Job:
        """Resolve a dead-lettered job by submitting a fresh copy with a fresh attempt budget."""

    async def dlq_purge(self, job_id: str, *, now: float) -> Job:
        """Resolve a dead-lettered job by dropping it from the queue view (the record stays)."""

    async def workspaces(self) -> list[tuple[str, str, float]]:
        """Held workspaces: (workspace, holder job id, acquired at), by workspace."""

    async def workspace_lock_waits(self, since: float) -> list[float]:
        """Milliseconds each job waited for its workspace, of the locks taken since `since`
        (only jobs that found their workspace held; oldest first)."""

    async def queue_reading(
        self, env: str, *, since: float
    ) -> tuple[int, list[float], list[float]]:
        """One environment's queue for predictive throttling (corral.world.throttle): the jobs
        waiting in it now, when each job submitted to it since `since` was created (those that
        entered the queue: not denied, not held for approval), and when each of its attempts
        started since then."""


class TraceStore(Protocol):
    """What happened inside runs and in the core: agents' events, checkpoints, core decisions."""

    async def record_agent_event(self, event: AgentEvent) -> bool:
        """Persist an attempt's AgentEvent; False (and nothing written) if it has one already."""

    async def agent_events(self, job_id: str) -> list[AgentEvent]:
        """The job's AgentEvents, by attempt."""

    async def append_checkpoint(self, checkpoint: Checkpoint) -> None: ...

    async def checkpoints(self, job_id: str) -> list[Checkpoint]:
        """The job's checkpoints, oldest first (the last one is where a resume starts)."""

    async def append_core_events(self, events: Sequence[Mapping[str, Any]]) -> None:
        """Record the core's decisions (breaker transitions, defense stages, escalations)."""

    async def core_events(
        self, *, kind: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """The latest recorded core decisions, oldest first."""


class GovernanceStore(Protocol):
    """Governance records, append-only and hash-chained (store/chain.py): policy evaluations, run
    reports and incidents, kill switches, pauses, budgets, dark launches, approvals, and the
    unified run read model."""

    async def append_policy_evaluations(self, evaluations: Sequence[PolicyEvaluation]) -> None:
        """Append policy decisions; rows are never changed afterwards."""

    async def policy_evaluations(
        self, job_id: str, *, attempt: int | None = None, limit: int = 1000
    ) -> list[PolicyEvaluation]:
        """A job's policy evaluations (of one attempt, if given), oldest first."""

    async def recent_policy_evaluations(
        self,
        *,
        limit: int = 100,
        stage: str | None = None,
        verdict: str | None = None,
        since: float | None = None,
        tenant: str | None = None,
    ) -> list[PolicyEvaluation]:
        """The latest `limit` policy evaluations across jobs (of this stage and verdict, at or
        after `since`, of `tenant`'s jobs, when given), newest last; none when `limit` ≤ 0."""

    async def record_report(
        self, report: RunReport, incidents: Sequence[Incident] = ()
    ) -> RunReport:
        """Write a job's run report (its chain hash set) with its incidents, in one transaction;
        Conflict if the job has one already."""

    async def record_reports(
        self, items: Sequence[tuple[RunReport, Sequence[Incident]]]
    ) -> list[RunReport | None]:
        """Write several jobs' run reports with their incidents in one transaction (what the
        reporter does per batch); for each, the report written, or None when the job has one
        already or is not a terminal job (nothing of it is written)."""

    async def report(self, job_id: str) -> RunReport | None: ...

    async def append_incidents(self, incidents: Sequence[Incident]) -> list[Incident]:
        """Append incidents (hashes set). One with `resolves` is the resolution of that incident:
        NotFound if it names none, Conflict if that one is resolved already or is a resolution."""

    async def incidents(
        self,
        job_id: str | None = None,
        *,
        open_only: bool = False,
        limit: int = 1000,
        tenant: str | None = None,
    ) -> list[Incident]:
        """Incidents and resolutions, oldest first (the latest `limit`); open_only: incidents
        without a resolution (resolutions themselves excluded); `tenant`: only those of that
        tenant's jobs (the store filters before the limit)."""

    async def open_incidents(self, job_id: str | None = None) -> list[Incident]:
        """Incidents without a resolution record (resolutions themselves excluded)."""

    async def activate_kill_switch(self, switch: KillSwitch) -> KillSwitch:
        """Record an activation; Conflict if the id is taken."""

    async def lift_kill_switch(self, switch_id: str, *, at: float, by: str) -> KillSwitch:
        """Record the lifting as a new row; NotFound / Conflict if unknown or lifted already."""

    async def kill_switches(self, *, active_at: float | None = None) -> list[KillSwitch]:
        """Every switch (lifted_at filled in), or those active at `active_at`; oldest first."""

    async def activate_pause(self, pause: Pause) -> Pause: ...

    async def lift_pause(self, pause_id: str, *, at: float, by: str) -> Pause: ...

    async def pauses(self, *, active_only: bool = True) -> list[Pause]: ...

    async def set_budget(
        self, ceiling: BudgetCeiling, *, at: float | None = None, by: str = ""
    ) -> None:
        """Set a scope's ceiling; the latest one per (scope, target) wins, history is kept."""

    async def budgets(self) -> list[BudgetCeiling]:
        """The ceilings in force (latest per scope and target)."""

    async def reserve_budget(
        self,
        scope: ScopeKind,
        target: str,
        period_start: float,
        amount: float,
        job_id: str,
        *,
        at: float | None = None,
    ) -> bool:
        """Hold `amount` for the job, atomically with the check: admitted (True, recorded) only
        if spent + reserved since `period_start` + amount ≤ the ceiling and some room is left
        (or there is no ceiling). Spend counts in the window its reservation was made in.
        Race-free across engines. A job's open reservation on the scope is not taken twice."""

    async def commit_budget(self, job_id: str, actual: float, *, at: float | None = None) -> int:
        """Settle each open reservation of the job at its actual cost (0 releases it); returns
        how many were settled."""

    async def budget_status(
        self, scope: ScopeKind, target: str, period_start: float
    ) -> BudgetStatus: ...

    async def set_dark_launch(
        self, launch: DarkLaunch, *, at: float | None = None, by: str = ""
    ) -> None:
        """Set a workflow's dark launch; the latest per workflow wins, history is kept."""

    async def dark_launch(self, workflow: str) -> DarkLaunch | None: ...

    async def dark_launches(self) -> list[DarkLaunch]: ...

    async def request_approval(self, approval: Approval) -> Approval:
        """Record a pending approval; Conflict if the id is taken."""

    async def decide_approval(
        self, approval_id: str, state: ApprovalState, *, at: float, by: str, note: str = ""
    ) -> Approval:
        """Approve or deny a pending approval (a new event row); Conflict if it is decided
        already or expired (at ≥ expires_at); NotFound if unknown."""

    async def approval(self, approval_id: str) -> Approval:
        """The approval in its current state (its latest event); NotFound otherwise."""

    async def approvals(
        self, *, job_id: str | None = None, state: ApprovalState | None = None
    ) -> list[Approval]: ...

    async def expire_approvals(self, now: float) -> list[Approval]:
        """PENDING approvals past expires_at become EXPIRED (new rows); returns them."""

    async def run_unified(
        self,
        limit: int = 100,
        *,
        state: str | None = None,
        tenant: str | None = None,
        before: str | None = None,
    ) -> list[UnifiedRun]:
        """The `v_run_unified` read model, newest jobs first (of one tenant's jobs, if given;
        older than the job id `before`, if given: the next page)."""

    async def unreported(self, limit: int = 100) -> list[str]:
        """Ids of terminal jobs that have no run report yet, oldest change first."""

    async def throttle_state(self, subject: str) -> bool:
        """Whether the latest throttle decision about `subject` (`env:NAME`) left it throttled:
        its latest policy evaluation of stage `throttle` that started, kept or released one."""


class AuditStore(Protocol):
    """The audit of the append-only tables: their key, their chains' heads and their triggers."""

    def use_audit_key(self, key: AuditKey) -> None:
        """Hash the audit chains with HMAC-SHA256 under this key from now on."""

    async def verify_audit(self, marks: Sequence[ChainMark] = ()) -> AuditReport:
        """Recompute every append-only table's hash chain (keyed rows with the audit key), check
        it passes through every checkpoint in `marks` and reaches the last, and that every
        append-only trigger is in place."""

    async def audit_heads(self) -> dict[str, ChainHead]:
        """Every chain's tip (what a checkpoint records)."""

    async def missing_triggers(self) -> list[str]:
        """The append-only triggers that are missing or disabled (none on a sound store)."""

    async def restore_triggers(self) -> list[str]:
        """Put back every missing or disabled append-only trigger; the ones put back."""


class EngineRegistry(Protocol):
    """The engines that share the store: registration, heartbeats, take-over and fencing, and the
    configuration each published when it started."""

    async def live_engines(self, *, since: float) -> list[str]:
        """Ids of the engines that heart-beat (or started) at or after `since`."""

    async def publish_config(self, config: EngineConfig) -> None:
        """Record the configuration an engine starts with (rows are only added)."""

    async def active_config(self) -> EngineConfig | None:
        """The configuration the engine that started last recorded; None if none ever did."""

    async def register_engine(self, engine_id: str, *, pid: int, host: str, now: float) -> None: ...

    async def heartbeat_engine(self, engine_id: str, *, now: float) -> bool:
        """Record that the engine is alive; False when a peer declared it dead (fenced it) and
        took its attempts over: it must not act on them any more."""

    async def engines(self) -> list[EngineInfo]:
        """Every engine registered, by id."""

    async def take_over(
        self, engine_id: str, attempts: Sequence[Attempt], *, fence: Sequence[str], now: float
    ) -> list[str]:
        """Make `engine_id` the owner of each attempt still in flight and still owned by the
        engine its `engine_id` names (a compare-and-set: of two peers, one wins), and fence the
        engines in `fence`, in one transaction. Returns the ids of the attempts taken. Attempt
        state writes (`mark_running`, `finish`) only apply for the owner their attempt names."""

    async def stale_engines(self, *, before: float, exclude: str) -> list[str]:
        """Engines whose last heartbeat is older than `before` (their attempts need a home)."""


class JobGovernance(JobStore, GovernanceStore, Protocol):
    """Jobs with their governance records: what the pre-run gate, a wait and most of an
    operator's read models need."""


class JobTraces(JobStore, TraceStore, Protocol):
    """Jobs with what their attempts recorded (agent events, checkpoints)."""


@dataclass(frozen=True, slots=True)
class RunRecords:
    """What an ended job's run report is built from (runtime/reporter.py), read together."""

    job: Job
    attempts: list[Attempt]
    agent_events: list[AgentEvent]
    evaluations: list[PolicyEvaluation]
    attempt_ends: list[JobEvent]  # its `attempt_ended` timeline lines, in order


class RunReads(Protocol):
    """The records a batch of run reports is built from (runtime/reporter.py)."""

    async def run_records(self, job_ids: Sequence[str]) -> list[RunRecords]:
        """The records of these jobs in one read, in the order asked; a job that is not in the
        store is left out. A batch of reports reads its jobs once, not five reads per job."""


class JobRecords(JobStore, TraceStore, GovernanceStore, Protocol):
    """Jobs, their traces and their governance records: what the tool-call governor and the
    reporter read and write of an attempt, and a job's trace."""


class Operations(JobStore, GovernanceStore, EngineRegistry, Protocol):
    """Jobs and governance records with the configuration the engine published: what a change
    an operator makes against a running engine's settings needs (a submission, an approval, a
    requeue, a policy check, a wait)."""


@dataclass(frozen=True, slots=True)
class EventCursor:
    """How far one sink has published one outbox table: rows up to `last_id` (their `seq`) are
    out; `skipped` rows were jumped over when the backlog passed its bound."""

    sink: str
    source: str
    last_id: int
    skipped: int = 0
    holder: str | None = None
    lease_until: float | None = None


class OutboxReads(Protocol):
    """The committed records as an outbox (trace/drain.py): the append-only tables, read past a
    cursor in `seq` order, and the per-sink cursors with the lease that lets one engine drain."""

    async def outbox_rows(self, source: str, *, after: int, limit: int) -> list[Mapping[str, Any]]:
        """Rows of the append-only table `source` whose `seq` is above `after`, by `seq`, at most
        `limit`; each a mapping of its columns as stored (JSON columns as text)."""

    async def outbox_tip(self, source: str) -> int:
        """The highest `seq` committed in `source` (0: none)."""

    async def outbox_agent_events(self, job_ids: Sequence[str]) -> list[AgentEvent]:
        """The AgentEvents of these jobs, in one read (a batch of timeline rows' attempts)."""

    async def claim_cursors(
        self, sink: str, sources: Sequence[str], *, holder: str, now: float, lease_s: float
    ) -> list[EventCursor] | None:
        """Create the sink's missing cursors (at 0, or after the segment retention archived)
        and lease them all to `holder` until
        `now + lease_s` unless another holder's lease is still running (then None)."""

    async def advance_cursor(
        self, sink: str, source: str, *, holder: str, last_id: int, skipped: int = 0, now: float
    ) -> bool:
        """Move the cursor forward to `last_id` and add `skipped`, if `holder` still holds the
        lease (False: it lost it; another engine drains now)."""

    async def event_cursors(self) -> list[EventCursor]:
        """Every sink's cursors, by sink and source."""


class MetricsReads(Protocol):
    """The aggregates a metrics scrape needs, each one GROUP BY query (trace/metrics.py)."""

    async def fleet_figures(self, bounds: Sequence[float]) -> FleetFigures:
        """Every job's, attempt's, tool call's and usage figure, aggregated now; `bounds`
        (seconds, ascending) are the histograms' bucket upper bounds."""


class TokenStore(Protocol):
    """The HTTP API's bearer tokens (domain/tokens.py): only their secrets' hashes are kept;
    rows are added and revoked, never deleted."""

    async def create_token(self, token: ApiToken) -> None:
        """Record a new token (its id is fresh)."""

    async def token(self, token_id: str) -> ApiToken:
        """The token with this exact id; NotFound otherwise."""

    async def tokens(self) -> list[ApiToken]:
        """Every token, revoked ones too, oldest first."""

    async def revoke_token(self, token_id: str, *, at: float, by: str) -> ApiToken:
        """Revoke a token from `at` on; NotFound when none has the id, Conflict when it is
        already revoked."""

    async def token_events(self) -> list[TokenEvent]:
        """Every creation and revocation of a token, oldest first, as the audit chain
        (`token_events`) holds them; `create_token` and `revoke_token` append them by `by` /
        the token's `created_by`, in their own transaction."""


# The chains whose rows belong to jobs: retention archives a segment of each (store/retention.py)
# with the jobs they belong to (the rest hold what stays in force: switches, budget ceilings and
# the ledger of a period's spending, dark launches, tokens — kept whole, verified in place).
ARCHIVED_CHAINS = (
    "job_events",
    "policy_evaluations",
    "run_reports",
    "incidents",
    "approval_events",
)


@dataclass(frozen=True, slots=True)
class GcBatch:
    """One retention step, read in one transaction: the jobs that go, every row of theirs as
    stored (table → rows; the chains' rows are whole segments), each archived chain's segment
    as (head archived before, head after), the attempt directories to remove, and how many
    candidates had to stay this time (a chain row of theirs lies past a job that is kept, or an
    event sink has not published it yet)."""

    jobs: tuple[str, ...]
    rows: Mapping[str, tuple[Mapping[str, Any], ...]]
    segments: Mapping[str, tuple[ChainHead, ChainHead]]
    dirs: tuple[str, ...] = ()
    held: int = 0


@dataclass(frozen=True, slots=True)
class ArchiveRecord:
    """An archive file written by retention, with the chain segments it holds."""

    id: int
    at: float
    file: str
    jobs: int
    segments: Mapping[str, tuple[ChainHead, ChainHead]]


class RetentionStore(Protocol):
    """Retention (services/retention.py): which terminal jobs are past it, their rows read for
    the archive, then deleted in one transaction; the archived chains' heads; a lease so that one
    engine collects at a time."""

    async def gc_candidates(self, retention: RetentionSpec, *, now: float, limit: int) -> list[str]:
        """Ids of terminal jobs past their role's retention (older than `keep_days` since their
        last change, or beyond the newest `keep_jobs`), in submission order (the order of their
        first chain records), at most `limit`. Never a job that is not
        terminal, a dead-lettered one not resolved yet, one whose parent has not ended, or one
        without its run report yet."""

    async def gc_collect(self, job_ids: Sequence[str], *, sinks: Sequence[str]) -> GcBatch:
        """The rows of those of `job_ids` that can go now: a job goes only when each archived
        chain's rows of it lie in the segment from the archived head up to the first row of a
        job that stays, and (for each sink in `sinks`) that the sink has published."""

    async def gc_remove(
        self, batch: GcBatch, *, archive: str, now: float, bounds: Sequence[float]
    ) -> int:
        """Delete the batch's rows in one transaction after its archive file was written:
        fold what the metrics count of them into the rollups (`bounds`: the histograms'), move
        each chain's archived head, record the archive. Conflict when an archived head moved
        since the batch was read (another engine collected). Returns the jobs deleted."""

    async def gc_known(self, job_ids: Sequence[str]) -> set[str]:
        """Which of these exact ids are jobs in the store (an attempt directory whose job is
        not is left over)."""

    async def archived_heads(self) -> dict[str, ChainHead]:
        """Per archived chain, the last seq archived and its hash (where verification starts)."""

    async def archives(self) -> list[ArchiveRecord]:
        """Every archive retention wrote, oldest first."""

    async def claim_gc(self, holder: str, *, now: float, lease_s: float) -> bool:
        """Take (or renew) the retention lease unless another holder's is still running."""

    async def release_gc(self, holder: str) -> None:
        """Give the lease back (a no-op when `holder` does not hold it)."""


class ArchivedAudit(AuditStore, RetentionStore, Protocol):
    """The audit chains with what retention archived of them: what verification reads."""


class WorldReads(Protocol):
    """What the world model reads at once (services/world.py, runtime/worldwatch.py)."""

    async def world_jobs(self, *, finished: int) -> list[JobSketch]:
        """The live jobs not in flight that can take part in the topology or the causal graph —
        every one not waiting in the queue (SUBMITTED, AWAITING_APPROVAL), and those waiting
        (QUEUED, RETRY_WAIT) that another job submitted or that wait on a dependency — and the
        latest `finished` ended ones (newest first). The jobs in flight are `world_inflight`'s;
        a job waiting in the queue on its own is only counted (`world_queues`): with thousands
        queued, a snapshot reads none of them."""

    async def world_inflight(self) -> list[tuple[JobSketch, AttemptSketch]]:
        """The jobs in flight (STARTING, RUNNING) with their current attempt, by job id: what
        `inflight` reads, as narrow rows (with the job's workflow)."""

    async def world_queues(self, *, tenant: str | None = None) -> dict[str, int]:
        """Jobs waiting in the queue (QUEUED, RETRY_WAIT) per environment, of one tenant or
        of every one."""

    async def world_sketches(self, job_ids: Sequence[str]) -> list[JobSketch]:
        """The jobs not ended among these (the targets of waits `world_jobs` left out)."""

    async def world_records(
        self, job_ids: Sequence[str]
    ) -> tuple[dict[str, Checkpoint], list[JobEvent]]:
        """For these jobs: the latest checkpoint of each that has one, and the wait events of
        their timelines (`wait_started`, `wait_ended`), oldest first."""


class BaselineStore(Protocol):
    """The anomaly detector's rolling baselines (corral.world.anomaly), kept across restarts."""

    async def add_baseline_samples(
        self, samples: Sequence[tuple[str, str, str, float]], *, now: float, window: int
    ) -> None:
        """Append (role, kind, metric, value) samples, keeping each baseline's latest `window`."""

    async def baselines(self) -> list[Baseline]:
        """Every baseline, by role, kind and metric."""


class EpicStore(Protocol):
    """Epics run as waves (services/epics.py): the epic, its tasks' progress and a checkpoint
    per wave, each change compare-and-set so a resumed or second runner never redoes a step."""

    async def create_epic(self, epic: EpicRecord, tasks: Sequence[TaskRecord]) -> None:
        """Persist a new epic with its tasks."""

    async def get_epic(self, epic_id: str) -> EpicRecord:
        """The epic (NotFound when there is none)."""

    async def list_epics(
        self, *, tenant: str | None = None, running: bool = False, limit: int = 100
    ) -> list[EpicRecord]:
        """Epics, newest first: of one tenant (None: any), only the running ones if asked."""

    async def epic_tasks(self, epic_id: str) -> list[TaskRecord]:
        """The epic's tasks in the epic file's order."""

    async def epic_waves(self, epic_id: str) -> list[WaveRecord]:
        """The epic's wave checkpoints, the first wave first."""

    async def begin_wave(self, wave: WaveRecord, tasks: Sequence[TaskRecord], now: float) -> None:
        """A wave's checkpoint, in one transaction: the wave row, the epic's wave number and its
        tasks as the wave takes them (each expected OPEN). StaleState when the epic is no longer
        running, the wave exists or a task is not open."""

    async def save_task(self, task: TaskRecord, *, expect: TaskState) -> None:
        """Replace a task's progress if it is still in state `expect` (else StaleState)."""

    async def end_wave(
        self, epic_id: str, wave: int, *, results: Mapping[str, str], head: str, at: float
    ) -> None:
        """Record a wave's outcome and the epic branch's head after its ratchet."""

    async def replan_epic(
        self,
        epic_id: str,
        spec: Mapping[str, Any],
        *,
        replaced: TaskRecord,
        added: Sequence[TaskRecord],
        at: float,
    ) -> None:
        """A re-decomposition, in one transaction: the epic's new spec, the replaced task saved
        (expected ESCALATED), the new tasks added, every task's position its place in the new
        spec. StaleState when the epic is not running or the task no longer escalated."""

    async def end_epic(self, epic_id: str, state: EpicState, reason: str, at: float) -> None:
        """End a running epic (StaleState when it already ended)."""

    async def cancel_epic(self, epic_id: str, reason: str, at: float) -> EpicRecord:
        """Ask a running epic to stop at its next wave boundary (Conflict when it ended)."""

    async def claim_epics(self, holder: str, *, now: float, lease_s: float) -> bool:
        """Take or renew the lease of driving every epic (one engine at a time on a shared
        store) until `now + lease_s`; False while another holder's lease runs."""


class KnowledgeStore(Protocol):
    """The knowledge flywheel's learnings, their history, citations and A/B runs (migration
    0023; runtime/flywheel.py writes them, services/knowledge.py reads them)."""

    async def add_learning(self, learning: Learning, change: LearningChange) -> bool:
        """Store a new learning with its first history line; False, and nothing written, when
        one of the same content (digest) exists in its tenant and role."""

    async def get_learning(self, ref: str) -> Learning:
        """By id, or a unique prefix or suffix of at least 4 characters (NotFound when none,
        InvalidRequest when ambiguous)."""

    async def list_learnings(
        self,
        *,
        tenant: str | None = None,
        role: str | None = None,
        status: LearningStatus | None = None,
        limit: int = 100,
        kind: LearningKind | None = None,
        tier: Tier | None = None,
        ref: str | None = None,
    ) -> list[Learning]:
        """Newest first; with `ref`, only those it names (the whole id, or a prefix or suffix
        of 4+ characters)."""

    async def search_learnings(
        self,
        query: str,
        *,
        tenant: str | None = None,
        role: str | None = None,
        status: LearningStatus | None = LearningStatus.ACTIVE,
        limit: int = 50,
        kind: LearningKind | None = None,
        tier: Tier | None = None,
    ) -> list[Learning]:
        """Full-text search (SQLite FTS5, PostgreSQL tsvector) of titles and bodies: learnings
        that hold any of the query's words, best match first; an empty query lists the newest."""

    async def update_learnings(self, updates: Sequence[LearningUpdate]) -> None:
        """Write the learnings' numbers, maturity and status with their history lines, in one
        transaction; StaleState (nothing written) when one changed since its `before`."""

    async def learning_history(self, learning_id: str) -> list[LearningChange]:
        """The learning's history, oldest first."""

    async def record_injection(self, run: KnowledgeRun, citations: Sequence[Citation]) -> None:
        """At dispatch: the run's arm (one row per job, the latest attempt's) and the learnings
        its attempt was given."""

    async def citations(
        self, *, job_id: str | None = None, learning_id: str | None = None
    ) -> list[Citation]:
        """Citations of a job or of a learning, oldest first."""

    async def settle_run(
        self,
        job_id: str,
        *,
        succeeded: bool,
        tool_calls: int,
        reward: float | None,
        updates: Sequence[LearningUpdate],
    ) -> None:
        """A run's end, in one transaction: its arm's outcome, the reward on its citations not
        yet rewarded, and the learnings that reward moved (StaleState as update_learnings)."""

    async def mark_settle_due(self, job_ids: Sequence[str], at: float) -> None:
        """Mark runs whose learnings are to settle at `at` (a run marked already: marked
        again, at `at`)."""

    async def settle_due(self, before: float, limit: int) -> list[str]:
        """Runs marked before `before` and not settled yet, the oldest first."""

    async def settled(self, job_id: str) -> None:
        """Clear a run's mark: its learnings are settled."""

    async def knowledge_stats(
        self, *, tenant: str | None = None, role: str | None = None
    ) -> list[ArmStats]:
        """Per role and arm, the runs that ended: how many, how many succeeded, tool calls."""

    async def learning_counts(
        self, *, tenant: str | None = None, role: str | None = None
    ) -> dict[tuple[str, str], int]:
        """How many learnings per (role, status)."""


class Store(
    StoreLifecycle,
    JobStore,
    RunReads,
    TraceStore,
    GovernanceStore,
    AuditStore,
    EngineRegistry,
    OutboxReads,
    MetricsReads,
    TokenStore,
    RetentionStore,
    BaselineStore,
    WorldReads,
    EpicStore,
    KnowledgeStore,
    Protocol,
):
    """The whole store: every port above. What the store implementations (store/memory.py,
    store/sql.py over SQLite and PostgreSQL) provide and what builds them (runtime/assembly.py)
    returns; a consumer asks for the narrowest port it uses (tests/unit/test_store_ports.py keeps
    each method in exactly one port)."""


@dataclass(frozen=True, slots=True)
class AttemptRef:
    """Where a running attempt lives, opaque to everyone but its worker: a local process
    (``pid:1234``) or, for a worker that runs attempts elsewhere, a job there (``ray:<job id>``).
    Written as ``<kind>:<id>`` on the core's wire and in the attempt's `running` event. The
    store keeps a local process's pid (its `pid` column); a Ray job's id (``ray:corral-<job
    id>-<attempt>``) follows from the attempt itself, so it needs no column.
    What truly needs a pid (sweeping an attempt's processes, finding its ghosts, telling a
    stopped supervisor) stays inside the workers."""

    kind: str  # "pid" for a local process
    id: str

    @classmethod
    def local(cls, pid: int) -> AttemptRef:
        return cls("pid", str(pid))

    @classmethod
    def parse(cls, text: str) -> AttemptRef:
        kind, sep, ident = text.partition(":")
        if not sep or not kind or not ident:
            raise ValueError(f"attempt reference {text!r} is not <kind>:<id>")
        return cls(kind, ident)

    @property
    def pid(self) -> int | None:
        """The process id of a local attempt; None for a remote one."""
        return int(self.id) if self.kind == "pid" else None

    def describe(self) -> str:
        """For people (a job's `running` event): ``pid 1234``, or the reference as written."""
        return f"pid {self.id}" if self.kind == "pid" else str(self)

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"


class AttemptHandle(Protocol):
    """A running attempt, as a worker adapter supervises it."""

    @property
    def ref(self) -> AttemptRef:
        """Where the attempt runs (a local process, or a job on a remote cluster)."""

    async def wait(self) -> AttemptResult:
        """Block until the attempt's process tree is gone; the result it left."""

    def stop(self, *, now_kill: bool = False) -> None:
        """Ask the attempt to stop: graceful signal, then the whole tree after the grace."""

    def check(self, now: float) -> None:
        """Every tick of the core (`now`: wall clock): a supervisor that stopped answering past
        a stop request or the deadline (and its grace) is killed with the attempt's processes."""

    def survivors(self) -> list[int]:
        """After `wait`: processes of the attempt still alive although it was stopped (ghosts);
        they are stopped as they are found."""


class WorkerAdapter(Protocol):
    """Runs attempts of one worker kind (start, events, cancel, result)."""

    kind: str

    def ready(self) -> None:
        """The checks a start needs that may block (asking a CLI its version): the core runs
        them off its event loop before its first `start` of the kind, which then finds them
        done (cached). Raises what `start` would."""

    def start(self, permit: Permit, job: Job, attempt: Attempt) -> AttemptHandle:
        """Start the attempt's process; refuses (PermitError) without a live permit."""

    def adopt(self, job: Job, attempt: Attempt) -> AttemptHandle | AttemptResult:
        """After an engine restart: a handle if the attempt still runs, else how it ended."""
