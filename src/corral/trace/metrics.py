"""Prometheus metrics, read from the store and the engine's core at scrape time.

Nothing is counted in the engine's memory: a scrape asks the store for its aggregates
(`MetricsReads.fleet_figures`, GROUP BY queries) and the governance records, and the engine
serving the data directory for its core's live state (breakers, the watchdog). So every engine
sharing a PostgreSQL store reports the same fleet figures, and a restart loses nothing. Labels
are bounded (roles, environments, worker kinds, tenants, reason codes, configured breakers and
budgets), never a job id. docs/how-to/observability.md lists every metric.

`exposition(...)` is the text format: `corral metrics` prints it and the HTTP API serves it at
`GET /metrics` (api/mechanism.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from corral.core.ports import METRIC_BOUNDS as BOUNDS
from corral.core.ports import (
    BudgetStatus,
    ChainHead,
    Distribution,
    EventCursor,
    FleetFigures,
    MetricsReads,
    Tally,
)
from corral.domain.governance import Approval, ApprovalState, BudgetCeiling, KillSwitch, ScopeKind
from corral.domain.knowledge import ArmStats
from corral.domain.states import TERMINAL, JobState
from corral.policy import prerun
from corral.trace.events import SOURCES

WAITING = (JobState.QUEUED, JobState.RETRY_WAIT)
BREAKER_STATES = ("CLOSED", "HALF_OPEN", "OPEN")
# The watchdog's gauges (core/watchdog.py) under their own names, in base units: (gauge in the
# core's snapshot, metric name, factor to the metric's unit, help).
WATCHDOG_GAUGES: tuple[tuple[str, str, float, str], ...] = (
    (
        "worker_inflight_count",
        "corral_worker_inflight",
        1.0,
        "Live permits (watchdog gauge worker_inflight_count).",
    ),
    (
        "worker_queue_lag_ms",
        "corral_worker_queue_lag_seconds",
        0.001,
        "Longest wait of a job asking for a permit lately (watchdog gauge worker_queue_lag_ms).",
    ),
    (
        "worker_timeout_rate",
        "corral_worker_timeout_ratio",
        1.0,
        "Share of recent results that timed out (watchdog gauge worker_timeout_rate).",
    ),
    (
        "worker_cancel_latency_ms",
        "corral_worker_cancel_latency_seconds",
        0.001,
        "Longest stop request → result lately (watchdog gauge worker_cancel_latency_ms).",
    ),
    (
        "workspace_lock_wait_ms",
        "corral_workspace_lock_wait_seconds",
        0.001,
        "Longest workspace lock wait lately (watchdog gauge workspace_lock_wait_ms).",
    ),
    (
        "stalled_attempts",
        "corral_stalled_attempts",
        1.0,
        "Live attempts with no activity for the stall time (watchdog gauge stalled_attempts).",
    ),
)
# The provider behind a worker kind's model calls (an OpenCode model names its own: provider/…).
PROVIDERS = {
    "claude-code": "anthropic",
    "claude": "anthropic",
    "codex": "openai",
    "command": "none",
}


def provider_of(worker: str, model: str | None = None) -> str:
    """The model provider of an attempt: the prefix of a `provider/model` name, else the
    worker kind's provider (the worker kind itself when none is known)."""
    if model and "/" in model:
        return model.split("/", 1)[0]
    return PROVIDERS.get(worker, worker)


class MetricsSource(MetricsReads, Protocol):
    """What a scrape reads of the store: the aggregates and a few governance records."""

    async def kill_switches(self, *, active_at: float | None = None) -> list[KillSwitch]: ...

    async def approvals(
        self, *, job_id: str | None = None, state: ApprovalState | None = None
    ) -> list[Approval]: ...

    async def budgets(self) -> list[BudgetCeiling]: ...

    async def budget_status(
        self, scope: ScopeKind, target: str, period_start: float
    ) -> BudgetStatus: ...

    async def event_cursors(self) -> list[EventCursor]: ...

    async def outbox_tip(self, source: str) -> int: ...

    async def archived_heads(self) -> dict[str, ChainHead]: ...

    async def knowledge_stats(
        self, *, tenant: str | None = None, role: str | None = None
    ) -> list[ArmStats]: ...

    async def learning_counts(
        self, *, tenant: str | None = None, role: str | None = None
    ) -> dict[tuple[str, str], int]: ...


