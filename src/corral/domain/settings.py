"""Resolved configuration as frozen values: what the inner rooms may know of corral.yaml."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from corral.domain.models import Limits


@dataclass(frozen=True, slots=True, kw_only=True)
class RateSpec:
    """A token bucket: `per_s` tokens refill every second, at most `burst` held (starts full)."""

    per_s: float
    burst: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Which failures are retried and how long to wait (exponential backoff, full jitter)."""

    base_s: float = 5.0
    cap_s: float = 300.0
    # None: every non-zero exit code is retryable; otherwise only these.
    retry_exit_codes: frozenset[int] | None = None
    never_exit_codes: frozenset[int] = frozenset({126, 127})  # cannot execute / not found
    retry_signals: bool = True  # a process killed by a signal it did not get from us
    retry_timeouts: bool = False
    retry_lost: bool = True  # the process vanished while the control plane was down


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryBudget:
    """The core's own bounds on a job's attempts, whatever the scheduler asks.

    A job's own `limits.max_attempts` always binds; these are ceilings over what any job of the
    role may ask, and the budget across time and cost of all its attempts together (None: no
    bound of that kind)."""

    max_attempts: int | None = None  # ceiling over a job's limits.max_attempts
    max_timeout_s: float | None = None  # ceiling over a job's per-attempt timeout
    window_s: float | None = None  # no attempt starts this long after the job's first started
    cost_usd: float | None = None  # no attempt starts once the job's attempts cost this much

    def excess(self, limits: Limits) -> tuple[str, str] | None:
        """(the limit, why) when `limits` ask for more than these ceilings allow: the core would
        refuse every permit of such a job, so configurations and submissions refuse it first."""
        if self.max_attempts is not None and limits.max_attempts > self.max_attempts:
            return "max_attempts", (
                f"{limits.max_attempts} is more than retry_budget.max_attempts {self.max_attempts}"
            )
        if self.max_timeout_s is not None and limits.timeout_s > self.max_timeout_s:
            return "timeout_s", (
                f"{limits.timeout_s:g} is more than "
                f"retry_budget.max_timeout_s {self.max_timeout_s:g}"
            )
        return None


class WorkspacePolicy(StrEnum):
    """What a job does when another active job already holds its workspace."""

    REJECT = "reject"  # the submission is refused (Conflict naming the holder)
    COALESCE = "coalesce"  # the submission returns the holder, as an idempotency key would
    SERIALIZE = "serialize"  # queued; runs once the workspace is free, in queue order


