"""corral.yaml's schema: parsing and validation at the edge (pydantic), resolved into frozen
domain values and the sections of a Config (config.py). Imported only when a file is read anew:
a command whose configuration is unchanged loads it from the cache (config_cache.py) without
building any of these models."""

from __future__ import annotations

import json
import re
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from corral import config_check
from corral.config_paths import SQLITE_BUSY_TIMEOUT_MS
from corral.config_sections import (
    AGENT_ADAPTERS,
    ApiRate,
    ApiSection,
    AuditSection,
    ConfigProblems,
    CoreSection,
    EngineSection,
    FileSettings,
    group_id,
)
from corral.domain import bounds
from corral.domain.bounds import yaml_too_deep
from corral.domain.errors import ConfigError
from corral.domain.models import Limits
from corral.domain.settings import (
    AnomalySpec,
    BreakerSpec,
    CostPeriod,
    EnvSpec,
    EscalationSpec,
    EventsSpec,
    GatewaySpec,
    KeepSpec,
    KnowledgeSpec,
    OutputSpec,
    OversightSpec,
    ProviderSpec,
    RateSpec,
    RetentionSpec,
    RetryBudget,
    RetryPolicy,
    RoleSpec,
    SchedulerSpec,
    Settings,
    SinkSpec,
    TenantSpec,
    Thresholds,
    ThrottleSpec,
    WatchdogSpec,
    WorkerSpec,
    WorkspacePolicy,
)

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~10x faster


class _Problem(ValueError):
    """One problem of one part of the configuration, found while resolving it."""


class _Strict(BaseModel):
    # every number finite: `timeout_s: .inf` is a configuration error, not a stuck job
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)


class LimitsModel(_Strict):
    # the bounds of domain/bounds.py, which every submission is held to as well
    max_attempts: int = Field(4, ge=1, le=bounds.MAX_ATTEMPTS)
    timeout_s: float = Field(3600.0, gt=0, le=bounds.MAX_TIMEOUT_S)  # the job's maximum duration
    grace_s: float = Field(10.0, ge=0, le=bounds.MAX_GRACE_S)
    max_tool_calls: int = Field(50, ge=0, le=bounds.MAX_TOOL_CALLS)
    token_budget_in: int = Field(100_000, ge=0, le=bounds.MAX_TOKENS)
    token_budget_out: int = Field(10_000, ge=0, le=bounds.MAX_TOKENS)


class RetryModel(_Strict):
    base_s: float = Field(5.0, ge=0)
    cap_s: float = Field(300.0, ge=0)
    exit_codes: list[int] | Literal["nonzero"] = "nonzero"
    never_exit_codes: list[int] = [126, 127]
    signals: bool = True
    timeouts: bool = False
    lost: bool = True


class RateModel(_Strict):
    per_s: float = Field(gt=0)  # tokens refilled per second
    burst: int = Field(1, ge=1)  # tokens held at most (a full bucket at start)


class RetryBudgetModel(_Strict):
    """The core's own bounds on a role's jobs' attempts (null: none of that kind)."""

    max_attempts: int | None = Field(None, ge=1, le=100)
    max_timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    window_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    cost_usd: float | None = Field(None, ge=0, allow_inf_nan=False)


class AnomalyModel(_Strict):
    """When a live attempt of the role counts as anomalous, and whether it is then stopped."""

    factor: float = Field(10.0, gt=1, le=1_000_000, allow_inf_nan=False)
    stop: bool = False


class RoleModel(_Strict):
    description: str = ""
    worker: str = "command"
    concurrency: int = Field(4, ge=1, le=10_000)
    limits: LimitsModel = LimitsModel()
    retry: RetryModel = RetryModel()
    tools: list[str] = []
    system_prompt: str = ""
    model: str | None = None
    max_turns: int | None = Field(None, ge=1)
    mcp_config: str | None = None
    cost_estimate_usd: float = Field(0.0, ge=0)
    requires_approval: bool = False
    fallback_workers: list[str] = []  # kinds to use while `worker`'s breaker is open
    fallback_models: list[str] = []  # models the gateway uses while the model's breaker is open
    rate: RateModel | None = None
    workspace_policy: Literal["reject", "coalesce", "serialize"] = "serialize"
    max_recursion_depth: int = Field(5, ge=0, le=100)
    retry_budget: RetryBudgetModel = RetryBudgetModel()
    detached: bool = False  # jobs of this role outlive the job that submitted them
    # variables every job of this role gets as secrets from the engine's environment, as with
    # `--secret-env` (HF_TOKEN, WANDB_API_KEY for training jobs: docs/how-to/training.md)
    secret_env: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = []
    anomaly: AnomalyModel = AnomalyModel()
    on_deadlock: Literal["escalate", "cancel"] = "escalate"
    # learnings injected into this role's agent runs: off, on, or ab (half the runs, by job id)
    knowledge: Literal["off", "on", "ab"] = "off"

    @field_validator("knowledge", mode="before")
    @classmethod
    def _knowledge_switch(cls, value: Any) -> Any:
        """YAML reads a bare `on` and `off` as booleans: they mean the switch's words."""
        if isinstance(value, bool):
            return "on" if value else "off"
        return value

    max_output_bytes: int | None = Field(
        None, ge=bounds.MIN_OUTPUT_BYTES, le=bounds.MAX_OUTPUT_BYTES
    )  # None: output.max_bytes