@dataclass(frozen=True, slots=True)
class SinkFigures:
    """One event sink's outbox: committed rows it has not published yet, and rows its cursor
    jumped over when the backlog passed `events.max_backlog` (ever)."""

    sink: str
    backlog: int
    skipped: int


Snapshot = Callable[[], Mapping[str, Any]]
Clusters = Callable[[], Sequence[Mapping[str, Any]]]  # each Ray environment's health, asked now


@dataclass(frozen=True, slots=True, kw_only=True)
class Scrape:
    """Everything one scrape read, at once: what `CorralCollector` turns into metrics."""

    figures: FleetFigures
    kill_switches: Sequence[KillSwitch] = ()
    approvals_pending: int = 0
    budgets: Sequence[BudgetStatus] = ()
    core: Mapping[str, Any] | None = None  # the engine's snapshot; None: no engine answered
    sinks: Sequence[SinkFigures] = ()
    clusters: Sequence[Mapping[str, Any]] = ()  # the Ray environments' health
    knowledge: Sequence[ArmStats] = ()  # the flywheel's A/B arms, per role
    learnings: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (role, status)
    bounds: Sequence[float] = BOUNDS
    at: float = field(default_factory=time.time)


async def sink_figures(
    store: MetricsSource, sinks: Sequence[str] | None = None
) -> tuple[SinkFigures, ...]:
    """Each sink's backlog and skipped rows, from its cursors and the outbox tables' tips.
    `sinks`: the configured ones (a sink with no cursor yet has published nothing); None: every
    sink that has cursors in the store."""
    cursors = await store.event_cursors()
    names = sorted({c.sink for c in cursors} if sinks is None else set(sinks))
    if not names:
        return ()
    sources = sorted({*SOURCES, *(c.source for c in cursors)})  # what a sink publishes
    tips = {source: await store.outbox_tip(source) for source in sources}
    archived = await store.archived_heads()  # rows retention took are no one's backlog
    out = []
    for name in names:
        mine = {c.source: c for c in cursors if c.sink == name}
        backlog = sum(
            max(
                0,
                tip
                - max(
                    mine[source].last_id if source in mine else 0,
                    archived[source].seq if source in archived else 0,
                ),
            )
            for source, tip in tips.items()
        )
        out.append(SinkFigures(name, backlog, sum(c.skipped for c in mine.values())))
    return tuple(out)


async def read(
    store: MetricsSource,
    snapshot: Snapshot | None = None,
    *,
    now: float | None = None,
    sinks: Sequence[str] | None = None,
    clusters: Clusters | None = None,
) -> Scrape:
    """Read a scrape's figures from the store and (off the event loop) the engine's core."""
    at = time.time() if now is None else now
    statuses = [
        await store.budget_status(c.scope, c.target, prerun.period_start(c.period, at))
        for c in await store.budgets()
    ]
    core = await anyio.to_thread.run_sync(_safe, snapshot) if snapshot is not None else None
    health = await anyio.to_thread.run_sync(clusters) if clusters is not None else ()
    return Scrape(
        figures=await store.fleet_figures(BOUNDS),
        kill_switches=await store.kill_switches(active_at=at),
        approvals_pending=len(await store.approvals(state=ApprovalState.PENDING)),
        budgets=statuses,
        core=core,
        sinks=await sink_figures(store, sinks),
        clusters=health,
        knowledge=await store.knowledge_stats(),
        learnings=await store.learning_counts(),
        at=at,
    )


def _safe(snapshot: Snapshot) -> Mapping[str, Any] | None:
    """The engine's snapshot, or None when no engine answers (the store's figures still do)."""
    try:
        return snapshot()
    except Exception:
        return None


class CorralCollector(Collector):
    """A custom collector over one scrape's figures (prometheus_client, not multiprocess mode):
    registered in a fresh registry per scrape, so every figure is as the store has it now."""

    def __init__(self, scrape: Scrape) -> None:
        self.scrape = scrape

    def collect(self) -> Iterator[Metric]:
        f = self.scrape.figures
        yield from _jobs(f.jobs, f.dlq, f.removed)
        yield from _attempts(self.scrape.figures, self.scrape.bounds)
        yield from _usage(self.scrape.figures)
        yield from _governance(self.scrape)
        yield from _events(self.scrape.sinks)
        yield from _core(self.scrape.core)
        yield from _clusters(self.scrape.clusters)
        yield from _knowledge(self.scrape.knowledge, self.scrape.learnings)