@dataclass(frozen=True, slots=True, kw_only=True)
class AnomalySpec:
    """A live attempt past `factor` × the median of its role and kind's baseline (tool calls,
    tokens, duration, cost) is flagged with an incident `anomaly`, once; `stop`: it is also
    stopped (limit_hit `anomaly`)."""

    factor: float = 10.0
    stop: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class KnowledgeSpec:
    """The knowledge flywheel (runtime/flywheel.py): whether finished runs are extracted into
    learnings, by which extractor (`rules`, or `package.module:function` taking a RunTrace and
    returning candidates), and the injection budget a run's learnings are held to. Which roles
    get learnings injected is each role's `knowledge`."""

    extract: bool = True
    extractor: str = "rules"
    max_tokens: int = 1500
    max_learnings: int = 10
    similarity_weight: float = 0.0  # w_sim of the composite (0: the seed's parity)
    candidates: int = 50  # learnings the full-text search reads per dispatch, before ranking


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleSpec:
    name: str
    worker: str = "command"
    concurrency: int = 4
    limits: Limits = field(default_factory=Limits)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    tools: tuple[str, ...] = ()  # tool scope: `Read`, `Bash(kubectl *)`, `mcp__server__tool`
    system_prompt: str = ""
    model: str | None = None
    max_turns: int | None = None
    # MCP servers the agent gets, by name, in Claude Code's `mcpServers` form (read from the
    # role's `mcp_config` file when the configuration loads)
    mcp_servers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    cost_estimate_usd: float = 0.0  # reserved per attempt against budget ceilings
    requires_approval: bool = False  # every job waits (AWAITING_APPROVAL) for a human
    description: str = ""
    # Worker kinds to use, in order, while this role's worker kind has an open breaker; the core
    # grants the permit for the first one whose breaker is closed.
    fallback_workers: tuple[str, ...] = ()
    # Models to send a call to, in order, while the role's model has an open breaker in the
    # model gateway (runtime/modelbreakers.py)
    fallback_models: tuple[str, ...] = ()
    rate: RateSpec | None = None  # permits per second for this role (None: unlimited)
    workspace_policy: WorkspacePolicy = WorkspacePolicy.SERIALIZE
    # Jobs submitted from inside a job carry their parent and depth; deeper chains are refused
    # (against recursive planning loops).
    max_recursion_depth: int = 5
    retry_budget: RetryBudget = field(default_factory=RetryBudget)
    # Jobs of this role submitted from inside another job are not stopped when their parent is
    # cancelled (they outlive it); by default cancellation reaches every descendant.
    detached: bool = False
    anomaly: AnomalySpec = field(default_factory=AnomalySpec)
    # A job of this role waiting in a deadlock (the waiter of a cycle of waits): "escalate"
    # raises the incident only; "cancel" also cancels it, which breaks the cycle.
    on_deadlock: str = "escalate"
    # The knowledge flywheel for this role's agent jobs: `off` (nothing injected), `on` (the top
    # learnings injected into every run) or `ab` (half the runs, by job id, as the control arm)
    knowledge: str = "off"
    max_output_bytes: int | None = None  # None: `output.max_bytes`
    # variables every job of this role gets as secrets from the engine's environment
    secret_env: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputSpec:
    """What one attempt may write (stdout and stderr together) before it is stopped with
    `limit_hit = output`; its logs then keep the first part and the last `tail_bytes` of each
    stream (workers/pump.py)."""

    max_bytes: int = 128 << 20
    tail_bytes: int = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class ThrottleSpec:
    """Predictive throttling of one environment's submissions (corral.world.throttle)."""

    threshold: float = 0.8  # throttle when the forecast depth reaches threshold × the cap
    release: float = 0.5  # … and release once it is below release × the cap (hysteresis)
    window_s: float = 60.0  # the window the queue's trend and drain rate are read over
    horizon_s: float = 30.0  # how far ahead the forecast looks


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvSpec:
    name: str
    kind: str = "local"  # "local" | "ray"
    address: str | None = None
    max_inflight: int = 4  # concurrent attempts per environment
    max_queued: int | None = None  # jobs waiting in this environment (None: only the global bound)
    throttle: ThrottleSpec | None = None  # predictive throttling (None: off)
    # a ray environment: what each attempt's Ray job asks (num_cpus, num_gpus, memory in bytes)
    resources: Mapping[str, float] = field(default_factory=dict)
    runtime_env: Mapping[str, Any] = field(default_factory=dict)  # ray: never secrets
    # variables every job in this environment gets as secrets from the engine's environment
    secret_env: tuple[str, ...] = ()
    # ray: where the job server's token comes from (a file, or a variable of the engine's
    # environment); the token itself is read when it is needed and never kept here
    auth_token_file: str | None = None
    auth_token_env: str | None = None
    health_interval_s: float = 5.0  # ray: how often the cluster's health is asked


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerSpec:
    # Aging window: a job of priority p is queued as if it arrived p × aging_s later than it did,
    # so priority orders the queue yet no job waits behind newer work for more than 4 × aging_s.
    aging_s: float = 60.0
    poll_interval_s: float = 1.0
    # Backpressure: at most this many jobs wait (QUEUED or RETRY_WAIT) over all environments;
    # a refusal says to retry after an estimate, or after this when nothing started lately.
    max_queued: int = 10_000
    backpressure_retry_after_s: float = 5.0
    # The world model's detectors: the engine's deadlock and anomaly watch, and the anomaly
    # baselines each ended attempt adds to (off: neither runs; bench/detectors.py compares).
    world_watch: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewaySpec:
    """A worker's model calls through Corral's model gateway (runtime/modelgate.py): the CLI is
    pointed at the gateway with a per-attempt token; the gateway forwards to `upstream` with the
    provider key it alone holds."""

    upstream: str  # the provider's base URL: scheme://host[:port][/prefix]
    key_env: str | None = None  # the provider key's variable: the worker's env, else the engine's
    provider: str | None = None  # OpenCode: the provider id to point (None: the model's prefix)
    breakers: BreakerSpec | None = None  # its provider and model breakers (None: `breakers`)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSpec:
    """One worker kind: its budgets, whichever role uses it, and how its adapter runs the CLI."""

    name: str
    adapter: str | None = None  # "command" | "claude-code" | "codex" | "opencode" (None: own name)
    max_inflight: int | None = None  # None: no cap of its own
    rate: RateSpec | None = None
    binary: str | None = None  # the agent CLI (None: the adapter's usual name on PATH)
    version: str | None = None  # pinned CLI version: an attempt refuses to start on another
    model: str | None = None  # default model (a role's model wins)
    env: Mapping[str, str] = field(default_factory=dict)  # set in the CLI's environment
    pass_env: tuple[str, ...] = ()  # engine variables handed on (API keys): redacted everywhere
    args: tuple[str, ...] = ()  # extra CLI arguments
    config: Mapping[str, Any] = field(default_factory=dict)  # CLI settings (Codex -c, OpenCode)
    hook_timeout_s: float = 10.0  # a governance answer slower than this denies the tool call
    summary_grace_s: float = 5.0  # after a runtime limit: time to emit a summary before the stop
    gateway: GatewaySpec | None = None  # model calls through Corral's gateway (None: direct)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderSpec:
    """Budgets of one provider (`job.options["provider"]`, else the worker kind)."""

    name: str
    rate: RateSpec | None = None