class KnowledgeModel(_Strict):
    """The knowledge flywheel (docs/how-to/knowledge.md)."""

    extract: bool = True  # finished runs write learnings
    # `rules` (the built-in extractor), `package.module:function`, or `agent:ROLE` (a job of
    # that role reads the finished run and writes the candidates: runtime/flywheel.py)
    extractor: str = Field(
        "rules", pattern=r"^(rules|agent:[\w][\w.-]*|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$"
    )
    max_tokens: int = Field(1500, ge=1, le=100_000)
    max_learnings: int = Field(10, ge=1, le=100)
    similarity_weight: float = Field(0.0, ge=0, le=10)
    candidates: int = Field(50, ge=1, le=1000)


class OutputModel(_Strict):
    """Per attempt, stdout and stderr together (docs/reference/config.md)."""

    max_bytes: int = Field(128 << 20, ge=bounds.MIN_OUTPUT_BYTES, le=bounds.MAX_OUTPUT_BYTES)
    tail_bytes: int = Field(1 << 20, ge=0)


class SecretsModel(_Strict):
    # the key that seals a submission's secrets (None: <data dir>/secrets.key); engines that
    # share a PostgreSQL store must share it
    key_file: str | None = None


class AuditModel(_Strict):
    """The audit chain's key and its signed checkpoints (docs/explanation/audit.md)."""

    # the key the audit chains are hashed with (None: <data dir>/audit.key); engines that share
    # a PostgreSQL store must share it
    key_file: str | None = None
    # a checkpoint of every chain that moved, after this many records on one chain or this many
    # seconds, whichever comes first (and when the engine stops cleanly)
    checkpoint_every_records: int = Field(1000, ge=1, le=10_000_000)
    checkpoint_every_s: float = Field(60.0, gt=0, le=86_400)


class ThrottleModel(_Strict):
    """`environments.NAME.throttle`: predictive throttling (corral.world.throttle)."""

    threshold: float = Field(0.8, gt=0, le=1)  # throttle when the forecast reaches this × cap
    release: float = Field(0.5, ge=0, lt=1)  # … until it is below this × cap (hysteresis)
    window_s: float = Field(60.0, gt=0, le=86_400)  # how far back the trend looks
    horizon_s: float = Field(30.0, gt=0, le=86_400)  # how far ahead the forecast looks

    @model_validator(mode="after")
    def _release_below_threshold(self) -> ThrottleModel:
        if self.release >= self.threshold:
            raise ValueError(
                f"release ({self.release:g}) must be below threshold ({self.threshold:g}):"
                " the gap between them is the hysteresis"
            )
        return self


class RayAuthModel(_Strict):
    """The token a Ray cluster's job server asks for (Ray's token auth, or a proxy in front of
    it): read from a file, or from a variable of the engine's environment. Never in the
    configuration file itself."""

    token_file: str | None = None
    token_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    @model_validator(mode="after")
    def _one(self) -> RayAuthModel:
        if (self.token_file is None) == (self.token_env is None):
            raise ValueError("give exactly one of token_file and token_env")
        return self


class EnvModel(_Strict):
    kind: Literal["local", "ray"] = "local"
    address: str | None = None
    auth: RayAuthModel | None = None  # ray: the job server's token
    # ray: how often the cluster is asked whether it answers (an unreachable one opens the
    # environment's breaker; jobs wait in the queue until it answers again)
    health_interval_s: float = Field(5.0, gt=0, le=3600)
    max_inflight: int = Field(4, ge=1, le=10_000)
    max_queued: int | None = Field(None, ge=1)  # None: only scheduler.max_queued applies
    throttle: ThrottleModel | None = None  # None: no predictive throttling
    # what each attempt's Ray job asks of the cluster (its entrypoint's resources)
    num_cpus: float | None = Field(None, ge=0, le=10_000)
    num_gpus: float | None = Field(None, ge=0, le=10_000)
    memory: int | None = Field(None, ge=0)  # bytes
    # ray: the runtime env every attempt's Ray job gets (working_dir, pip, uv, env_vars …).
    # Ray hands it back in clear from its job API: never a secret here.
    runtime_env: dict[str, Any] | None = None
    # variables every job in this environment gets as secrets from the engine's environment
    secret_env: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = []


class SchedulerModel(_Strict):
    aging_s: float = Field(60.0, gt=0)
    poll_interval_s: float = Field(1.0, gt=0, le=60)
    max_queued: int = Field(10_000, ge=1)
    backpressure_retry_after_s: float = Field(5.0, gt=0, le=3600)
    world_watch: bool = True  # the deadlock and anomaly detectors (runtime/worldwatch.py)


class StoreModel(_Strict):
    url: str | None = None  # None: SQLite file in the data dir; or postgresql://…
    sqlite_synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = "NORMAL"
    sqlite_busy_timeout_ms: int = Field(SQLITE_BUSY_TIMEOUT_MS, ge=0)

    @field_validator("sqlite_synchronous", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v


class CoreModel(_Strict):
    mode: Literal["process", "inline"] = "process"  # inline: same process (tests, benchmarks)
    heartbeat_s: float = Field(1.0, gt=0)
    heartbeat_timeout_s: float = Field(5.0, gt=0)
    max_restarts: int = Field(5, ge=0)
    restart_window_s: float = Field(60.0, gt=0)


class GatewayModel(_Strict):
    upstream: str
    key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    provider: str | None = None
    breakers: BreakersModel | None = None

    @field_validator("upstream")
    @classmethod
    def _url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream must be an http(s) URL, got {v!r}")
        return v.rstrip("/")


class WorkerModel(_Strict):
    # a kind of your own that runs commands, or an agent CLI configured your way
    adapter: Literal["command", "claude-code", "codex", "opencode"] | None = None
    max_inflight: int | None = Field(None, ge=1, le=10_000)
    rate: RateModel | None = None
    binary: str | None = None
    version: str | None = None
    model: str | None = None
    env: dict[str, str] = {}
    pass_env: list[str] = []
    args: list[str] = []
    config: dict[str, Any] = {}
    hook_timeout_s: float = Field(10.0, gt=0, le=600)
    summary_grace_s: float = Field(5.0, ge=0, le=600)
    gateway: GatewayModel | None = None


class ProviderModel(_Strict):
    rate: RateModel | None = None


class TenantModel(_Strict):
    max_inflight: int | None = Field(None, ge=1, le=10_000)
    max_parallel_runs: int | None = Field(None, ge=0, le=10_000)
    cost_allowance_usd: float | None = Field(None, ge=0)
    period: Literal["daily", "monthly", "rolling_30d"] = "monthly"


class BreakersModel(_Strict):
    window_s: float = Field(60.0, gt=0)
    min_calls: int = Field(5, ge=1)
    failure_rate: float = Field(0.5, gt=0, le=1)
    consecutive_failures: int = Field(5, ge=1)
    open_s: float = Field(30.0, gt=0)


class ThresholdsModel(_Strict):
    shed: float | None = None
    throttle: float | None = None
    open: float | None = None
    escalate: float | None = None


class WatchdogModel(_Strict):
    window_s: float = Field(60.0, gt=0)
    min_samples: int = Field(5, ge=1)
    sample_s: float = Field(5.0, gt=0)
    stall_s: float = Field(600.0, gt=0)
    recover_s: float = Field(10.0, ge=0)
    shed_min_priority: int = Field(3, ge=0, le=4)
    throttle_factor: float = Field(0.5, gt=0, le=1)
    worker_inflight_count: ThresholdsModel | None = None
    worker_queue_lag_ms: ThresholdsModel | None = None
    worker_timeout_rate: ThresholdsModel | None = None
    worker_cancel_latency_ms: ThresholdsModel | None = None
    workspace_lock_wait_ms: ThresholdsModel | None = None
    stalled_attempts: ThresholdsModel | None = None


class EscalationModel(_Strict):
    crash_loop_per_min: int = Field(5, ge=1)
    superseded_max: int = Field(5, ge=1)
    superseded_window_s: float = Field(60.0, gt=0)
    ghost_max: int = Field(3, ge=1)
    ghost_window_s: float = Field(600.0, gt=0)
    safe_stop: Literal["finish", "cancel"] = "finish"
    safe_stop_queued: Literal["wait", "fail"] = "wait"


class OversightModel(_Strict):
    """Human oversight: pause dispatch for a role whose incident rate is too high."""

    incident_threshold: int | None = Field(None, ge=1)  # None: no automatic pause
    window_s: float = Field(300.0, gt=0)
    min_severity: Literal["low", "medium", "high", "critical"] = "high"


class ApiRateModel(_Strict):
    """Each API token's token bucket (api/ratelimit.py): requests refilled per second, and how
    many it may make at once from a full bucket."""

    per_s: float = Field(20.0, gt=0, le=1_000_000)
    burst: int = Field(40, ge=1, le=1_000_000)


class ApiModel(_Strict):
    """The HTTP API (docs/reference/http-api.md)."""

    rate_limit: ApiRateModel = ApiRateModel()
    # The directories under which `POST /api/v1/epics` may target a git repository (absolute;
    # empty: epics start from the CLI only). An epic's checks run on the engine's host.
    epic_repos: list[str] = []

    @field_validator("epic_repos")
    @classmethod
    def _absolute(cls, v: list[str]) -> list[str]:
        bad = [p for p in v if not p.startswith("/")]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an absolute path")
        return v


class EngineModel(_Strict):
    # a group whose members may use the engine's sockets too (None: the engine's user alone)
    socket_group: str | None = None
    # How often the engine writes its heart-beat, and how long without one before a peer on the
    # same database declares it dead and takes its attempts over (it is fenced when it wakes).
    # Every engine on one database should use the same values.
    heartbeat_s: float = Field(5.0, gt=0)
    stale_after_s: float = Field(15.0, gt=0)

    @model_validator(mode="after")
    def _stale_after_beats(self) -> EngineModel:
        if self.stale_after_s < 2 * self.heartbeat_s:
            raise ValueError(
                f"stale_after_s ({self.stale_after_s:g}) must be at least twice "
                f"heartbeat_s ({self.heartbeat_s:g}): one late heart-beat must not "
                "make a live engine look dead"
            )
        return self


_SINK_SCHEMES = {"nats": ("nats", "tls"), "redis": ("redis", "rediss", "unix")}


class SinkModel(_Strict):
    """One entry of `events.sinks` (docs/how-to/events.md)."""

    kind: Literal["nats", "redis"]
    url: str
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")  # None: the kind
    stream: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$")  # nats only
    maxlen: int | None = Field(None, ge=1)  # redis only
    timeout_s: float = Field(5.0, gt=0, le=60)

    @model_validator(mode="after")
    def _fits_kind(self) -> SinkModel:
        parts = urlsplit(self.url)
        schemes = _SINK_SCHEMES[self.kind]
        if parts.scheme not in schemes or not (parts.hostname or parts.path):
            raise ValueError(
                f"a {self.kind} sink's url must start with "
                f"{' or '.join(s + '://' for s in schemes)}, got {self.url!r}"
            )
        if self.kind != "nats" and self.stream is not None:
            raise ValueError(
                "stream is for a nats sink (a redis sink writes one stream key per subject)"
            )
        if self.kind != "redis" and self.maxlen is not None:
            raise ValueError("maxlen is for a redis sink (a JetStream stream sets its own limits)")
        return self


class EventsModel(_Strict):
    sinks: list[SinkModel] = []
    max_backlog: int = Field(100_000, ge=1)
    batch: int = Field(500, ge=1, le=10_000)
    poll_s: float = Field(0.5, gt=0, le=60)
    max_backoff_s: float = Field(30.0, gt=0, le=600)

    @model_validator(mode="after")
    def _unique_names(self) -> EventsModel:
        seen: set[str] = set()
        for sink in self.sinks:
            name = sink.name or sink.kind
            if name in seen:
                raise ValueError(
                    f"two sinks are named {name!r}: give each its own name "
                    "(a sink's name keys its cursor)"
                )
            seen.add(name)
        return self


class KeepModel(_Strict):
    keep_days: float = Field(30.0, gt=0)
    keep_jobs: int = Field(10_000, ge=0)


class RetentionModel(_Strict):
    """`retention` (docs/how-to/retention.md)."""

    keep_days: float = Field(30.0, gt=0)
    keep_jobs: int = Field(10_000, ge=0)
    roles: dict[str, KeepModel] = {}
    interval_s: float = Field(3600.0, ge=0)
    batch: int = Field(200, ge=1, le=5_000)
    archive_dir: str | None = None


class ConfigModel(_Strict):
    engine: EngineModel = EngineModel()
    core: CoreModel = field(default_factory=CoreModel)
    store: StoreModel = StoreModel()
    scheduler: SchedulerModel = SchedulerModel()
    default_role: str = "default"
    default_environment: str = "local"
    roles: dict[str, RoleModel] = {}
    environments: dict[str, EnvModel] = {}
    workers: dict[str, WorkerModel] = {}
    providers: dict[str, ProviderModel] = {}
    tenants: dict[str, TenantModel] = {}
    breakers: BreakersModel = BreakersModel()
    watchdog: WatchdogModel = WatchdogModel()
    escalation: EscalationModel = EscalationModel()
    guardrails: str | None = None  # a YAML file of rules, merged over the shipped defaults
    oversight: OversightModel = OversightModel()
    approval_ttl_s: float = Field(3600.0, gt=0)  # a pending approval expires into a denial
    output: OutputModel = OutputModel()
    secrets: SecretsModel = SecretsModel()
    audit: AuditModel = AuditModel()
    events: EventsModel = EventsModel()
    retention: RetentionModel = RetentionModel()
    api: ApiModel = ApiModel()
    knowledge: KnowledgeModel = KnowledgeModel()


def parse(text: str, source: str) -> ConfigModel:
    """Parse and validate YAML text, or ConfigError naming the key and the reason."""
    deep = yaml_too_deep(text)
    if deep:
        raise ConfigError(f"{source}: {deep}")
    try:
        raw = yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{source}:{at}: malformed YAML: {problem}") from err
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys")
    found = config_check.kind_problems(raw, AGENT_ADAPTERS)
    try:
        model = ConfigModel.model_validate(raw)
    except ValidationError as err:
        errors = err.errors()
        known = {
            loc: keys
            for e in errors
            if e["type"] == "extra_forbidden"
            for loc in [tuple(e["loc"][:-1])]
            if (keys := _keys_at(loc)) is not None
        }
        found = config_check.problems(errors, known) + found
        # what resolving would find too, in each role and environment that does validate
        found += [p for p in _section_problems(raw, source) if p not in found]
    if found:
        raise ConfigProblems(source, found)
    return model


def check(text: str, source: str) -> list[str]:
    """Every problem of a configuration file's text as `where: what` ([] when it loads): what
    `corral config check` lists. Beyond what loading refuses, it names the default role or
    environment when it is none of the ones declared (loading would quietly add an empty one:
    most often a misspelling)."""
    found: list[str] = []
    try:
        model = parse(text, source)
        resolve(model, source)
        group_id(model.engine.socket_group)
    except ConfigProblems as err:
        found = list(err.problems)
    except ConfigError as err:
        found = [str(err).removeprefix(f"{source}: ").removeprefix(f"{source}:")]
    except ValueError as err:
        found = [f"engine.socket_group: {err}"]
    try:
        raw = yaml.load(text, Loader=_YAML_LOADER) if not yaml_too_deep(text) else None
    except yaml.YAMLError:
        raw = None
    if isinstance(raw, dict):
        found += config_check.reference_problems(raw)
    return found


def _keys_at(loc: tuple[int | str, ...]) -> set[str] | None:
    """The keys the configuration allows at a location (None when it is no fixed mapping)."""
    model: Any = ConfigModel
    expect_name = False  # the next part names an entry of a `dict[str, Model]`
    for part in loc:
        if expect_name:
            expect_name = False
            continue
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        model, expect_name = _model_of(field.annotation)
        if model is None:
            return None
    return None if expect_name else set(model.model_fields)


def _model_of(annotation: Any) -> tuple[Any, bool]:
    """(the model a field holds, whether through a `dict[str, Model]`), or (None, False)."""
    args = [a for a in get_args(annotation) if a is not type(None)] or [annotation]
    if get_origin(annotation) is dict:
        inner, _ = _model_of(args[-1])
        return inner, inner is not None
    for arg in args:
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg, False
    return None, False


_MCP_NAME = re.compile(r"[A-Za-z0-9_-]+")


def load_mcp_servers(path: Path) -> dict[str, dict[str, Any]]:
    """The servers of an MCP config file in Claude Code's form (`{"mcpServers": {NAME: {command,
    args, env} | {type: http|sse, url, headers}}}`), checked; ValueError says what is wrong."""
    try:
        raw = json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from None
    except ValueError as err:
        raise ValueError(f"{path} is not JSON: {err}") from None
    servers = raw.get("mcpServers") if isinstance(raw, dict) else None
    if not isinstance(servers, dict):
        raise ValueError(f"{path}: expected an object with `mcpServers`")
    return {
        name: _mcp_server(f"{path}: mcpServers.{name}", name, server)
        for name, server in servers.items()
    }


def _mcp_server(where: str, name: str, server: Any) -> dict[str, Any]:
    if not _MCP_NAME.fullmatch(name):
        raise ValueError(f"{where}: a server name is letters, digits, `_` and `-`")
    if not isinstance(server, dict):
        raise ValueError(f"{where}: expected an object")
    kind = server.get("type", "stdio")
    if kind not in ("stdio", "http", "sse"):
        raise ValueError(f"{where}.type: one of stdio, http, sse")
    key = "command" if kind == "stdio" else "url"
    if not isinstance(server.get(key), str) or not server[key]:
        raise ValueError(f"{where}.{key}: a {kind} server needs a {key}")
    args = server.get("args", [])
    if not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
        raise ValueError(f"{where}.args: a list of strings")
    for table in ("env", "headers"):
        value = server.get(table, {})
        if not (isinstance(value, dict) and all(isinstance(v, str) for v in value.values())):
            raise ValueError(f"{where}.{table}: a mapping of strings")
    return {**server, "type": kind}


def _role(name: str, m: RoleModel, source: str) -> RoleSpec:
    r = m.retry
    mcp_servers: dict[str, dict[str, Any]] = {}
    if m.mcp_config is not None:
        try:
            mcp_servers = load_mcp_servers(Path(_relative(m.mcp_config, source) or ""))
        except ValueError as err:
            raise _Problem(f"roles.{name}.mcp_config: {err}") from None
    return RoleSpec(
        name=name,
        worker=m.worker,
        concurrency=m.concurrency,
        tools=tuple(m.tools),
        system_prompt=m.system_prompt,
        description=m.description,
        fallback_workers=tuple(m.fallback_workers),
        rate=_rate(m.rate),
        fallback_models=tuple(m.fallback_models),
        workspace_policy=WorkspacePolicy(m.workspace_policy),
        max_recursion_depth=m.max_recursion_depth,
        max_output_bytes=m.max_output_bytes,
        retry_budget=RetryBudget(**m.retry_budget.model_dump()),
        detached=m.detached,
        secret_env=tuple(m.secret_env),
        anomaly=AnomalySpec(factor=m.anomaly.factor, stop=m.anomaly.stop),
        on_deadlock=m.on_deadlock,
        knowledge=m.knowledge,
        limits=Limits(**m.limits.model_dump()),
        model=m.model,
        max_turns=m.max_turns,
        mcp_servers=mcp_servers,
        cost_estimate_usd=m.cost_estimate_usd,
        requires_approval=m.requires_approval,
        retry=RetryPolicy(
            base_s=r.base_s,
            cap_s=r.cap_s,
            retry_exit_codes=None if r.exit_codes == "nonzero" else frozenset(r.exit_codes),
            never_exit_codes=frozenset(r.never_exit_codes),
            retry_signals=r.signals,
            retry_timeouts=r.timeouts,
            retry_lost=r.lost,
        ),
    )


def resolve(model: ConfigModel, source: str) -> Settings:
    """The settings of a validated model, or ConfigError listing every problem left (tool
    scopes, budgets, MCP files, ray addresses, the guardrails file), not only the first."""
    found: list[str] = []
    roles: dict[str, RoleSpec] = {}
    for name, m in model.roles.items():
        role, problems = _checked_role(name, m, source)
        found += problems
        if role is not None:
            roles[name] = role
    found += [p for name, m in model.environments.items() for p in _env_problems(name, m)]
    guardrails_file = _relative(model.guardrails, source)
    found += _guardrails_problems(guardrails_file)
    found += _knowledge_problems(model)
    if found:
        raise ConfigProblems(source, found)
    roles.setdefault(model.default_role, RoleSpec(name=model.default_role))
    envs = {
        name: EnvSpec(
            name=name,
            kind=m.kind,
            address=m.address,
            max_inflight=m.max_inflight,
            max_queued=m.max_queued,
            throttle=(
                ThrottleSpec(
                    threshold=m.throttle.threshold,
                    release=m.throttle.release,
                    window_s=m.throttle.window_s,
                    horizon_s=m.throttle.horizon_s,
                )
                if m.throttle is not None
                else None
            ),
            resources={
                k: float(v)
                for k, v in (
                    ("num_cpus", m.num_cpus),
                    ("num_gpus", m.num_gpus),
                    ("memory", m.memory),
                )
                if v is not None
            },
            runtime_env=dict(m.runtime_env or {}),
            secret_env=tuple(m.secret_env),
            auth_token_file=_relative(m.auth.token_file, source) if m.auth else None,
            auth_token_env=m.auth.token_env if m.auth else None,
            health_interval_s=m.health_interval_s,
        )
        for name, m in model.environments.items()
    }
    envs.setdefault(model.default_environment, EnvSpec(name=model.default_environment))
    settings = Settings(
        roles=roles,
        environments=envs,
        scheduler=SchedulerSpec(
            aging_s=model.scheduler.aging_s,
            poll_interval_s=model.scheduler.poll_interval_s,
            max_queued=model.scheduler.max_queued,
            backpressure_retry_after_s=(model.scheduler.backpressure_retry_after_s),
            world_watch=model.scheduler.world_watch,
        ),
        default_role=model.default_role,
        default_env=model.default_environment,
        guardrails_file=guardrails_file,
        approval_ttl_s=model.approval_ttl_s,
        output=OutputSpec(max_bytes=model.output.max_bytes, tail_bytes=model.output.tail_bytes),
        oversight=OversightSpec(
            incident_threshold=model.oversight.incident_threshold,
            window_s=model.oversight.window_s,
            min_severity=model.oversight.min_severity,
        ),
        events=_events(model.events),
        retention=_retention(model.retention, source),
        knowledge=KnowledgeSpec(**model.knowledge.model_dump()),
        **_mechanism(model),
    )
    return settings


def _checked_role(name: str, m: RoleModel, source: str) -> tuple[RoleSpec | None, list[str]]:
    """A role's spec, and what is wrong with it beyond its fields' types."""
    try:
        role = _role(name, m, source)
    except _Problem as err:
        return None, [str(err)]
    from corral.policy.scopes import Scope  # the scope grammar: only a file's roles need it

    try:
        Scope.parse(role.tools)
    except ValueError as err:
        return role, [f"roles.{name}.tools: {err}"]
    excess = role.retry_budget.excess(role.limits)
    if excess is not None:  # its default limits refused by its own budget: every job denied
        return role, [f"roles.{name}.limits.{excess[0]}: {excess[1]}"]
    return role, []


def _env_problems(name: str, m: EnvModel) -> list[str]:
    problems = []
    if m.kind == "ray" and not m.address:
        problems.append(f"environments.{name}.address: a ray environment needs the cluster address")
    if m.runtime_env and m.kind != "ray":
        problems.append(f"environments.{name}.runtime_env: only a ray environment has one")
    if m.auth is not None and m.kind != "ray":
        problems.append(f"environments.{name}.auth: only a ray environment has one")
    return problems


def _knowledge_problems(model: ConfigModel) -> list[str]:
    """An agent extractor names a configured role, which is not one that gets learnings: its
    runs are never extracted themselves (runtime/flywheel.py)."""
    kind, _, name = model.knowledge.extractor.partition(":")
    if kind != "agent":
        return []
    role = model.roles.get(name)
    if role is None:
        return [f"knowledge.extractor: no role {name!r} (roles: {', '.join(sorted(model.roles))})"]
    if role.knowledge != "off":
        return [f"knowledge.extractor: role {name!r} is the extractor: its knowledge must be off"]
    return []


def _guardrails_problems(path: str | None) -> list[str]:
    """A rules file that does not load is a configuration problem."""
    if path is None:
        return []
    from corral.policy.guardrails import load_rules

    try:
        load_rules(Path(path))
    except (OSError, ValueError) as err:
        return [f"guardrails: {err}"]
    return []


def _section_problems(raw: dict[str, Any], source: str) -> list[str]:
    """When the file as a whole does not validate, the checks that need validated values, run
    on each role and environment that does: so one list holds every problem."""
    found: list[str] = []
    for name, entry in _entries(raw, "roles"):
        try:
            found += _checked_role(name, RoleModel.model_validate(entry), source)[1]
        except ValidationError:
            continue  # its own problems are listed already
    for name, entry in _entries(raw, "environments"):
        try:
            found += _env_problems(name, EnvModel.model_validate(entry))
        except ValidationError:
            continue
    guardrails = raw.get("guardrails")
    if isinstance(guardrails, str):
        found += _guardrails_problems(_relative(guardrails, source))
    return found


def _entries(raw: dict[str, Any], section: str) -> list[tuple[str, Any]]:
    entries = raw.get(section)
    return [(str(k), v) for k, v in entries.items()] if isinstance(entries, dict) else []


def _relative(path: str | None, source: str) -> str | None:
    """A path in the configuration file, relative to that file."""
    if path is None:
        return None
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else Path(source).parent / p)