def _knowledge(
    arms: Sequence[ArmStats], learnings: Mapping[tuple[str, str], int]
) -> Iterator[Metric]:
    """The knowledge flywheel: learnings by role and status, and the finished runs of each
    role's arms (given learnings or not), their successes and tool calls: whether it pays."""
    stored = GaugeMetricFamily(
        "corral_knowledge_learnings", "Learnings stored.", labels=["role", "status"]
    )
    for (role, status), n in sorted(learnings.items()):
        stored.add_metric([role, status], n)
    yield stored
    runs = CounterMetricFamily(
        "corral_knowledge_runs",
        "Finished agent runs of roles with knowledge on or ab, by arm (with or without "
        "injected learnings).",
        labels=["role", "arm"],
    )
    succeeded = CounterMetricFamily(
        "corral_knowledge_runs_succeeded",
        "Of those, the runs that succeeded.",
        labels=["role", "arm"],
    )
    calls = CounterMetricFamily(
        "corral_knowledge_tool_calls", "Tool calls of those runs.", labels=["role", "arm"]
    )
    ratio = GaugeMetricFamily(
        "corral_knowledge_success_ratio",
        "Of those runs, the share that succeeded (an arm with no run has none).",
        labels=["role", "arm"],
    )
    uplift = GaugeMetricFamily(
        "corral_knowledge_success_uplift",
        "The success ratio of the runs given learnings minus that of the runs without (a role "
        "with both arms): whether injecting learnings pays.",
        labels=["role"],
    )
    rates: dict[str, dict[str, float]] = {}
    for a in arms:
        runs.add_metric([a.role, a.arm.value], a.runs)
        succeeded.add_metric([a.role, a.arm.value], a.succeeded)
        calls.add_metric([a.role, a.arm.value], a.tool_calls)
        if (rate := a.success_rate) is not None:
            ratio.add_metric([a.role, a.arm.value], rate)
            rates.setdefault(a.role, {})[a.arm.value] = rate
    for role, r in sorted(rates.items()):
        if "with" in r and "without" in r:
            uplift.add_metric([role], r["with"] - r["without"])
    yield runs
    yield succeeded
    yield calls
    yield ratio
    yield uplift


def _clusters(clusters: Sequence[Mapping[str, Any]]) -> Iterator[Metric]:
    if not clusters:  # no Ray environment configured: no Ray families
        return
    up = GaugeMetricFamily(
        "corral_ray_up", "1 when the Ray environment's cluster answered, else 0.", labels=["env"]
    )
    nodes = GaugeMetricFamily(
        "corral_ray_nodes", "The Ray cluster's nodes by state.", labels=["env", "state"]
    )
    cpus = GaugeMetricFamily(
        "corral_ray_cpus", "The Ray cluster's CPUs: total and used.", labels=["env", "kind"]
    )
    gpus = GaugeMetricFamily(
        "corral_ray_gpus", "The Ray cluster's GPUs: total and used.", labels=["env", "kind"]
    )
    jobs = GaugeMetricFamily(
        "corral_ray_jobs",
        "The Ray jobs the cluster knows, by status (all of them, Corral's or not).",
        labels=["env", "status"],
    )
    for c in clusters:
        env = str(c.get("env"))
        up.add_metric([env], 1.0 if c.get("reachable") else 0.0)
        if not c.get("reachable"):
            continue
        nodes.add_metric([env, "alive"], float(c.get("nodes_alive") or 0))
        nodes.add_metric([env, "dead"], float(c.get("nodes_dead") or 0))
        for kind in ("total", "used"):
            cpus.add_metric([env, kind], float(c.get(f"cpus_{kind}") or 0))
            gpus.add_metric([env, kind], float(c.get(f"gpus_{kind}") or 0))
        for status, n in sorted((c.get("jobs") or {}).items()):
            jobs.add_metric([env, str(status).lower()], float(n))
    yield from (up, nodes, cpus, gpus, jobs)