class CostPeriod(StrEnum):
    """The period a tenant's cost allowance covers (calendar periods are UTC)."""

    DAILY = "daily"
    MONTHLY = "monthly"
    ROLLING_30D = "rolling_30d"


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantSpec:
    name: str
    max_inflight: int | None = None  # the core's concurrency budget: jobs wait for a slot
    max_parallel_runs: int | None = None  # pre-run policy: runs past it are denied
    cost_allowance_usd: float | None = None  # None: no allowance enforced
    period: CostPeriod = CostPeriod.MONTHLY


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerSpec:
    """When a circuit breaker opens and how long it stays open."""

    window_s: float = 60.0
    min_calls: int = 5  # results in the window before the failure rate counts
    failure_rate: float = 0.5
    consecutive_failures: int = 5
    open_s: float = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Thresholds:
    """Per watchdog gauge: the value at or above which each defense stage starts (None: never)."""

    shed: float | None = None
    throttle: float | None = None
    open: float | None = None
    escalate: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchdogSpec:
    """Gauges' thresholds and the staged defense."""

    gauges: Mapping[str, Thresholds] = field(default_factory=dict)
    window_s: float = 60.0  # results window of worker_timeout_rate
    min_samples: int = 5  # results in the window before worker_timeout_rate counts
    sample_s: float = 5.0  # how long a point sample (lag, cancel latency, lock wait) counts
    stall_s: float = 600.0
    recover_s: float = 10.0
    shed_min_priority: int = 3
    throttle_factor: float = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class EscalationSpec:
    """FATAL conditions and what a global escalation does."""

    crash_loop_per_min: int = 5
    superseded_max: int = 5
    superseded_window_s: float = 60.0
    ghost_max: int = 3  # attempts with ghosts of one worker kind that isolate it …
    ghost_window_s: float = 600.0  # … within this window
    safe_stop: str = "finish"  # "finish": running attempts finish; "cancel": they are stopped
    safe_stop_queued: str = "wait"  # "wait": queued jobs wait; "fail": their permits are final