class _Mechanism(TypedDict):
    workers: dict[str, WorkerSpec]
    providers: dict[str, ProviderSpec]
    tenants: dict[str, TenantSpec]
    breakers: BreakerSpec
    watchdog: WatchdogSpec
    escalation: EscalationSpec


def _rate(m: RateModel | None) -> RateSpec | None:
    return None if m is None else RateSpec(per_s=m.per_s, burst=m.burst)


def _breakers(b: BreakersModel) -> BreakerSpec:
    return BreakerSpec(
        window_s=b.window_s,
        min_calls=b.min_calls,
        failure_rate=b.failure_rate,
        consecutive_failures=b.consecutive_failures,
        open_s=b.open_s,
    )


def _events(m: EventsModel) -> EventsSpec:
    sinks = tuple(
        SinkSpec(
            name=s.name or s.kind,
            kind=s.kind,
            url=s.url,
            stream=s.stream or "CORRAL",
            maxlen=s.maxlen,
            timeout_s=s.timeout_s,
        )
        for s in m.sinks
    )
    return EventsSpec(
        sinks=sinks,
        max_backlog=m.max_backlog,
        batch=m.batch,
        poll_s=m.poll_s,
        max_backoff_s=m.max_backoff_s,
    )


def _retention(m: RetentionModel, source: str) -> RetentionSpec:
    return RetentionSpec(
        default=KeepSpec(keep_days=m.keep_days, keep_jobs=m.keep_jobs),
        roles={
            name: KeepSpec(keep_days=r.keep_days, keep_jobs=r.keep_jobs)
            for name, r in m.roles.items()
        },
        interval_s=m.interval_s,
        batch=m.batch,
        archive_dir=_relative(m.archive_dir, source),
    )