def _jobs(
    jobs: Sequence[Tally], open_dlq: Sequence[Tally], removed: Sequence[Tally] = ()
) -> Iterator[Metric]:
    queued = GaugeMetricFamily(
        "corral_queue_depth",
        "Jobs waiting to run (queued or in retry backoff).",
        labels=["role", "environment", "priority", "state"],
    )
    finished = CounterMetricFamily(
        "corral_jobs_finished",
        "Jobs that reached a terminal state, by outcome.",
        labels=["role", "outcome"],
    )
    dlq = GaugeMetricFamily(
        "corral_dlq_size", "Dead-lettered jobs not yet requeued or purged.", labels=["role"]
    )
    by_state = GaugeMetricFamily(
        "corral_jobs", "Jobs in the store, by state.", labels=["role", "state"]
    )
    sums: dict[str, dict[tuple[str, ...], float]] = {
        "queued": {},
        "finished": {},
        "dlq": {},
        "state": {},
    }
    for (role, env, priority, state), n in jobs:
        st = JobState(state)
        _add(sums["state"], (role, st.value.lower()), n)
        if st in WAITING:
            _add(sums["queued"], (role, env, priority, st.value.lower()), n)
        if st in TERMINAL:
            _add(sums["finished"], (role, st.value.lower()), n)
    for (role, _env, _priority, state), n in removed:  # retention took them: still finished
        _add(sums["finished"], (role, state.lower()), n)
    for t in open_dlq:
        _add(sums["dlq"], t.labels, t.value)
    for family, key in (
        (queued, "queued"),
        (finished, "finished"),
        (dlq, "dlq"),
        (by_state, "state"),
    ):
        for labels, value in sorted(sums[key].items()):
            family.add_metric(list(labels), value)
        yield family


def _add(into: dict[tuple[str, ...], float], key: tuple[str, ...], n: float) -> None:
    into[key] = into.get(key, 0.0) + n


def _attempts(f: FleetFigures, bounds: Sequence[float]) -> Iterator[Metric]:
    inflight = GaugeMetricFamily(
        "corral_inflight_attempts",
        "Attempts starting or running.",
        labels=["role", "environment", "worker"],
    )
    for t in f.inflight:
        inflight.add_metric(list(t.labels), t.value)
    yield inflight
    attempts = CounterMetricFamily("corral_attempts", "Attempts started.", labels=["role"])
    retries = CounterMetricFamily(
        "corral_retries", "Attempts after a job's first (retries).", labels=["role"]
    )
    for family, tallies in ((attempts, f.attempts), (retries, f.retries)):
        for t in tallies:
            family.add_metric(list(t.labels), t.value)
        yield family
    yield _histogram(
        "corral_attempt_duration_seconds", "Run time of ended attempts.", f.attempt_seconds, bounds
    )
    yield _histogram(
        "corral_submit_to_running_seconds",
        "Submit → running latency of each job's first attempt.",
        f.start_seconds,
        bounds,
    )
    calls = CounterMetricFamily(
        "corral_tool_calls",
        "Governed tool calls, by decision and reason code.",
        labels=["decision", "reason"],
    )
    for t in f.tool_calls:
        calls.add_metric(list(t.labels), t.value)
    yield calls


def _histogram(
    name: str, doc: str, dists: Sequence[Distribution], bounds: Sequence[float]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=["role"])
    for d in dists:
        buckets = [(_le(b), float(c)) for b, c in zip(bounds, d.cumulative, strict=True)]
        family.add_metric(list(d.labels), [*buckets, ("+Inf", float(d.observed))], d.total)
    return family


def _le(bound: float) -> str:
    return repr(float(bound))


def _usage(f: FleetFigures) -> Iterator[Metric]:
    tokens = CounterMetricFamily(
        "corral_tokens",
        "Model tokens used, by direction (in, out).",
        labels=["role", "tenant", "provider", "direction"],
    )
    cost = CounterMetricFamily(
        "corral_cost_usd", "Model cost in USD.", labels=["role", "tenant", "provider"]
    )
    tin: dict[tuple[str, ...], float] = {}
    tout: dict[tuple[str, ...], float] = {}
    usd: dict[tuple[str, ...], float] = {}
    for names, i, o, c in f.usage:
        role, tenant, worker = names
        key: tuple[str, ...] = (role, tenant, provider_of(worker))
        _add(tin, key, i)
        _add(tout, key, o)
        _add(usd, key, c)
    for key in sorted(tin):
        tokens.add_metric([*key, "in"], tin[key])
        tokens.add_metric([*key, "out"], tout[key])
        cost.add_metric(list(key), usd[key])
    yield tokens
    yield cost