@dataclass(frozen=True, slots=True, kw_only=True)
class OversightSpec:
    """Pause dispatch for a role when its runs with an incident of at least `min_severity` reach
    `incident_threshold` within `window_s` (None: never). A run counts once, however many
    incidents it had."""

    incident_threshold: int | None = None
    window_s: float = 300.0
    min_severity: str = "high"


@dataclass(frozen=True, slots=True, kw_only=True)
class SinkSpec:
    """One broker the committed records are published to (trace/sinks.py,
    docs/how-to/events.md). `name` is the cursor's key: renaming a sink starts it afresh."""

    name: str
    kind: str  # "nats" (JetStream) | "redis" (Redis Streams)
    url: str
    stream: str = "CORRAL"  # nats: the JetStream stream that holds the subjects
    maxlen: int | None = None  # redis: each stream key is trimmed to about this many entries
    timeout_s: float = 5.0  # one publish or connect slower than this counts as an outage


@dataclass(frozen=True, slots=True, kw_only=True)
class EventsSpec:
    """`events`: where committed records are published, and how far a sink may fall behind
    before its cursor skips ahead (the skipped rows are counted, never silently lost)."""

    sinks: tuple[SinkSpec, ...] = ()
    max_backlog: int = 100_000
    batch: int = 500  # rows read and published per round
    poll_s: float = 0.5  # how often the drainer looks for new rows
    max_backoff_s: float = 30.0  # the longest pause between rounds while a sink fails


@dataclass(frozen=True, slots=True, kw_only=True)
class KeepSpec:
    """How long a role's terminal jobs are kept: `keep_days` after their last change, and at most
    the newest `keep_jobs` of them (docs/how-to/retention.md)."""

    keep_days: float = 30.0
    keep_jobs: int = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionSpec:
    """`retention`: when terminal jobs leave the store (their rows archived to JSON Lines first,
    their attempt directories removed). `roles` override `default` per role; `interval_s` is how
    often a running engine collects (0: never, only `corral gc`); `archive_dir` None: the data
    directory's `archive/`."""

    default: KeepSpec = field(default_factory=KeepSpec)
    roles: Mapping[str, KeepSpec] = field(default_factory=dict)
    interval_s: float = 3600.0
    batch: int = 200
    archive_dir: str | None = None

    def keep(self, role: str) -> KeepSpec:
        return self.roles.get(role, self.default)


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    roles: Mapping[str, RoleSpec]
    environments: Mapping[str, EnvSpec]
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    default_role: str = "default"
    default_env: str = "local"
    workers: Mapping[str, WorkerSpec] = field(default_factory=dict)
    providers: Mapping[str, ProviderSpec] = field(default_factory=dict)
    tenants: Mapping[str, TenantSpec] = field(default_factory=dict)
    breakers: BreakerSpec = field(default_factory=BreakerSpec)
    watchdog: WatchdogSpec = field(default_factory=WatchdogSpec)
    escalation: EscalationSpec = field(default_factory=EscalationSpec)
    guardrails_file: str | None = None  # rules merged over the shipped defaults
    oversight: OversightSpec = field(default_factory=lambda: OversightSpec())
    approval_ttl_s: float = 3600.0
    output: OutputSpec = field(default_factory=OutputSpec)
    events: EventsSpec = field(default_factory=EventsSpec)
    retention: RetentionSpec = field(default_factory=RetentionSpec)
    knowledge: KnowledgeSpec = field(default_factory=KnowledgeSpec)

    def max_output_bytes(self, role: str) -> int:
        """The output cap of one attempt of a job of `role`."""
        spec = self.roles.get(role)
        if spec is not None and spec.max_output_bytes is not None:
            return spec.max_output_bytes
        return self.output.max_bytes