def _gateway(m: GatewayModel) -> GatewaySpec:
    return GatewaySpec(
        upstream=m.upstream,
        key_env=m.key_env,
        provider=m.provider,
        breakers=_breakers(m.breakers) if m.breakers else None,
    )


def _mechanism(model: ConfigModel) -> _Mechanism:
    """The core's mechanism settings: budgets, breakers, watchdog, escalation."""
    from corral.core.watchdog import GAUGES

    w, b, e = model.watchdog, model.breakers, model.escalation
    gauges = {
        name: Thresholds(**t.model_dump()) for name in GAUGES if (t := getattr(w, name)) is not None
    }
    return _Mechanism(
        workers={
            n: WorkerSpec(
                name=n,
                adapter=m.adapter,
                max_inflight=m.max_inflight,
                rate=_rate(m.rate),
                binary=m.binary,
                version=m.version,
                model=m.model,
                env=dict(m.env),
                pass_env=tuple(m.pass_env),
                args=tuple(m.args),
                config=dict(m.config),
                hook_timeout_s=m.hook_timeout_s,
                summary_grace_s=m.summary_grace_s,
                gateway=_gateway(m.gateway) if m.gateway else None,
            )
            for n, m in model.workers.items()
        },
        providers={n: ProviderSpec(name=n, rate=_rate(m.rate)) for n, m in model.providers.items()},
        tenants={
            n: TenantSpec(
                name=n,
                max_inflight=m.max_inflight,
                max_parallel_runs=m.max_parallel_runs,
                cost_allowance_usd=m.cost_allowance_usd,
                period=CostPeriod(m.period),
            )
            for n, m in model.tenants.items()
        },
        breakers=BreakerSpec(
            window_s=b.window_s,
            min_calls=b.min_calls,
            failure_rate=b.failure_rate,
            consecutive_failures=b.consecutive_failures,
            open_s=b.open_s,
        ),
        watchdog=WatchdogSpec(
            gauges=gauges,
            window_s=w.window_s,
            min_samples=w.min_samples,
            sample_s=w.sample_s,
            stall_s=w.stall_s,
            recover_s=w.recover_s,
            shed_min_priority=w.shed_min_priority,
            throttle_factor=w.throttle_factor,
        ),
        escalation=EscalationSpec(
            crash_loop_per_min=e.crash_loop_per_min,
            superseded_max=e.superseded_max,
            superseded_window_s=e.superseded_window_s,
            ghost_max=e.ghost_max,
            ghost_window_s=e.ghost_window_s,
            safe_stop=e.safe_stop,
            safe_stop_queued=e.safe_stop_queued,
        ),
    )


