"""Frozen values that flow between the rooms: jobs, attempts, permits, results and events."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, NamedTuple

from corral.domain.states import AttemptState, DedupMode, Fault, JobState, Outcome

PRIORITY_CRITICAL = 0
PRIORITY_BACKLOG = 4
DEFAULT_PRIORITY = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Per-job bounds. `max_attempts` counts every try.

    `timeout_s` is the job's maximum duration; the tool-call and token budgets are the runtime
    policies every governed agent attempt is held to (a plain command has no tool calls).
    """

    max_attempts: int = 4
    timeout_s: float = 3600.0
    grace_s: float = 10.0
    max_tool_calls: int = 50
    token_budget_in: int = 100_000
    token_budget_out: int = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class JobOptions:
    """What a job carries for the agent machinery beyond its spec, one field per option.

    Stored and sent as a JSON object holding only the options that are set (`to_json`), the
    shape the `options` column has always had. A key this version does not know, or a known key
    whose value has another type, is kept as read in `extra` and written back unchanged: a row
    an older or newer engine wrote reads back without an error and loses nothing."""

    resume_from: str | None = None  # --resume-from: the job whose agent session this continues
    session_root: str | None = None  # the first job of that session lineage (its agent home)
    resume_session: str | None = None  # the session id the dispatcher found, after the permit
    secret_env: tuple[str, ...] = ()  # --secret-env: variables whose values are secrets
    sealed: str | None = None  # the real values of the redacted secrets (workers/sealing.py)
    detached: bool = False  # a child of a detached role: its parent's cancel does not reach it
    workflow: str | None = None  # the pre-run workflow (else the idempotency key)
    provider: str | None = None  # the provider its budget and breaker are kept for
    model: str | None = None  # the model its breaker is kept for
    submitted_by: str | None = None  # who asked for it: a local user, or `token:<id>` over HTTP
    # The epic try it works for ("<epic id>/<task id>/<try>", services/epics.py): the guardrails
    # of `_epic_worker` apply to it too (lead-only commits)
    epic: str | None = None
    # the learnings the dispatcher found for this attempt, after the permit: appended to the
    # agent's system prompt (runtime/flywheel.py); never stored with the job
    knowledge: str | None = None
    # The run an extractor job extracts learnings from ("<job id>/<attempt>/<commit>"), set by
    # the flywheel only (runtime/flywheel.py): the learnings' provenance, never the agent's word
    extract_of: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    _TYPES: ClassVar[Mapping[str, type]] = {
        "resume_from": str,
        "session_root": str,
        "resume_session": str,
        "secret_env": list,
        "sealed": str,
        "detached": bool,
        "workflow": str,
        "provider": str,
        "model": str,
        "submitted_by": str,
        "epic": str,
        "knowledge": str,
        "extract_of": str,
    }

    def to_json(self) -> dict[str, Any]:
        """The options that are set, then `extra`: what the store and the wire hold."""
        data: dict[str, Any] = {}
        for name in self._TYPES:
            value = getattr(self, name)
            if value is None or value == () or value is False:
                continue
            data[name] = list(value) if isinstance(value, tuple) else value
        return {**data, **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobOptions:
        """The options of a stored or sent object; nothing in it is refused (see the class)."""
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for name, value in data.items():
            kind = cls._TYPES.get(name)
            if kind is list and isinstance(value, list) and all(isinstance(v, str) for v in value):
                known[name] = tuple(value)
            elif kind is not None and kind is not list and type(value) is kind:
                known[name] = value
            else:
                extra[name] = value
        return cls(**known, extra=extra)

    def with_(self, **changes: Any) -> JobOptions:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """What a caller asks for. Validated against the configuration before it becomes a Job."""

    command: tuple[str, ...] = ()
    prompt: str | None = None
    role: str = "default"
    worker: str | None = None  # None: the role's worker kind
    env_name: str = "local"
    priority: int = DEFAULT_PRIORITY
    tenant: str = "default"
    key: str | None = None
    dedup: DedupMode = DedupMode.COALESCE
    limits: Limits | None = None  # None: the role's defaults
    after: tuple[str, ...] = ()
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    workspace: str | None = None
    parent_id: str | None = None
    depth: int = 0
    options: JobOptions = field(default_factory=JobOptions)


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A request to run an agent, as the store holds it."""

    id: str
    state: JobState
    role: str
    worker: str
    env_name: str
    priority: int
    tenant: str
    command: tuple[str, ...]
    prompt: str | None
    cwd: str | None
    env: Mapping[str, str]
    options: JobOptions
    limits: Limits
    key: str | None
    dedup: DedupMode
    workspace: str | None
    parent_id: str | None
    depth: int
    created_at: float
    updated_at: float
    sort_at: float  # queue order: enqueue time + priority × aging window (scheduler.queue)
    retry_at: float | None = None
    attempts: int = 0
    deps_pending: int = 0
    after: tuple[str, ...] = ()
    last_error: str | None = None
    exit_code: int | None = None
    limit_hit: str | None = None
    cancel_requested: str | None = None  # reason, set when a cancel is persisted
    stop_kind: str | None = None  # "cancel" | "kill": what the stop request means
    requeued_from: str | None = None
    dlq_resolution: str | None = None  # "requeued:<id>" | "purged" once handled

    def with_(self, **changes: Any) -> Job:
        return replace(self, **changes)

    @property
    def workflow(self) -> str | None:
        """Its pre-run workflow (the world model keeps baselines per workflow)."""
        return self.options.workflow


@dataclass(frozen=True, slots=True, kw_only=True)
class Permit:
    """The core's authorisation for one attempt. Only the core's gate seals one."""

    id: str
    job_id: str
    attempt_index: int
    issued_at: float
    deadline_at: float
    grace_s: float
    granted: Mapping[str, str]  # the slots it holds: role, environment, worker kind, tenant
    breaker: str  # breaker state of the worker kind at issue
    seal: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One execution of a job under one permit."""

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
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    outcome: Outcome | None = None
    error: str | None = None
    limit_hit: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineInfo:
    """An engine as the store knows it: where it runs, when it last heart-beat, and whether a
    peer declared it dead and took its attempts over (`fenced_at`)."""

    id: str
    host: str
    heartbeat_at: float
    fenced_at: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptResult:
    """What the worker layer reports when an attempt ends."""

    outcome: Outcome
    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None
    limit_hit: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    cost_usd: float | None = None  # what the attempt cost, when the worker knows
    fault: Fault | None = None  # whose failure it was (None: it succeeded, or was stopped)

    @property
    def succeeded(self) -> bool:
        """Exited 0 and nothing (an agent's own verdict, say) says it failed."""
        return self.outcome is Outcome.EXITED and self.exit_code == 0 and self.error is None

    def describe(self) -> str:
        """One line for people: what happened to the process."""
        if self.error:
            return self.error
        if self.outcome is Outcome.EXITED:
            if self.signal is not None:
                return f"killed by signal {self.signal}"
            return f"exited with code {self.exit_code}"
        return self.outcome.value.replace("_", " ")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobEvent:
    """One line of a job's timeline."""

    job_id: str
    at: float
    kind: str
    message: str = ""
    from_state: str | None = None
    to_state: str | None = None
    attempt: int | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitResult:
    """The job a submission resolved to, and whether it was created or coalesced."""

    job: Job
    created: bool
    superseded: str | None = None  # latest-wins: the job this one replaced
    coalesced_on: str | None = None  # "key" | "workspace": why an existing job was returned


@dataclass(frozen=True, slots=True, kw_only=True)
class Claimed:
    """A job the dispatcher took from the queue, with its new attempt and the permit it holds."""

    job: Job
    attempt: Attempt
    permit: Permit


BASELINE_MIN_SAMPLES = 5  # a baseline with fewer samples says nothing


@dataclass(frozen=True, slots=True, kw_only=True)
class Baseline:
    """A rolling baseline: the latest finished attempts' values of one metric for one role and
    job kind (corral.world.anomaly), oldest first."""

    role: str
    kind: str
    metric: str
    samples: tuple[float, ...]
    updated_at: float

    @property
    def ready(self) -> bool:
        return len(self.samples) >= BASELINE_MIN_SAMPLES

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


class JobSketch(NamedTuple):
    """The few fields of a job the world model reads (corral.world.model), so a snapshot of
    thousands of live jobs reads narrow rows instead of whole jobs. A named tuple: as immutable
    as a frozen dataclass, and made in a quarter of the time (bench/world.py makes thousands
    per snapshot)."""

    id: str
    state: JobState
    role: str
    worker: str
    env_name: str
    tenant: str
    parent_id: str | None = None
    after: tuple[str, ...] = ()
    deps_pending: int = 0
    exit_code: int | None = None
    workflow: str | None = None  # read for a job in flight only (its agent's kind)


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptSketch:
    """The few fields of an attempt in flight the world model reads."""

    index: int
    started_at: float | None = None