def _governance(s: Scrape) -> Iterator[Metric]:
    switches = GaugeMetricFamily(
        "corral_kill_switches_active", "Kill switches in force.", labels=["scope"]
    )
    per_scope: dict[tuple[str, ...], float] = {(k.value,): 0.0 for k in ScopeKind}
    for k in s.kill_switches:
        _add(per_scope, (k.scope.value,), 1)
    for scope, n in sorted(per_scope.items()):
        switches.add_metric(list(scope), n)
    yield switches
    yield GaugeMetricFamily(
        "corral_approvals_pending",
        "Runs waiting for a human's approval.",
        value=s.approvals_pending,
    )
    spent = GaugeMetricFamily(
        "corral_budget_spent_usd",
        "Spend in the budget's current period.",
        labels=["scope", "target"],
    )
    reserved = GaugeMetricFamily(
        "corral_budget_reserved_usd",
        "Reservations of running attempts not yet settled.",
        labels=["scope", "target"],
    )
    ceiling = GaugeMetricFamily(
        "corral_budget_ceiling_usd", "The budget's ceiling per period.", labels=["scope", "target"]
    )
    for b in s.budgets:
        target = [b.scope.value, b.target]
        spent.add_metric(target, b.spent)
        reserved.add_metric(target, b.reserved)
        if b.ceiling is not None:
            ceiling.add_metric(target, b.ceiling.ceiling_usd)
    yield from (spent, reserved, ceiling)


def _events(sinks: Sequence[SinkFigures]) -> Iterator[Metric]:
    backlog = GaugeMetricFamily(
        "corral_events_backlog",
        "Committed records an event sink has not published yet (every outbox table).",
        labels=["sink"],
    )
    skipped = CounterMetricFamily(
        "corral_events_skipped",
        "Records an event sink's cursor jumped over when its backlog passed events.max_backlog.",
        labels=["sink"],
    )
    for s in sinks:
        backlog.add_metric([s.sink], float(s.backlog))
        skipped.add_metric([s.sink], float(s.skipped))
    yield backlog
    yield skipped


def _core(core: Mapping[str, Any] | None) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "corral_engine_up",
        "1 when an engine answered the scrape with its core's state (breakers, watchdog), else 0.",
        value=0.0 if core is None else 1.0,
    )
    breakers = GaugeMetricFamily(
        "corral_breaker_state",
        "1 for each breaker's current state.",
        labels=["breaker", "scope", "state"],
    )
    for b in (core or {}).get("breakers") or ():
        for state in BREAKER_STATES:
            breakers.add_metric(
                [str(b.get("name")), str(b.get("scope") or ""), state.lower()],
                1.0 if b.get("state") == state else 0.0,
            )
    yield breakers
    watchdog: Mapping[str, Any] = (core or {}).get("watchdog") or {}
    stage = GaugeMetricFamily(
        "corral_watchdog_stage",
        "The watchdog's defense stage: 0 normal, 1 shed, 2 throttle, 3 open, 4 escalate.",
    )
    if "stage" in watchdog:
        stage.add_metric([], float(watchdog["stage"]))
    yield stage
    yield from _watchdog_gauges(watchdog)


def _watchdog_gauges(watchdog: Mapping[str, Any]) -> Iterator[Metric]:
    overall: Mapping[str, Any] = watchdog.get("gauges") or {}
    by_worker: Mapping[str, Mapping[str, Any]] = watchdog.get("by_worker") or {}
    for gauge, name, factor, doc in WATCHDOG_GAUGES:
        family = GaugeMetricFamily(
            name, doc + ' worker="all": every worker kind.', labels=["worker"]
        )
        for worker, values in [("all", overall), *sorted(by_worker.items())]:
            if isinstance(values.get(gauge), int | float):
                family.add_metric([worker], float(values[gauge]) * factor)
        yield family


async def exposition(
    store: MetricsSource,
    snapshot: Snapshot | None = None,
    *,
    sinks: Sequence[str] | None = None,
    clusters: Clusters | None = None,
) -> bytes:
    """The Prometheus text exposition of the store's and the core's figures, read now
    (`sinks`: the configured event sinks, see `sink_figures`; `clusters`: the Ray
    environments' health)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CorralCollector(await read(store, snapshot, sinks=sinks, clusters=clusters)))
    return generate_latest(registry)