def file_settings(text: str, path: Path | None) -> FileSettings:
    """What a file's text resolves to (`path` None: the built-in defaults), or ConfigError."""
    if path is None:
        model, source = ConfigModel(), "(defaults)"
    else:
        model, source = parse(text, str(path)), str(path)
    guardrails = _relative(model.guardrails, source)
    mcp = [_relative(m.mcp_config, source) for m in model.roles.values()]
    a, api = model.audit, model.api
    return FileSettings(
        settings=resolve(model, source),
        store_url=model.store.url,
        sqlite_synchronous=model.store.sqlite_synchronous,
        sqlite_busy_timeout_ms=model.store.sqlite_busy_timeout_ms,
        secrets_key_file=_relative(model.secrets.key_file, source),
        core=CoreSection(**model.core.model_dump()),
        audit=AuditSection(
            key_file=_relative(a.key_file, source),
            checkpoint_every_records=a.checkpoint_every_records,
            checkpoint_every_s=a.checkpoint_every_s,
        ),
        engine=EngineSection(**model.engine.model_dump()),
        api=ApiSection(
            rate_limit=ApiRate(**api.rate_limit.model_dump()), epic_repos=tuple(api.epic_repos)
        ),
        reads=tuple(p for p in (guardrails, *mcp) if p is not None),
    )
