"""Summaries for agents and dashboards that ask rather than poll: a job's trace in a few figures,
each environment's caps against what runs and waits there, and the depth of the queue. Every
figure about jobs is counted for the whole fleet (caps are shared) and for the caller's tenant;
no job of another tenant is named. The MCP server's tools (corral/mcp/) answer with these."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from corral.config import Config
from corral.core.ports import TOOL_CALL_STAGES, JobGovernance, JobQuery, JobRecords, JobStore
from corral.domain.models import Job
from corral.domain.states import JobState
from corral.services import intents, queries, tenancy

WAITING = (JobState.QUEUED, JobState.RETRY_WAIT)  # jobs the queue holds
SCAN_CAP = tenancy.SCAN_CAP  # waiting jobs read at most per state
DENIALS_SHOWN = 20  # the latest denials a trace summary lists


@dataclass(frozen=True, slots=True)
class ToolTally:
    tool: str
    calls: int
    denied: int


@dataclass(frozen=True, slots=True)
class Denial:
    attempt: int | None
    tool: str
    stage: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class TraceSummary:
    """An agent job's trace in figures: its tool calls (per tool, how many denied), the policy
    decisions by verdict, tokens and cost over every attempt, and the latest denials."""

    job: Job
    attempts: int
    tool_calls: int
    denied: int
    tokens_in: int
    tokens_out: int
    cost_usd: float | None
    verdicts: dict[str, int]
    tools: list[ToolTally]
    denials: list[Denial]


async def trace_summary(store: JobRecords, job: Job) -> TraceSummary:
    """The summary of `job`'s trace: the attempts that wrote theirs, and the decisions taken so
    far (those of a running attempt included)."""
    events = await store.agent_events(job.id)
    evaluations = await store.policy_evaluations(job.id, limit=queries.STATS_CAP)
    calls: Counter[str] = Counter()
    denied_by_tool: Counter[str] = Counter()
    for e in events:
        for call in e.tool_calls:
            calls[call.tool] += 1
            denied_by_tool[call.tool] += call.denied
    traced = {a.attempt for a in events}
    for d in evaluations:  # a running attempt has no trace yet: its decisions count instead
        if d.stage in TOOL_CALL_STAGES and d.attempt not in traced:
            calls[d.subject] += 1
            denied_by_tool[d.subject] += d.verdict == "deny"
    costs = [e.cost_usd for e in events if e.cost_usd is not None]
    denials = [
        Denial(e.attempt, e.subject, e.stage, e.reason, e.message)
        for e in evaluations
        if e.verdict == "deny"
    ]
    return TraceSummary(
        job=job,
        attempts=len(await store.attempts(job.id)),
        tool_calls=sum(calls.values()),
        denied=sum(denied_by_tool.values()),
        tokens_in=sum(e.tokens_in for e in events),
        tokens_out=sum(e.tokens_out for e in events),
        cost_usd=round(sum(costs), 6) if costs else None,
        verdicts=dict(sorted(Counter(e.verdict for e in evaluations).items())),
        tools=[ToolTally(t, n, denied_by_tool[t]) for t, n in sorted(calls.items())],
        denials=denials[-DENIALS_SHOWN:],
    )


@dataclass(frozen=True, slots=True)
class EnvironmentState:
    """One environment: its caps, and the attempts in flight and jobs waiting there (all
    tenants', and the caller's tenant's)."""

    name: str
    kind: str
    max_inflight: int
    max_queued: int | None
    in_flight: int
    queued: int
    tenant_in_flight: int
    tenant_queued: int


@dataclass(frozen=True, slots=True)
class FleetState:
    environments: list[EnvironmentState]
    max_queued: int  # the bound on waiting jobs over every environment
    queued: int
    in_flight: int
    capped: bool  # the waiting jobs were counted up to SCAN_CAP per state only


async def _waiting(store: JobStore) -> tuple[list[Job], bool]:
    found: list[Job] = []
    capped = False
    for state in WAITING:
        jobs = await store.list_jobs(JobQuery(state=state, limit=SCAN_CAP))
        capped = capped or len(jobs) >= SCAN_CAP
        found += jobs
    return found, capped


async def fleet_state(store: JobStore, config: Config, tenant: str) -> FleetState:
    """Every configured environment (and any a job still names) with its caps and load."""
    running = [job for job, _ in await store.inflight()]
    waiting, capped = await _waiting(store)
    envs = config.settings.environments
    names = sorted(set(envs) | {j.env_name for j in running + waiting})
    out = []
    for name in names:
        spec = envs.get(name)
        here_running = [j for j in running if j.env_name == name]
        here_waiting = [j for j in waiting if j.env_name == name]
        out.append(
            EnvironmentState(
                name=name,
                kind=spec.kind if spec else "unconfigured",
                max_inflight=spec.max_inflight if spec else 0,
                max_queued=spec.max_queued if spec else None,
                in_flight=len(here_running),
                queued=len(here_waiting),
                tenant_in_flight=sum(j.tenant == tenant for j in here_running),
                tenant_queued=sum(j.tenant == tenant for j in here_waiting),
            )
        )
    return FleetState(
        environments=out,
        max_queued=config.settings.scheduler.max_queued,
        queued=len(waiting),
        in_flight=len(running),
        capped=capped,
    )


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """How deep the queue is (over every environment, by priority and by environment), how many
    of it are the tenant's, and — for one of the tenant's waiting jobs — where it stands."""

    queued: int
    max_queued: int
    by_priority: dict[str, int]
    by_environment: dict[str, int]
    tenant_queued: int
    capped: bool
    placement: intents.Placement | None = None


async def queue_depth(
    store: JobGovernance, config: Config, tenant: str, job: Job | None = None
) -> QueueDepth:
    """The queue now; with `job` (the tenant's, checked by the caller), its place in it when it
    waits."""
    waiting, capped = await _waiting(store)
    place = (
        await intents.placement(store, config, job)
        if job is not None and job.state in WAITING
        else None
    )
    return QueueDepth(
        queued=len(waiting),
        max_queued=config.settings.scheduler.max_queued,
        by_priority={str(p): n for p, n in sorted(Counter(j.priority for j in waiting).items())},
        by_environment=dict(sorted(Counter(j.env_name for j in waiting).items())),
        tenant_queued=sum(j.tenant == tenant for j in waiting),
        capped=capped,
        placement=place,
    )
